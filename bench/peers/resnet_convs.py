"""Peer timings for bench/src/bin/resnet_convs.rs: PyTorch's CPU convolution forward, input
gradient and weight gradient at every convolution shape of ResNet-50 (batch 8, 128x128 images),
one JSON object on stdout.

Usage: python3 resnet_convs.py THREADS REPS CLOCK
CLOCK is `cpu` (process CPU time, meaningful on a loaded machine at one thread) or `wall`;
BENCH_STAT=min reports the fastest repetition instead of the median.
Shapes come as JSON lines on stdin: {"name", "c", "hw", "o", "k", "stride"}; batch 8, padding
k // 2, as torchvision's ResNet.
"""

import json
import os
import statistics
import sys
import time

import torch


def median_seconds(f, reps, clock):
    for _ in range(2):
        f()
    times = []
    for _ in range(reps):
        t = clock()
        f()
        times.append(clock() - t)
    # BENCH_STAT=min: the fastest repetition, as the Rust side reports it under that setting.
    return min(times) if os.environ.get("BENCH_STAT") == "min" else statistics.median(times)


def main():
    threads, reps, clock = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(threads)
    clock = time.process_time if clock == "cpu" else time.perf_counter
    g = torch.Generator().manual_seed(0)
    out = {}
    for line in sys.stdin:
        s = json.loads(line)
        x = torch.rand(8, s["c"], s["hw"], s["hw"], generator=g) - 0.5
        w = torch.rand(s["o"], s["c"], s["k"], s["k"], generator=g) - 0.5
        conv = dict(stride=[s["stride"]] * 2, padding=[s["k"] // 2] * 2, dilation=[1, 1], groups=1)
        y = torch.nn.functional.conv2d(x, w, None, **conv)
        gy = torch.rand(y.shape, generator=g) - 0.5

        def backward(mask):
            return lambda: torch.ops.aten.convolution_backward(
                gy, x, w, None, conv["stride"], conv["padding"], conv["dilation"], False, [0, 0], 1, mask
            )

        with torch.no_grad():
            out[s["name"]] = {
                "forward": median_seconds(lambda: torch.nn.functional.conv2d(x, w, None, **conv), reps, clock),
                "input_grad": median_seconds(backward([True, False, False]), reps, clock),
                "weight_grad": median_seconds(backward([False, True, False]), reps, clock),
            }
    print(json.dumps({"torch": torch.__version__, "shapes": out}))


if __name__ == "__main__":
    main()
