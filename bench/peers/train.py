"""PyTorch peer of `oxtrain bench`: the same training steps on synthetic data, one JSON line.

Usage: python3 bench/peers/train.py MODEL --threads T [--batch N --image S --seq T --steps S
       --warmup W --device cpu|cuda --precision f32|bf16 --channels-last --compile]
MODEL: resnet18 | resnet50 (torchvision, SGD lr 0.1 momentum 0.9, cross-entropy over 1000
classes), gpt2 (4 layers, 256 wide, 4 heads, vocab 50257, positions 1024, no dropout, tied
embeddings, gelu tanh, causal SDPA as transformers' default attention; AdamW lr 1e-4) or
gpt2-124m (the same written plainly at 12 layers, 768 wide, 12 heads; nanoGPT style).
Each step: zero_grad(set_to_none), forward (under bf16 autocast with --precision bf16), loss,
backward, optimizer step (fused AdamW on CUDA). The figure is the median of --steps steps after
--warmup, each step ended by a device synchronisation; peak memory is the process's peak RSS on
the CPU, torch.cuda.max_memory_allocated on CUDA.
"""

import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab=50257, positions=1024, d=256, layers=4, heads=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied lm_head


def workload(args):
    g = torch.Generator().manual_seed(0)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    if args.model in ("resnet18", "resnet50"):
        import torchvision

        model = getattr(torchvision.models, args.model)(num_classes=1000).to(dev)
        x = torch.randn(args.batch, 3, args.image, args.image, generator=g).to(dev)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        y = torch.randint(0, 1000, (args.batch,), generator=g).to(dev)
        fwd = torch.compile(model) if args.compile else model

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(fwd(x), y)
            loss.backward()
            opt.step()

        cl = "_cl" if args.channels_last else ""
        return step, args.batch, "img/s", f"{args.model}_b{args.batch}_{args.image}{cl}"
    if args.model in ("gpt2", "gpt2-124m"):
        d, layers, heads = (256, 4, 4) if args.model == "gpt2" else (768, 12, 12)
        model = Gpt2(d=d, layers=layers, heads=heads).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        ids = torch.randint(0, 50257, (args.batch, args.seq), generator=g).to(dev)
        fwd = torch.compile(model) if args.compile else model

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast():
                logits = fwd(ids)
                v = logits.shape[-1]
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()

        name = f"gpt2_l{layers}_d{d}_b{args.batch}_t{args.seq}"
        return step, args.batch * args.seq, "tokens/s", name
    raise SystemExit(f"unknown model {args.model}; use resnet18, resnet50, gpt2 or gpt2-124m")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image", type=int, default=128)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, profile one more and print its kernels to stderr")
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step, items, unit, name = workload(args)
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            step()
            sync()
        key = "cuda_time_total" if cuda else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=30), file=sys.stderr)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    s = statistics.median(times)
    print(json.dumps({
        "name": name,
        "unit": unit,
        "peer": items / s,
        "step_seconds": s,
        "step_times": times,
        "peak_memory_bytes": peak,
        "precision": args.precision,
        "compiled": args.compile,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__.split("+")[0],
    }))


if __name__ == "__main__":
    main()
