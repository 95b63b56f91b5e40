"""PyTorch's losses for the steps `oxtrain bench MODEL --parity DIR` ran, from the same initial
weights and the same batch, and the comparison step by step: so a speed figure is known to come
from the same arithmetic, not from skipped work.

Usage: python3 bench/peers/parity.py DIR [--device cuda] [--rtol R] [--floor F] [--no-control] [--out FILE]
       [--results FILE]

DIR holds what oxtrain wrote: init.safetensors (its state dict, PyTorch's names), batch.safetensors
and oxtrain.json (model, precision, channels_last, the losses). The models and optimizers are
bench/peers/train.py's, eager, at the model's real size: torchvision's ResNet with SGD (lr 0.1,
momentum 0.9), and the plain GPT-2 with its real vocabulary of 50257 (no padding) and AdamW
(lr 1e-4, fused on CUDA), whose nn.Linear weights are the transposes of Hugging Face's Conv1D
weights that oxtrain writes. Each step: zero_grad, forward (bf16 autocast for bf16),
cross-entropy (GPT-2: train.py's gpt2_loss, HF's shifted loss), backward, step.

The bar, step by step: for bf16 or tf32, PyTorch runs the steps twice, at that precision and in
strict f32 (TF32 off); at every step i, |oxtrain_i - torch_f32_i| must be at most
2 |torch_reduced_i - torch_f32_i| (what the reduced precision alone moves PyTorch's loss by at
that step), or at most --floor * |torch_f32_i| where that is larger (default 0: the bar alone).
For f32, |oxtrain_i - torch_f32_i| <= --rtol * |torch_f32_i|. Unless --no-control, a third
PyTorch run at the reduced precision through other kernels (ResNet: the other memory layout,
cudnn.benchmark; GPT-2: memory-efficient attention instead of flash) is judged by the same bar:
how many steps an equally good implementation keeps within it. Prints one JSON line (also to
--out) with every step's losses, distance, bar and verdict; --results merges the case's row into
a bench/results-format file (bench/results/parity-h200.json), replacing a row of the same name.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import GPT2_VOCAB, Gpt2, gpt2_loss  # noqa: E402 (the peer's own GPT-2, beside this file)


NOTES = (
    "Loss parity: training steps (each row's name says how many) from the same initial weights and the "
    "same synthetic batch in oxtrain (`oxtrain bench ... --parity DIR` writes weights, batch and losses) "
    "and in PyTorch (bench/peers/parity.py loads them; eager, the models' real sizes: GPT-2's vocabulary "
    "50257, unpadded). The bar is step by step, not the maximum over steps: at every step "
    "|oxtrain bf16 - torch f32| <= 2 |torch bf16 - torch f32| at that step. oxtrain = steps within the "
    "bar, peer = steps, ratio = their fraction (goal 1.0); worst_margin = the largest distance/bar over "
    "the steps; the per-step losses, distances and bars are in each row. control_steps_within: how many "
    "steps a second PyTorch bf16 run through other kernels (ResNet: the other memory layout and "
    "cudnn.benchmark; GPT-2: the memory-efficient attention kernel instead of flash) keeps within the "
    "same bar, i.e. what an equally good bf16 implementation scores; max_rule_within: the older bar "
    "(largest relative distance over all steps within twice PyTorch's largest bf16-vs-f32 one)."
)


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


def build(name, init, batch, dev, channels_last, control=False):
    """train.py's model and optimizer for `name`, from the state dict `init`, and its loss.
    `control`: the same arithmetic through other kernels (ResNet: the other memory layout;
    GPT-2: another attention kernel), an equally good bf16 run to try the bar on."""
    if name.startswith("resnet"):
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=1000)
        missing, unexpected = model.load_state_dict(init, strict=False)
        assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
        model = model.to(dev)
        x, y = batch["x"].to(dev), batch["y"].to(dev)
        if channels_last != control:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return opt, lambda: F.cross_entropy(model(x), y)
    if name.startswith("gpt2"):
        d, layers, heads = (256, 4, 4) if name == "gpt2" else (768, 12, 12)
        model = Gpt2(vocab=GPT2_VOCAB, d=d, layers=layers, heads=heads)  # the real vocabulary
        model.load_state_dict(gpt2_state(init, layers), strict=True)
        model = model.to(dev)
        ids = batch["ids"].to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
        if not control:
            return opt, lambda: gpt2_loss(model(ids), ids)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        other = SDPBackend.EFFICIENT_ATTENTION if dev.type == "cuda" else SDPBackend.MATH

        def loss_of():
            with sdpa_kernel([other]):
                return gpt2_loss(model(ids), ids)
        return opt, loss_of
    raise SystemExit(f"parity: no PyTorch model for {name}")


def run(ours, init, batch, dev, precision, control=False):
    """PyTorch's losses for the same steps at `precision` (f32, tf32 or bf16); `control`: through
    other kernels (build's), with cudnn.benchmark choosing the convolutions."""
    torch.backends.cudnn.allow_tf32 = precision != "f32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = control
    opt, loss_of = build(ours["model"], init, batch, dev, ours["channels_last"], control)
    losses = []
    for _ in range(len(ours["losses"])):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_of()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def per_step(ours, torch_losses, reference, rtol, floor):
    """Every step's distance of oxtrain's loss from PyTorch's f32 loss, its bar and verdict."""
    rows = []
    for o, t, r in zip(ours, torch_losses, reference):
        if t is None:  # f32: no reduced-precision run, the bar is --rtol
            bar = rtol * abs(r)
        else:
            bar = max(2 * abs(t - r), floor * abs(r))
        diff = abs(o - r)
        rows.append({"diff": diff, "bar": bar, "within": diff <= bar})
    return rows


def case_name(ours, steps):
    """parity_<model>_<precision>_b<batch>[_t<seq>]_<steps>steps, the name of the results row."""
    seq = f"_t{ours['seq']}" if ours["model"].startswith("gpt2") else ""
    return f"parity_{ours['model']}_{ours['precision']}_b{ours['batch']}{seq}_{steps}steps"


def max_rule(ours, torch_losses, reference):
    """The older bar, over all steps at once: oxtrain's largest relative distance from PyTorch at
    the same precision within twice PyTorch's largest relative bf16-vs-f32 distance."""
    def worst(a, b):
        return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
    return worst(ours, torch_losses) <= 2 * worst(torch_losses, reference)


def compare(ours, init, batch, dev, rtol, floor, control):
    """The case's result: PyTorch's runs beside oxtrain's losses, step by step; with `control`,
    also how many steps an equally good PyTorch run through other kernels keeps within the bar."""
    precision = ours["precision"]
    torch_losses = run(ours, init, batch, dev, precision)
    reference = torch_losses if precision == "f32" else run(ours, init, batch, dev, "f32")
    reduced = [None] * len(reference) if precision == "f32" else torch_losses
    steps = per_step(ours["losses"], reduced, reference, rtol, floor)
    extra = {}
    if control and precision != "f32":
        other = run(ours, init, batch, dev, precision, control=True)
        checked = per_step(other, reduced, reference, rtol, floor)
        extra = {"control_losses": other, "control_steps_within": sum(s["within"] for s in checked),
                 "control_failed_steps": [i + 1 for i, s in enumerate(checked) if not s["within"]]}
    if precision != "f32":
        extra["max_rule_within"] = max_rule(ours["losses"], torch_losses, reference)
    # distance / bar; a zero bar (PyTorch's two runs agreeing exactly) counts as a tiny one.
    margins = [s["diff"] / max(s["bar"], 1e-12) for s in steps]
    worst = max(range(len(steps)), key=lambda i: margins[i])
    return {
        "name": case_name(ours, len(steps)),
        "oxtrain_name": ours["name"],
        "precision": precision,
        "steps": len(steps),
        "steps_within": sum(s["within"] for s in steps),
        "within": all(s["within"] for s in steps),
        "failed_steps": [i + 1 for i, s in enumerate(steps) if not s["within"]],
        "worst_step": worst + 1,
        "worst_margin": margins[worst],
        "oxtrain_losses": ours["losses"],
        "torch_losses": torch_losses,
        "torch_f32_losses": reference,
        "diff_vs_torch_f32": [s["diff"] for s in steps],
        "bar": [s["bar"] for s in steps],
        "floor": floor if precision != "f32" else None,
        "rtol": rtol if precision == "f32" else None,
        "torch_version": torch.__version__,
        **extra,
    }


def results_row(r):
    """The case as a row of a bench/results file: steps within the bar out of all steps."""
    reduced = "bf16" if r["precision"] == "bf16" else r["precision"]
    bar = (f"|oxtrain - torch f32| <= {r['rtol']} |torch f32|" if r["precision"] == "f32" else
           f"|oxtrain {reduced} - torch f32| <= 2 |torch {reduced} - torch f32|"
           + (f" (or {r['floor']} |torch f32|)" if r["floor"] else ""))
    return {
        "name": r["name"],
        "unit": "steps within the per-step bar",
        "oxtrain": r["steps_within"],
        "peer": r["steps"],
        "peer_name": f"torch {r['torch_version'].split('+')[0]} eager, same weights and batch; per step {bar}",
        "ratio": round(r["steps_within"] / r["steps"], 3),
        "goal": 1.0,
        "within": r["within"],
        "failed_steps": r["failed_steps"],
        "worst_step": r["worst_step"],
        "worst_margin": round(r["worst_margin"], 3),
        **{k: r[k] for k in ("max_rule_within", "control_steps_within", "control_failed_steps") if k in r},
        **{k: r[k] for k in ("oxtrain_losses", "torch_losses", "torch_f32_losses", "diff_vs_torch_f32", "bar",
                             "control_losses") if k in r},
    }


def merge_results(path, row):
    """Adds `row` to the bench/results file at `path` (made if absent), replacing one of its name."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        doc = {"benchmarks": []}
    commit = os.environ.get("COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True).stdout.strip()
    doc.update({
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": doc.get("machine") or os.environ.get("MACHINE", "nvidia-h200 (1x H200)"),
        "notes": NOTES,
    })
    doc["benchmarks"] = [b for b in doc.get("benchmarks", []) if b.get("name") != row["name"]] + [row]
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rtol", type=float, default=1e-4, help="the per-step bar when both sides run f32")
    p.add_argument("--floor", type=float, default=0.0,
                   help="a relative bar under which a step always passes (default 0: the bar alone)")
    p.add_argument("--no-control", action="store_true",
                   help="skip the control run (PyTorch bf16 through other kernels, judged by the same bar)")
    p.add_argument("--out", help="also write the JSON line here")
    p.add_argument("--results", help="merge the case's row into this bench/results-format file")
    a = p.parse_args()
    with open(os.path.join(a.dir, "oxtrain.json")) as f:
        ours = json.load(f)
    init = load_file(os.path.join(a.dir, "init.safetensors"))
    batch = load_file(os.path.join(a.dir, "batch.safetensors"))
    result = compare(ours, init, batch, torch.device(a.device), a.rtol, a.floor, not a.no_control)
    line = json.dumps(result)
    print(line)
    for s, (d, b) in enumerate(zip(result["diff_vs_torch_f32"], result["bar"]), 1):
        print(f"step {s:2}: |oxtrain - torch f32| {d:.3e}  bar {b:.3e}  {'ok' if d <= b else 'FAIL'}", file=sys.stderr)
    print(f"{result['name']}: {result['steps_within']}/{result['steps']} steps within the bar "
          f"({'pass' if result['within'] else 'FAIL'})", file=sys.stderr)
    if "control_steps_within" in result:
        print(f"control (PyTorch {result['precision']} through other kernels): {result['control_steps_within']}/"
              f"{result['steps']} steps within the same bar", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")
    if a.results:
        merge_results(a.results, results_row(result))


if __name__ == "__main__":
    main()
