"""Fixtures for the nn layers, from PyTorch modules on the CPU in float32.

Each case holds a layer's state dict (entries "p.<name>", loaded into the Rust layer through
load_state_dict, which also checks the names), an input "x", the output "out" of a forward pass,
a fixed output gradient "grad_out", and after backward the input gradient "grad_x" and every
parameter's gradient "g.<name>". "names" lists the state dict's names in PyTorch's order.
Extra entries are described at each case.
Run: python3 nn/src/layers/fixtures.py (needs numpy and torch).
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}


def randomize(module):
    """Non-trivial values for what PyTorch initialises to constants: norm layers' weights and
    every bias."""
    norm = isinstance(module, (nn.BatchNorm2d, nn.LayerNorm))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if norm or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))


def state(module):
    return {"p." + k: tensor(v) for k, v in module.state_dict().items()}


def run(name, module, x, forward=None, extra=None, float_input=True):
    """Forward and backward of `module` on `x`; records everything named in the module doc."""
    case = state(module)
    case["names"] = list(module.state_dict().keys())
    if float_input:
        x = x.clone().requires_grad_(True)
    case["x"] = tensor(x)
    out = forward(x) if forward else module(x)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    case["out"] = tensor(out)
    case["grad_out"] = tensor(grad_out)
    if float_input:
        case["grad_x"] = tensor(x.grad)
    for k, p in module.named_parameters():
        case["g." + k] = tensor(p.grad)
    case.update(extra or {})
    cases[name] = case
    return case


run("linear", nn.Linear(5, 4), torch.randn(2, 3, 5))
run("linear_no_bias", nn.Linear(5, 3, bias=False), torch.randn(4, 5))

conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
run("conv_groups", conv, torch.randn(2, 4, 7, 7))
conv = nn.Conv2d(3, 4, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=False)
run("conv_dilation", conv, torch.randn(2, 3, 6, 7))

# Batch norm: two training steps on x then x2 (the second's running statistics are "after.*"),
# then eval mode on x_eval ("out_eval", "grad_x_eval" for "grad_out_eval"). The fixture's
# "out"/"grad_x" come from the first step.
for name, kwargs in [("bn", {}), ("bn_cumulative", {"momentum": None, "affine": False})]:
    bn = nn.BatchNorm2d(3, **kwargs)
    randomize(bn)
    x2, x_eval = torch.randn(4, 3, 3, 2) * 2 + 1, torch.randn(2, 3, 4, 4)
    case = run(name, bn, torch.randn(2, 3, 4, 5) * 3 - 1)
    bn(x2)
    case.update({"after." + k: tensor(v) for k, v in bn.state_dict().items()})
    case["x2"] = tensor(x2)
    bn.eval()
    x_eval.requires_grad_(True)
    out = bn(x_eval)
    g = torch.randn_like(out)
    out.backward(g)
    case.update({"x_eval": tensor(x_eval), "out_eval": tensor(out), "grad_out_eval": tensor(g),
                 "grad_x_eval": tensor(x_eval.grad)})

ln = nn.LayerNorm([4, 6])
randomize(ln)
run("layer_norm", ln, torch.randn(2, 3, 4, 6) * 2 + 0.5)

# ids include the padding id 2 and repeats, so the weight gradient accumulates and skips row 2.
emb = nn.Embedding(10, 4, padding_idx=2)
run("embedding", emb, torch.tensor([[1, 2, 5, 1], [2, 9, 0, 5]]), float_input=False)

# Activations share one input with exact zeros in it.
x = torch.randn(3, 7) * 3
x[0, 0] = 0.0
for name, module in [("relu", nn.ReLU()), ("gelu", nn.GELU()), ("gelu_tanh", nn.GELU(approximate="tanh")),
                     ("silu", nn.SiLU())]:
    run(name, module, x)

x = torch.randn(2, 3, 7, 9)
run("max_pool", nn.MaxPool2d(3, stride=2, padding=1), x)
run("max_pool_ceil", nn.MaxPool2d(2, ceil_mode=True), x)
run("avg_pool", nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), x)
run("adaptive_avg_pool", nn.AdaptiveAvgPool2d((2, 3)), x)
run("flatten", nn.Flatten(), x)

# Multi-head self-attention (batch_first), with random biases. "attn_mask" (bool, true =
# masked) is the causal mask; "key_padding_mask" pads the end of the second sequence.
mha = nn.MultiheadAttention(8, 2, batch_first=True)
randomize(mha)
x = torch.randn(2, 5, 8)
causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
for name, mask, kpm in [("mha", None, None), ("mha_causal", causal, None), ("mha_padding", None, padding),
                        ("mha_causal_padding", causal, padding)]:
    mha.zero_grad()

    def forward(x, mask=mask, kpm=kpm):
        return mha(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=False)[0]

    extra = {"key_padding_mask": tensor(kpm)} if kpm is not None else {}
    run(name, mha, x, forward, extra)

# The functional attention: a bool mask (true = attend, F.scaled_dot_product_attention's
# convention) and is_causal. "q", "k", "v" and their gradients "grad_q", ...
q, k, v = torch.randn(2, 2, 4, 3), torch.randn(2, 2, 6, 3), torch.randn(2, 2, 6, 5)
allow = torch.rand(4, 6) > 0.3
allow[:, 0] = True
for name, mask, causal in [("sdpa_mask", allow, False), ("sdpa_float_mask", torch.randn(2, 1, 4, 6), False),
                           ("sdpa_causal", None, True)]:
    qs, ks, vs = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal)
    g = torch.randn_like(out)
    out.backward(g)
    case = {"q": tensor(qs), "k": tensor(ks), "v": tensor(vs), "out": tensor(out), "grad_out": tensor(g),
            "grad_q": tensor(qs.grad), "grad_k": tensor(ks.grad), "grad_v": tensor(vs.grad)}
    if mask is not None:
        case["mask"] = tensor(mask)
    cases[name] = case

seq = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                    nn.Linear(16, 5), nn.GELU(), nn.Linear(5, 3))
randomize(seq[1])
run("sequential", seq, torch.randn(2, 3, 4, 4))


# A small ResNet-like nesting, for the state dict's names and order only.
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.downsample = nn.Sequential(nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(Block(), nn.Identity())
        self.scale = nn.Parameter(torch.ones(3))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 2)


net = Net()
cases["nested"] = {"names": list(net.state_dict().keys()),
                   "parameter_names": [n for n, _ in net.named_parameters()],
                   "buffer_names": [n for n, _ in net.named_buffers()]}

write(__file__, cases)
