"""Fixtures for the losses with PyTorch as the reference: each loss's value and its gradient
with respect to the input, for every reduction, ignore_index, label smoothing, class dims
beyond 2, bf16 logits, and BCE with weight and pos_weight. Needs torch.

    python3 nn/src/loss/fixtures.py
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}
REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}


def backward(x, loss):
    """The input's gradient for a random output gradient (ones-like scale for scalars)."""
    g = torch.rand_like(loss, dtype=torch.float32) + 0.5
    loss.backward(g.to(loss.dtype))
    return g, x.grad


def ce_case(name, x, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    ref = x.detach().float().requires_grad_(True)
    loss = F.cross_entropy(ref, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)
    g, grad = backward(ref, loss)
    cases[name] = {
        "logits": tensor(x.detach()), "target": tensor(target),
        "ignore_index": ignore_index, "label_smoothing": label_smoothing,
        "reduction": REDUCTIONS[reduction],
        "grad_out": tensor(g), "loss": tensor(loss.detach()), "grad": tensor(grad),
    }


x = torch.randn(6, 5) * 3
t = torch.tensor([0, 4, 2, 2, 1, 3])
t_ign = torch.tensor([0, -100, 2, -100, 1, 3])
for red in REDUCTIONS:
    ce_case(f"ce_{red}", x, t, reduction=red)
    ce_case(f"ce_ignore_{red}", x, t_ign, reduction=red)
    ce_case(f"ce_smooth_ignore_{red}", x, t_ign, label_smoothing=0.2, reduction=red)
ce_case("ce_custom_ignore_index", x, t, ignore_index=2, label_smoothing=0.1)
ce_case("ce_all_ignored", x, torch.full((6,), -100), reduction="sum")
x4 = torch.randn(2, 4, 3, 2)
t4 = torch.randint(0, 4, (2, 3, 2))
t4[0, 1, 1] = -100
for red in REDUCTIONS:
    ce_case(f"ce_4d_smooth_{red}", x4, t4, label_smoothing=0.15, reduction=red)
ce_case("ce_1d", torch.randn(7), torch.tensor(3))
ce_case("ce_bf16", (torch.randn(4, 9) * 4).bfloat16(), torch.tensor([8, 0, 3, 3]), label_smoothing=0.05)
# Huge logits: only a log-softmax in a stable form stays finite.
ce_case("ce_extreme", torch.tensor([[1e4, -1e4, 0.0], [-3e4, 3e4, 2e4]]), torch.tensor([1, 2]))


def bce_case(name, x, y, weight=None, pos_weight=None, reduction="mean"):
    ref = x.detach().float().requires_grad_(True)
    loss = F.binary_cross_entropy_with_logits(ref, y, weight=weight, pos_weight=pos_weight, reduction=reduction)
    g, grad = backward(ref, loss)
    c = {"x": tensor(x), "y": tensor(y), "reduction": REDUCTIONS[reduction],
         "grad_out": tensor(g), "loss": tensor(loss.detach()), "grad": tensor(grad)}
    if weight is not None:
        c["weight"] = tensor(weight)
    if pos_weight is not None:
        c["pos_weight"] = tensor(pos_weight)
    cases[name] = c


xb = torch.randn(4, 3) * 5
xb[0, 0] = 0.0
xb[1, 1] = 80.0
xb[2, 2] = -80.0
yb = torch.rand(4, 3).round()
yb[3] = torch.tensor([0.3, 0.7, 0.5])
for red in REDUCTIONS:
    bce_case(f"bce_{red}", xb, yb, reduction=red)
    bce_case(f"bce_pos_weight_{red}", xb, yb, pos_weight=torch.tensor([0.5, 2.0, 3.0]), reduction=red)
bce_case("bce_weight_pos_weight", xb, yb, weight=torch.rand(4, 3), pos_weight=torch.tensor([1.5, 0.2, 4.0]))

for red in REDUCTIONS:
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    ref = a.clone().requires_grad_(True)
    loss = F.mse_loss(ref, b, reduction=red)
    g, grad = backward(ref, loss)
    cases[f"mse_{red}"] = {"x": tensor(a), "y": tensor(b), "reduction": REDUCTIONS[red],
                           "grad_out": tensor(g), "loss": tensor(loss.detach()), "grad": tensor(grad)}

write(__file__, cases)
