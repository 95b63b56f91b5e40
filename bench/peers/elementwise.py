"""Peer timings for bench/src/bin/elementwise.rs: torch's memory-bound ops on one
8x64x64x64 f32 tensor, one thread. Prints one JSON object {op: milliseconds} on stdout.

Usage: python3 bench/peers/elementwise.py REPS
"""

import json
import statistics
import sys
import time

import torch

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
torch.set_num_threads(1)


def median_ms(f, reps=REPS, warmup=3):
    for _ in range(warmup):
        f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    g = torch.Generator().manual_seed(0)
    shape = (8, 64, 64, 64)
    x = torch.rand(shape, generator=g) - 0.5
    y = torch.rand(shape, generator=g) - 0.5
    c = torch.rand((1, 64, 1, 1), generator=g)
    r = torch.rand((1, 1, 1, 64), generator=g)
    w = torch.rand(64, generator=g)
    b = torch.rand(64, generator=g)
    out = {}
    with torch.no_grad():
        out["relu"] = median_ms(lambda: torch.relu(x))
        out["mul_channel"] = median_ms(lambda: x * c)
        out["mul_row"] = median_ms(lambda: x * r)
        out["sum_channel"] = median_ms(lambda: x.sum((0, 2, 3)))
        out["copy"] = median_ms(lambda: x.clone())
        out["add"] = median_ms(lambda: x + y)
        out["relu_backward"] = median_ms(lambda: torch.ops.aten.threshold_backward(y, x, 0.0))
    # Batch norm in training mode, forward and backward through autograd.
    xg = x.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    bg = b.clone().requires_grad_(True)

    def bn_fwd():
        with torch.no_grad():
            torch.nn.functional.batch_norm(x, None, None, w, b, training=True)

    def bn_bwd():
        o = torch.nn.functional.batch_norm(xg, None, None, wg, bg, training=True)
        o.backward(y)

    out["batch_norm_forward"] = median_ms(bn_fwd)
    out["batch_norm_forward_backward"] = median_ms(bn_bwd)
    out["torch_version"] = torch.__version__.split("+")[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
