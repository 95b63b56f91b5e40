"""Fixtures for the optimizers, gradient clipping and the gradient scaler, with PyTorch as the
reference: 10 steps of SGD and AdamW in several configurations (one and two parameter groups)
on fixed parameters and gradient sequences, clip_grad_norm_ for several norms, and
torch.amp.GradScaler's skip/backoff/growth sequence. Needs torch.

    python3 nn/src/optim/fixtures.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}
STEPS = 10
p0_init = torch.randn(4, 3)
p1_init = torch.randn(3)
# Gradient sizes change from step to step so AMSGrad's running max matters.
scales = torch.tensor([1.0, 0.1, 3.0, 0.5, 0.05, 2.0, 1.0, 0.2, 4.0, 0.3])
g0 = torch.randn(STEPS, 4, 3) * scales.view(-1, 1, 1)
g1 = torch.randn(STEPS, 3) * scales.view(-1, 1)


def run(name, make, kind, defaults, group1=None):
    """Steps `make(param_groups, **defaults)`; group1 overrides put p1 in a second group."""
    p0 = p0_init.clone().requires_grad_(True)
    p1 = p1_init.clone().requires_grad_(True)
    groups = [{"params": [p0, p1]}] if group1 is None else [{"params": [p0]}, {"params": [p1], **group1}]
    opt = make(groups, **defaults)
    out0, out1 = [], []
    for s in range(STEPS):
        p0.grad, p1.grad = g0[s].clone(), g1[s].clone()
        opt.step()
        out0.append(p0.detach().clone())
        out1.append(p1.detach().clone())
    case = {"kind": kind, "p0": tensor(p0_init), "p1": tensor(p1_init), "g0": tensor(g0), "g1": tensor(g1),
            "p0_out": tensor(torch.stack(out0)), "p1_out": tensor(torch.stack(out1)),
            "two_groups": int(group1 is not None)}
    # Every hyper-parameter is written, torch's default where the case does not set it.
    full = {"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0, "maximize": False,
            "amsgrad": False, "betas": (0.9, 0.999), "eps": 1e-8,
            "group1_lr": defaults["lr"], "group1_weight_decay": defaults.get("weight_decay", 0.0)}
    for k, v in full.items():
        if k.startswith("group1_"):
            case[k] = float(v)
        elif k == "betas":
            case["beta1"], case["beta2"] = v
        else:
            case[k] = float(v)
    for k, v in defaults.items():
        if k == "betas":
            case["beta1"], case["beta2"] = v
        else:
            case[k] = float(v)
    for k, v in (group1 or {}).items():
        case[f"group1_{k}"] = float(v)
    cases[name] = case


SGD = torch.optim.SGD
run("sgd_plain", SGD, 0, {"lr": 0.1})
run("sgd_momentum", SGD, 0, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1})
run("sgd_nesterov", SGD, 0, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-2})
run("sgd_weight_decay", SGD, 0, {"lr": 0.1, "weight_decay": 0.05})
run("sgd_maximize", SGD, 0, {"lr": 0.1, "momentum": 0.5, "maximize": True})
run("sgd_two_groups", SGD, 0, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}, {"lr": 0.01, "weight_decay": 0.0})
AW = torch.optim.AdamW
run("adamw_default", AW, 1, {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2})
run("adamw_amsgrad", AW, 1, {"lr": 2e-2, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True})
run("adamw_two_groups", AW, 1, {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.05},
    {"lr": 5e-3, "weight_decay": 0.0})

# clip_grad_norm_: total norm and clipped gradients, for several norms, clipping and not.
grads = [torch.randn(5, 4) * 2, torch.randn(7), torch.randn(2, 3, 2) * 0.5]
for name, norm_type, max_norm in [("l2", 2.0, 1.0), ("inf", float("inf"), 0.5), ("l1", 1.0, 3.0),
                                  ("l3", 3.0, 2.0), ("l2_no_clip", 2.0, 100.0)]:
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    case = {"max_norm": max_norm, "norm_type": norm_type if norm_type != float("inf") else -1,
            "total": tensor(total)}
    for i, (g, p) in enumerate(zip(grads, params)):
        case[f"g{i}"] = tensor(g)
        case[f"clipped{i}"] = tensor(p.grad)
    cases[f"clip_{name}"] = case

# GradScaler: growth_interval 3 so growth shows in a short run; gradients with inf/NaN on some
# steps. The loss "scaled" each step is a constant; the unscaled gradient is given per step.
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
p = torch.zeros(4, requires_grad=True)
opt = torch.optim.SGD([p], lr=0.1)
bad = [False, False, True, False, False, False, False, True, True, False, False, False, False, False]
ug = torch.randn(len(bad), 4)
scale_before, scale_after, params, tracker = [], [], [], []
for s, is_bad in enumerate(bad):
    scale = scaler.scale(torch.tensor(1.0)).item()
    g = ug[s] * scale
    if is_bad:
        g[s % 4] = float("inf") if s % 2 else float("nan")
    p.grad = g.clone()
    scaler.step(opt)
    scaler.update()
    scale_before.append(scale)
    scale_after.append(scaler.get_scale())
    params.append(p.detach().clone())
    tracker.append(scaler._growth_tracker.item())
cases["grad_scaler"] = {
    "bad": [int(b) for b in bad], "unscaled_grads": tensor(ug),
    "scale_before": tensor(torch.tensor(scale_before, dtype=torch.float64)),
    "scale_after": tensor(torch.tensor(scale_after, dtype=torch.float64)),
    "growth_tracker": [int(t) for t in tracker],
    "params": tensor(torch.stack(params)),
}

write(__file__, cases)
