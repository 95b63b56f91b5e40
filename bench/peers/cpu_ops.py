"""Peer timings for bench/src/bin/cpu_ops.rs: numpy and torch f32 matmul 1024^3, torch conv2d
(batch 32, 64 -> 64 channels, 56x56, 3x3, padding 1). Prints one JSON object on stdout.

Usage: python3 bench/peers/cpu_ops.py REPS MODE
  MODE "wall": wall-clock time with every thread the libraries use by default;
  MODE "cpu1": CPU time of the calling thread with one thread (torch.set_num_threads(1); the
  caller sets OPENBLAS_NUM_THREADS=1), a figure that other processes on the machine disturb less.
Needs numpy, torch and threadpoolctl (the latter only to report numpy's BLAS kernel).
"""

import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

try:
    from threadpoolctl import threadpool_info
except ImportError:  # the BLAS kernel is then unknown, not fatal
    def threadpool_info():
        return [{"user_api": "blas", "internal_api": "unknown (threadpoolctl missing)"}]

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
MODE = sys.argv[2] if len(sys.argv) > 2 else "wall"
CLOCK = time.thread_time if MODE == "cpu1" else time.perf_counter
if MODE == "cpu1":
    torch.set_num_threads(1)


def median_seconds(f, reps, warmup=3):
    for _ in range(warmup):
        f()
    times = []
    for _ in range(reps):
        t0 = CLOCK()
        f()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def main():
    n = 1024
    flops = 2.0 * n**3
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    numpy_s = median_seconds(lambda: a @ b, REPS * 2)

    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    with torch.no_grad():
        torch_mm_s = median_seconds(lambda: ta @ tb, REPS * 2)
        x = torch.randn(32, 64, 56, 56)
        w = torch.randn(64, 64, 3, 3)
        conv_s = median_seconds(lambda: F.conv2d(x, w, padding=1), REPS, warmup=2)

    blas = [
        {k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]
    print(json.dumps({
        "numpy_version": np.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "torch_threads": torch.get_num_threads(),
        "numpy_blas": blas,
        "numpy_matmul_gflops": flops / numpy_s / 1e9,
        "torch_matmul_gflops": flops / torch_mm_s / 1e9,
        "torch_conv2d_ms": conv_s * 1e3,
    }))


if __name__ == "__main__":
    main()
