"""PyTorch peer of `oxtrain bench`: the same training steps on synthetic data, one JSON line.

Usage: python3 bench/peers/train.py MODEL [--batch N --image S --seq T --steps S --warmup W
       --device cpu|cuda --precision f32|tf32|bf16 --compile [--compile-mode M] --plain --channels-last
       --threads T --profile]
MODEL: resnet18 | resnet50 (torchvision, SGD lr 0.1 momentum 0.9, cross-entropy over 1000
classes), gpt2 (4 layers, 256 wide, 4 heads, positions 1024, no dropout, tied embeddings, gelu
tanh, causal SDPA; AdamW lr 1e-4) or gpt2-124m (the same at 12 layers, 768 wide, 12 heads;
nanoGPT style).

By default the peer is what a PyTorch user who wants speed writes:
- cudnn.benchmark on; TF32 for matmuls and cuDNN with --precision tf32, none with f32 (strict);
- ResNet: model and input channels_last;
- optimizers fused (fused=True; foreach where this torch has no fused kernel for the device);
- GPT-2: nanoGPT's vocabulary padded from 50257 to 50304 (embedding and tied head; the ids stay
  below 50257). The loss is taken over the 50257 real columns: position t's target is id t+1
  and the last position's is ignored, so it is the mean over B*(T-1) tokens of HF's shifted loss,
  the arithmetic of oxtrain's GPT-2 loss. The pad columns get no gradient and the pad rows are
  never looked up, so the padding changes no figure, only the head's shape;
- with --compile, torch.compile (default mode) of ONE function that takes the batch and returns
  the loss (forward under autocast and the loss; ResNet: model and cross-entropy).
--plain is the older, weaker peer kept as an extra row: torch's default backends (no
cudnn.benchmark; f32 keeps cuDNN's default TF32), channels_last only with --channels-last,
SGD with torch's default implementation, GPT-2 vocabulary 50257 with the loss and the
logits[:, :-1] slice outside the compiled model.

Each step: zero_grad(set_to_none), forward (under bf16 autocast with --precision bf16), loss,
backward, optimizer step. The figure is the median of --steps steps after --warmup, each step
ended by a device synchronisation. first_step_seconds is the wall time of the process's first
step (ended by a synchronisation; with --compile it includes compiling), and
process_to_first_step_seconds the time from the process's start to the end of that step; peak
memory is the process's peak RSS on the CPU, torch.cuda.max_memory_allocated on CUDA.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

GPT2_VOCAB = 50257
GPT2_PADDED_VOCAB = 50304  # nanoGPT's: the next multiple of 64
_SCRIPT_START = time.perf_counter()


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
    """GPT-2 written plainly; `vocab` rows of the embedding and of the tied head (padded or not)."""

    def __init__(self, vocab=GPT2_VOCAB, positions=1024, d=256, layers=4, heads=4):
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


def gpt2_loss(logits, ids, vocab=GPT2_VOCAB):
    """HF's shifted loss over the first `vocab` columns: position t predicts ids[:, t + 1]; the
    last position's target is ignored. Written with shifted targets rather than sliced logits
    so the logits stay a view (no copy of [B, T-1, V]) in eager mode too."""
    targets = F.pad(ids[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits[..., :vocab].reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)


def process_age_seconds():
    """Seconds since this process started (Linux: /proc, 10 ms resolution); elsewhere since
    this script started running."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _SCRIPT_START


def make_optimizer(cls, params, plain, cuda, **kw):
    """The optimizer and the implementation it runs: fused, else foreach (strong); for --plain,
    fused AdamW on CUDA and torch's default otherwise, as the older peer had."""
    params = list(params)
    if plain:
        fused = cuda and cls is torch.optim.AdamW
        return cls(params, **kw, fused=fused or None), "fused" if fused else "default"
    for impl in ("fused", "foreach"):
        try:
            return cls(params, **kw, **{impl: True}), impl
        except (RuntimeError, ValueError, TypeError):
            continue
    return cls(params, **kw), "for-loop"


def setup_backends(args, cuda):
    """cudnn.benchmark and TF32 as the peer's kind asks; returns the words for its setup."""
    tf32 = args.precision == "tf32"
    if args.plain:
        # torch's defaults (cuDNN TF32 on, matmul TF32 off), matmul TF32 only when asked.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        return {"tf32": ["f32 with TF32 matmul and cuDNN"], "f32": ["f32 (cuDNN TF32 as torch's default)"],
                "bf16": ["bf16 autocast"]}[args.precision] + ["torch default backends"]
    torch.backends.cudnn.benchmark = True
    if args.precision != "bf16":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return {"tf32": ["f32 with TF32 matmul and cuDNN"], "f32": ["strict f32 (TF32 off)"],
            "bf16": ["bf16 autocast"]}[args.precision] + (["cudnn.benchmark"] if cuda else [])


def compile_words(args):
    return f"torch.compile({args.compile_mode or 'default mode'})"


