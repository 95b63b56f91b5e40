"""Peer for bench/src/bin/ddp_cpu.rs: one rank of PyTorch DDP (gloo) training torchvision's
ResNet-18 (1000 classes) on 64x64 synthetic images, batch 16 per rank, SGD momentum, one
thread; with WORLD_SIZE=1 a plain single-process run. Reads torchrun's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as the oxtrain side does, prints one JSON line:
{"rank", "step_s"} (the median step after warm-up).
"""

import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torchvision

BATCH, SIZE, WARMUP = 16, 64, 3


def main():
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    steps = int(os.environ.get("BENCH_STEPS", "10"))
    torch.manual_seed(rank)
    model = torchvision.models.resnet18()
    images = torch.randn(BATCH, 3, SIZE, SIZE)
    labels = torch.tensor([(i * 37 + rank * 11) % 1000 for i in range(BATCH)])
    if world > 1:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(WARMUP + steps):
        t = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(images), labels).backward()
        opt.step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
    print(json.dumps({"rank": rank, "step_s": statistics.median(times), "exposed_s": 0.0}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
