"""The step-time peer of bench/src/bin/memory_cpu_zero/step_time.rs: a GPT-2 4x256 training
step (forward, backward, AdamW step) on WORLD gloo ranks, one thread each, with DDP and
AdamW ("ddp") or DDP and ZeroRedundancyOptimizer(AdamW) ("zero"), measured the same way:
each rank's median step after the first, the slowest rank.

Usage: python zero_step_time.py MODE STEPS WORLD   (prints one JSON object)
"""
import json
import os
import queue
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from transformers import GPT2Config, GPT2LMHeadModel


def rank_main(rank, world, mode, steps, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
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
    if rank == 0:
        out.put(max(gathered))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    mode, steps, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, mode, steps, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    # A rank that dies leaves the others waiting in gloo: give up on the group then.
    result = None
    while result is None:
        try:
            result = out.get(timeout=5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                sys.exit(f"a rank exited with {dead[0]}")
    print(json.dumps({"step_seconds": result, "torch": torch.__version__}), flush=True)
    # A rank can hang in destroy_process_group after the result is out (seen about once in
    # ten groups here): it is not waited for long.
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


if __name__ == "__main__":
    main()