def resnet_workload(args, dev, g, autocast):
    import torchvision

    model = getattr(torchvision.models, args.model)(num_classes=1000).to(dev)
    x = torch.randn(args.batch, 3, args.image, args.image, generator=g).to(dev)
    y = torch.randint(0, 1000, (args.batch,), generator=g).to(dev)
    channels_last = args.channels_last or not args.plain
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt, impl = make_optimizer(torch.optim.SGD, model.parameters(), args.plain, dev.type == "cuda",
                               lr=0.1, momentum=0.9)
    if args.plain:
        fwd = torch.compile(model, mode=args.compile_mode) if args.compile else model

        def loss_of(x, y):
            with autocast():
                return F.cross_entropy(fwd(x), y)
        compiled = "torch.compile of the model" if args.compile else None
    else:
        def loss_of(x, y):
            with autocast():
                return F.cross_entropy(model(x), y)
        if args.compile:
            loss_of = torch.compile(loss_of, mode=args.compile_mode)
        compiled = f"{compile_words(args)} of model and loss in one function" if args.compile else None

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of(x, y).backward()
        opt.step()

    cl = "_cl" if channels_last else ""
    setup = (["channels_last model and input"] if channels_last else []) + [f"SGD {impl}"]
    return step, args.batch, "img/s", f"{args.model}_b{args.batch}_{args.image}{cl}", setup, compiled


def gpt2_workload(args, dev, g, autocast):
    d, layers, heads = (256, 4, 4) if args.model == "gpt2" else (768, 12, 12)
    vocab = GPT2_VOCAB if args.plain else GPT2_PADDED_VOCAB
    model = Gpt2(vocab=vocab, d=d, layers=layers, heads=heads).to(dev)
    opt, impl = make_optimizer(torch.optim.AdamW, model.parameters(), args.plain, dev.type == "cuda", lr=1e-4)
    ids = torch.randint(0, GPT2_VOCAB, (args.batch, args.seq), generator=g).to(dev)
    if args.plain:
        fwd = torch.compile(model, mode=args.compile_mode) if args.compile else model

        def loss_of(ids):
            with autocast():
                logits = fwd(ids)
                v = logits.shape[-1]
                return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
        compiled = "torch.compile of the model (loss and slice outside)" if args.compile else None
        setup = [f"vocabulary {vocab}"]
    else:
        def loss_of(ids):
            with autocast():
                return gpt2_loss(model(ids), ids)
        if args.compile:
            loss_of = torch.compile(loss_of, mode=args.compile_mode)
        compiled = f"{compile_words(args)} of one function ids -> loss" if args.compile else None
        setup = [f"vocabulary padded to {vocab}, loss over the {GPT2_VOCAB} real columns"]

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of(ids).backward()
        opt.step()

    name = f"gpt2_l{layers}_d{d}_b{args.batch}_t{args.seq}"
    return step, args.batch * args.seq, "tokens/s", name, setup + ["SDPA", f"AdamW {impl}"], compiled


def workload(args, backends):
    """The step and what describes it: (step, items, unit, name, setup words); `backends` are
    setup_backends' words."""
    g = torch.Generator().manual_seed(0)
    dev = torch.device(args.device)

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    if args.model in ("resnet18", "resnet50"):
        build = resnet_workload
    elif args.model in ("gpt2", "gpt2-124m"):
        build = gpt2_workload
    else:
        raise SystemExit(f"unknown model {args.model}; use resnet18, resnet50, gpt2 or gpt2-124m")
    step, items, unit, name, setup, compiled = build(args, dev, g, autocast)
    version = torch.__version__.split("+")[0]
    head = [f"torch {version}", compiled or "eager", "plain peer" if args.plain else "strong peer"]
    return step, items, unit, name, head + backends + setup


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image", type=int, default=128)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=("f32", "tf32", "bf16"), default="f32")
    p.add_argument("--channels-last", action="store_true", help="ResNet channels_last (always on unless --plain)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode (default: its default mode), e.g. max-autotune-no-cudagraphs")
    p.add_argument("--plain", action="store_true", help="the older, weaker peer (see the module's doc)")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, profile one more and print its kernels to stderr")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    return args


def compile_cache_counters():
    """Inductor's and AOTAutograd's disk-cache hits and misses in this process (whether a
    warmed cache served the compile), empty where this torch keeps no such counters."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    wanted = {"inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss"),
              "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss")}
    return {k: counters[group][k] for group, keys in wanted.items() for k in keys if counters[group][k]}


def timed(step, sync):
    t0 = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - t0


def profile_one(step, sync, cuda):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step()
        sync()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30), file=sys.stderr)


def main():
    args = parse_args()
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step, items, unit, name, setup = workload(args, setup_backends(args, cuda))
    first = timed(step, sync)  # the first step: a warm-up step, or the first timed one
    to_first = process_age_seconds()
    times = [] if args.warmup > 0 else [first]
    for _ in range(max(args.warmup - 1, 0)):
        step()
    sync()
    while len(times) < args.steps:
        times.append(timed(step, sync))
    if args.profile:
        profile_one(step, sync, cuda)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    s = statistics.median(times)
    print(json.dumps({
        "name": name,
        "unit": unit,
        "peer": items / s,
        "step_seconds": s,
        "step_times": times,
        "first_step_seconds": first,
        "process_to_first_step_seconds": to_first,
        "peak_memory_bytes": peak,
        "precision": args.precision,
        "compiled": args.compile,
        **({"compile_cache": compile_cache_counters()} if args.compile else {}),
        "plain": args.plain,
        "setup": ", ".join(setup),
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__.split("+")[0],
    }))


if __name__ == "__main__":
    main()
