"""PyTorch peer of bench/src/bin/gpt2_cpu_ops.rs: the heavy ops of the CPU GPT-2 training step
at their real shapes (rows 1024 = batch 8 x 128 tokens, width 256, vocab 50257, MLP 1024), one
line per op with the median wall time and the median CPU time of the process.

Usage: python3 bench/peers/gpt2_cpu_ops.py [--threads N] [--reps R] [--only SUBSTRING]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_time(f, reps, clock):
    f()
    times = []
    for _ in range(reps):
        t = clock()
        f()
        times.append(clock() - t)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", default="")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows, d, vocab, inner = 1024, 256, 50257, 1024
    h, x = torch.randn(rows, d), torch.randn(rows, d)
    w = torch.randn(vocab, d) * 0.02
    g = torch.randn(rows, vocab) * 1e-4
    w_fc, g_fc, a = torch.randn(d, inner), torch.randn(rows, inner), torch.randn(rows, inner)
    targets = torch.randint(0, vocab, (rows,))
    logits = torch.randn(rows, vocab).requires_grad_()

    def cross_entropy():
        logits.grad = None
        F.cross_entropy(logits, targets).backward()

    cases = [
        ("lm_head forward  h @ W^T", lambda: h @ w.t()),
        ("lm_head dx  g @ W", lambda: g @ w),
        ("lm_head dW  (g^T @ h)", lambda: g.t() @ h),
        ("c_fc forward  x @ W", lambda: x @ w_fc),
        ("c_fc dx  g @ W^T", lambda: g_fc @ w_fc.t()),
        ("c_fc dW  x^T @ g", lambda: x.t() @ g_fc),
        ("gelu_tanh forward", lambda: F.gelu(a, approximate="tanh")),
        ("gelu_tanh backward", lambda: torch.ops.aten.gelu_backward(g_fc, a, approximate="tanh")),
        ("cross_entropy forward+backward", cross_entropy),
    ]
    for name, f in cases:
        if args.only not in name:
            continue
        wall = median_time(f, args.reps, time.perf_counter)
        cpu = median_time(f, args.reps, time.process_time)
        print(f"{name:34} wall {wall * 1e3:8.1f} ms   cpu {cpu * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
