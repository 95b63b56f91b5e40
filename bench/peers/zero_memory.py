"""Optimizer-state bytes per rank of PyTorch's ZeroRedundancyOptimizer(AdamW) on GPT-2, the
peer of bench/src/bin/memory_cpu_zero.rs, measured the same way: after one step (state is
made lazily), the bytes of every tensor in the rank's local optimizer state, the largest
over ranks. Ranks are processes over gloo on the CPU.

Usage: python zero_memory.py N_LAYER N_EMBD N_HEAD WORLD   (prints one JSON object)
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import GPT2Config, GPT2LMHeadModel

import gloo_group


def rank_main(rank, world, n_layer, n_embd, n_head):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head)
    model = GPT2LMHeadModel(config)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    ddp(ids, labels=ids).loss.backward()
    opt.step()
    state_bytes = sum(
        t.numel() * t.element_size()
        for state in opt.optim.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    )
    gathered = [None] * world
    dist.all_gather_object(gathered, state_bytes)
    return max(gathered)


def main():
    n_layer, n_embd, n_head, world = (int(a) for a in sys.argv[1:5])
    result = gloo_group.run(rank_main, world, n_layer, n_embd, n_head)
    print(json.dumps({"state_bytes_per_rank": result, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
