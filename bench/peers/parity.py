"""PyTorch's losses for the steps `oxtrain bench MODEL --parity DIR` ran, from the same initial
weights and the same batch, and the comparison: so a speed figure is known to come from the
same arithmetic, not from skipped work.

Usage: python3 bench/peers/parity.py DIR [--device cuda] [--rtol R] [--out FILE]

DIR holds what oxtrain wrote: init.safetensors (its state dict, PyTorch's names), batch.safetensors
and oxtrain.json (model, precision, channels_last, the losses). The models and optimizers are
bench/peers/train.py's: torchvision's ResNet with SGD (lr 0.1, momentum 0.9), and the plain
GPT-2 with AdamW (lr 1e-4, fused on CUDA), whose nn.Linear weights are the transposes of
Hugging Face's Conv1D weights that oxtrain writes. Each step: zero_grad, forward (bf16 autocast
for bf16), cross-entropy, backward, step. Prints one JSON line (and writes it to --out): both
loss lists and the largest relative difference. The bar: for f32, --rtol; for bf16 or tf32,
twice the largest relative difference between PyTorch's own run at that precision and its f32
run (what the reduced precision alone moves the losses by), at least --rtol.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import Gpt2  # noqa: E402  (the peer's own GPT-2, beside this file)


def gpt2_state(hf, layers):
    """Hugging Face GPT-2 names and Conv1D layouts to train.py's Gpt2."""
    out = {"wte.weight": hf["transformer.wte.weight"], "wpe.weight": hf["transformer.wpe.weight"]}
    for p in ("weight", "bias"):
        out[f"ln_f.{p}"] = hf[f"transformer.ln_f.{p}"]
    pairs = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "c_attn", "attn.c_proj": "attn_proj",
             "mlp.c_fc": "c_fc", "mlp.c_proj": "mlp_proj"}
    for i in range(layers):
        for theirs, ours in pairs.items():
            w = hf[f"transformer.h.{i}.{theirs}.weight"]
            out[f"h.{i}.{ours}.weight"] = w.t().contiguous() if w.dim() == 2 else w
            out[f"h.{i}.{ours}.bias"] = hf[f"transformer.h.{i}.{theirs}.bias"]
    return out


def build(name, init, batch, dev, channels_last):
    """train.py's model and optimizer for `name`, from the state dict `init`, and its loss."""
    if name.startswith("resnet"):
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=1000)
        missing, unexpected = model.load_state_dict(init, strict=False)
        assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
        model = model.to(dev)
        x, y = batch["x"].to(dev), batch["y"].to(dev)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return opt, lambda: F.cross_entropy(model(x), y)
    if name.startswith("gpt2"):
        d, layers, heads = (256, 4, 4) if name == "gpt2" else (768, 12, 12)
        model = Gpt2(d=d, layers=layers, heads=heads)
        model.load_state_dict(gpt2_state(init, layers), strict=True)
        model = model.to(dev)
        ids = batch["ids"].to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")

        def loss_of():
            logits = model(ids)
            v = logits.shape[-1]
            return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))

        return opt, loss_of
    raise SystemExit(f"parity: no PyTorch model for {name}")


def run(ours, init, batch, dev, precision):
    """PyTorch's losses for the same steps at `precision` (f32, tf32 or bf16)."""
    torch.backends.cudnn.allow_tf32 = precision != "f32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    opt, loss_of = build(ours["model"], init, batch, dev, ours["channels_last"])
    losses = []
    for _ in range(len(ours["losses"])):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_of()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_rel(a, b):
    rel = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]
    worst = max(rel)
    return worst, rel.index(worst) + 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="the bar when no reference run is made (f32 on both sides)")
    p.add_argument("--out")
    a = p.parse_args()
    ours = json.load(open(os.path.join(a.dir, "oxtrain.json")))
    init = load_file(os.path.join(a.dir, "init.safetensors"))
    batch = load_file(os.path.join(a.dir, "batch.safetensors"))
    dev = torch.device(a.device)
    precision = ours["precision"]
    torch_losses = run(ours, init, batch, dev, precision)
    worst, step = max_rel(ours["losses"], torch_losses)
    result = {
        "name": ours["name"],
        "precision": precision,
        "steps": len(torch_losses),
        "oxtrain_losses": ours["losses"],
        "torch_losses": torch_losses,
        "max_rel_diff": worst,
        "worst_step": step,
        "torch_version": torch.__version__,
    }
    if precision == "f32":
        result["bar"] = a.rtol
    else:
        # What "bf16 tolerance" means here: how far PyTorch's own reduced-precision run drifts
        # from its f32 run over the same steps. oxtrain's distance from PyTorch must stay
        # within twice that.
        reference = run(ours, init, batch, dev, "f32")
        spread, _ = max_rel(torch_losses, reference)
        result["torch_f32_losses"] = reference
        result["torch_reduced_vs_f32"] = spread
        result["bar"] = max(2 * spread, a.rtol)
    result["within"] = worst <= result["bar"]
    line = json.dumps(result)
    print(line)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
