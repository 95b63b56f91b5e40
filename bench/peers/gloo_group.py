"""Runs a function on WORLD gloo ranks (spawned processes on this host) and returns what rank 0
put on the queue: the process group of the ZeRO peers (zero_memory.py, zero_step_time.py).

The store's port is a free one. A rank that dies leaves the others waiting in gloo, so the
group is stopped then; a rank that hangs in destroy_process_group after the result is out
(seen about once in ten groups here) is not waited for long.
"""
import os
import queue
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(fn, rank, world, port, out, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = fn(rank, world, *args)
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def run(fn, world, *args):
    """`fn(rank, world, *args)` on every rank, inside a gloo process group; rank 0's result."""
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, out, args)) for r in range(world)]
    for p in procs:
        p.start()
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
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return result
