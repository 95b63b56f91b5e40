"""One GPU's training step of ResNet-50 and GPT-2 124M in PyTorch, timed in parts, with the time
at which each parameter's gradient is ready: the compute side of the scaling model
(bench/src/bin/scaling_model.rs), which places DDP's bucket all-reduces on that timeline.

Per model: forward, backward and optimizer time (CUDA events, median over the timed steps after
warm-up), and for every parameter in registration order its element count and when its gradient
became final, from the start of backward (a CUDA event recorded by a post-accumulate-grad hook,
so it is the GPU's time, not the host's). bf16 autocast, fp32 weights and gradients, SGD with
momentum (ResNet-50) and AdamW (GPT-2), as in train-h200.json's cases.

Usage: python3 step_profile.py OUT.json [--steps N]
"""

import argparse
import json
import statistics
import subprocess
import time

import torch


def resnet50():
    import torchvision

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss = lambda: torch.nn.functional.cross_entropy(model(x), y)
    return "resnet50_bf16_b256", model, opt, loss


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    cfg._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(cfg).cuda()
    ids = torch.randint(0, 50257, (16, 1024), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    loss = lambda: model(input_ids=ids, labels=ids).loss
    return "gpt2_124m_bf16_b16_t1024", model, opt, loss


def profile(make, steps):
    name, model, opt, loss_fn = make()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    ready = {}

    def hook_for(i):
        def hook(_p):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ready[i] = ev

        return hook

    for i, (_, p) in enumerate(params):
        p.register_post_accumulate_grad_hook(hook_for(i))
    rows = []
    for step in range(steps + 3):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ready.clear()
        opt.zero_grad(set_to_none=True)
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        ev[1].record()
        loss.backward()
        ev[2].record()
        opt.step()
        ev[3].record()
        torch.cuda.synchronize()
        if step >= 3:
            rows.append(
                {
                    "forward": ev[0].elapsed_time(ev[1]),
                    "backward": ev[1].elapsed_time(ev[2]),
                    "optimizer": ev[2].elapsed_time(ev[3]),
                    "ready": [ev[1].elapsed_time(ready[i]) for i in range(len(params))],
                }
            )
    med = lambda key: statistics.median(r[key] for r in rows)
    ready_ms = [statistics.median(r["ready"][i] for r in rows) for i in range(len(params))]
    return {
        "name": name,
        "forward_ms": med("forward"),
        "backward_ms": med("backward"),
        "optimizer_ms": med("optimizer"),
        "steps": steps,
        "params": [
            {"name": n, "numel": p.numel(), "ready_ms": r} for (n, p), r in zip(params, ready_ms)
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    models = [profile(resnet50, args.steps), profile(gpt2, args.steps)]
    try:
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = torch.cuda.get_device_name()
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": gpu,
        "notes": f"torch {torch.__version__}, eager, bf16 autocast, CUDA events; median of {args.steps} steps "
        f"after 3 warm-up; ready_ms: when each parameter's gradient was final, from the start of backward "
        f"(post-accumulate-grad hooks recording events); one run, {time.time() - t0:.0f} s",
        "models": models,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for m in models:
        print(m["name"], "forward", round(m["forward_ms"], 2), "backward", round(m["backward_ms"], 2),
              "optimizer", round(m["optimizer_ms"], 2), "ms")


if __name__ == "__main__":
    main()
