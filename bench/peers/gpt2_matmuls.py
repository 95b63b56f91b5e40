"""PyTorch's times for bench/src/bin/gpt2_matmuls.rs: the matrix products of one GPT-2 124M
training step (16 x 1024 tokens, bf16), timed the same way (CUDA events around 10 calls,
median of 7 trials after 3 warm-up calls), printed as the same table.

Usage: python3 bench/peers/gpt2_matmuls.py
"""

import statistics

import torch

TOKENS = 16 * 1024
LAYERS = [
    ("c_attn", 768, 2304, 12),
    ("attn.c_proj", 768, 768, 12),
    ("mlp.c_fc", 768, 3072, 12),
    ("mlp.c_proj", 3072, 768, 12),
    ("lm_head", 768, 50257, 1),
    ("lm_head_padded", 768, 50304, 1),
]


def time_gpu(iters, f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / iters)
    return statistics.median(times)


def rand(*dims):
    return (torch.rand(*dims, device="cuda") * 0.2 - 0.1).to(torch.bfloat16)


def main():
    print(f"{'layer':<16} {'pass':<6} {'us':>10} {'TFLOP/s':>9} {'us/step':>10}   (torch {torch.__version__})")
    total = 0.0
    for name, k, n, count in LAYERS:
        x, g = rand(TOKENS, k), rand(TOKENS, n)
        w = rand(n, k).t() if name.startswith("lm_head") else rand(k, n)
        flops = 2.0 * TOKENS * k * n
        for p, f in (("fwd", lambda: x @ w), ("dx", lambda: g @ w.t()), ("dw", lambda: x.t() @ g)):
            s = time_gpu(10, f)
            if not name.endswith("padded"):
                total += s * count
            print(f"{name:<16} {p:<6} {s * 1e6:>10.1f} {flops / s / 1e12:>9.1f} {s * 1e6 * count:>10.1f}")
    print(f"total per step (unpadded head): {total * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
