"""The step-time peer of bench/src/bin/memory_cpu_zero/step_time.rs: a GPT-2 4x256 training
step (forward, backward, AdamW step) on WORLD gloo ranks, one thread each, with DDP and
AdamW ("ddp") or DDP and ZeroRedundancyOptimizer(AdamW) ("zero"), measured the same way:
each rank's median step after the first, the slowest rank.

Usage: python zero_step_time.py MODE STEPS WORLD   (prints one JSON object)
"""
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import GPT2Config, GPT2LMHeadModel

import gloo_group


def rank_main(rank, world, mode, steps):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4))
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if mode == "zero":
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, 50257, (2, 128), generator=g)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ddp(ids, labels=ids).loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    rest = sorted(times[1:])
    mid = len(rest) // 2
    median = rest[mid] if len(rest) % 2 else (rest[mid - 1] + rest[mid]) / 2
    gathered = [None] * world
    dist.all_gather_object(gathered, median)
    return max(gathered)


def main():
    mode, steps, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    result = gloo_group.run(rank_main, world, mode, steps)
    print(json.dumps({"step_seconds": result, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
