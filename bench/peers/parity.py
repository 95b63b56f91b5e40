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
loss lists, the largest relative difference, and whether it is within --rtol.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rtol", type=float, default=0.02)
    p.add_argument("--out")
    a = p.parse_args()
    ours = json.load(open(os.path.join(a.dir, "oxtrain.json")))
    init = load_file(os.path.join(a.dir, "init.safetensors"))
    batch = load_file(os.path.join(a.dir, "batch.safetensors"))
    dev = torch.device(a.device)
    bf16 = ours["precision"] == "bf16"
    torch.backends.cudnn.allow_tf32 = ours["precision"] != "f32"
    torch.backends.cuda.matmul.allow_tf32 = ours["precision"] == "tf32"
    model_name = ours["model"]
    if model_name.startswith("resnet"):
        import torchvision

        model = getattr(torchvision.models, model_name)(num_classes=1000)
        missing, unexpected = model.load_state_dict(init, strict=False)
        assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
        model = model.to(dev)
        x, y = batch["x"].to(dev), batch["y"].to(dev)
        if ours["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def loss_of():
            return F.cross_entropy(model(x), y)
    elif model_name.startswith("gpt2"):
        d, layers, heads = (256, 4, 4) if model_name == "gpt2" else (768, 12, 12)
        model = Gpt2(d=d, layers=layers, heads=heads)
        model.load_state_dict(gpt2_state(init, layers), strict=True)
        model = model.to(dev)
        ids = batch["ids"].to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")

        def loss_of():
            logits = model(ids)
            v = logits.shape[-1]
            return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    else:
        raise SystemExit(f"parity: no PyTorch model for {model_name}")

    losses = []
    for _ in range(len(ours["losses"])):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rel = [abs(o - t) / max(abs(t), 1e-12) for o, t in zip(ours["losses"], losses)]
    worst = max(rel)
    result = {
        "name": ours["name"],
        "precision": ours["precision"],
        "steps": len(losses),
        "oxtrain_losses": ours["losses"],
        "torch_losses": losses,
        "max_rel_diff": worst,
        "worst_step": rel.index(worst) + 1,
        "rtol": a.rtol,
        "within": worst <= a.rtol,
        "torch_version": torch.__version__,
    }
    line = json.dumps(result)
    print(line)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
