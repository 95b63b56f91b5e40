"""PyTorch's times for the attention rows of bench/src/bin/step_kernels.rs: GPT-2 124M's fused
attention (B16 H12 T1024 D64, causal, bf16; q, k, v as views of one [B, T, 3, H, D] projection,
the output gradient as a view of [B, T, H, D]), forward and backward of
F.scaled_dot_product_attention with each backend torch has for it here, timed the same way
(CUDA events around 20 calls, median of 7 trials after 3 warm-up calls), printed as the same
table. TFLOP/s count the products causal attention needs (the backward 2.5 times the forward);
ms/step is the time of GPT-2's 12 layers. The backward is torch.autograd.grad of the output
for q, k and v.

Usage: python3 bench/peers/attention.py [--batch 16] [--seq 1024]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args()
    b, t, h, d = args.batch, args.seq, 12, 64
    qkv = (torch.rand(b, t, 3, h, d, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    dout = (torch.rand(b, t, h, d, device="cuda") * 2 - 1).to(torch.bfloat16).transpose(1, 2)
    forward_flop = 2.0 * b * h * t * t * d
    print(f"torch {torch.__version__}: attention B{b} H{h} T{t} D{d} causal bf16")
    print(f"{'kernel':<32} {'us':>10} {'TFLOP/s':>10} {'ms/step':>8}")
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for name, backend in backends:
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                forward = time_gpu(20, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                backward = time_gpu(20, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        except RuntimeError as e:
            print(f"torch {name}: not available here ({str(e).splitlines()[0][:80]})")
            continue
        for pass_, flop, s in (("forward", forward_flop, forward), ("backward", 2.5 * forward_flop, backward)):
            label = f"torch {name} {pass_}"
            print(f"{label:<32} {s * 1e6:>10.1f} {flop / s / 1e12:>10.1f} {s * 12 * 1e3:>8.2f}")


if __name__ == "__main__":
    main()
