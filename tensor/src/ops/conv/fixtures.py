"""Fixtures for conv2d and its backward primitives, computed by PyTorch in float64.

Run: python3 tensor/src/ops/conv/fixtures.py   (needs numpy and torch)
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)

# name: (N, C, H, W), (O, KH, KW), stride, padding, dilation, groups, bias
CASES = {
    "basic_3x3_pad1": ((2, 3, 7, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    "strided_asymmetric": ((2, 3, 9, 8), (5, 3, 2), (2, 1), (0, 2), (1, 1), 1, True),
    "dilated": ((1, 2, 9, 9), (3, 3, 3), (1, 1), (2, 2), (2, 2), 1, False),
    "groups_strided": ((2, 4, 8, 7), (6, 3, 3), (2, 2), (1, 1), (1, 1), 2, True),
    "depthwise": ((2, 4, 6, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), 4, False),
    "pointwise": ((2, 5, 4, 6), (3, 1, 1), (1, 1), (0, 0), (1, 1), 1, True),
    "pointwise_groups": ((2, 4, 5, 3), (6, 1, 1), (1, 1), (0, 0), (1, 1), 2, False),
    "pointwise_strided": ((2, 3, 7, 7), (4, 1, 1), (2, 2), (0, 0), (1, 1), 1, False),
    "mixed_everything": ((3, 2, 10, 11), (4, 2, 3), (2, 3), (1, 0), (1, 2), 2, True),
    "large_padding": ((1, 2, 3, 3), (2, 2, 2), (1, 1), (3, 2), (1, 1), 1, True),
}

cases = {}
for name, ((n, c, h, w), (o, kh, kw), stride, padding, dilation, groups, has_bias) in CASES.items():
    x = torch.randn(n, c, h, w, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(o, c // groups, kh, kw, dtype=torch.float64, requires_grad=True)
    b = torch.randn(o, dtype=torch.float64) if has_bias else None
    y = F.conv2d(x, wt, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    gy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, wt), gy)
    case = {
        "x": tensor(x), "w": tensor(wt), "y": tensor(y), "grad_y": tensor(gy),
        "grad_x": tensor(gx), "grad_w": tensor(gw),
        "stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": [groups],
    }
    case["has_bias"] = [int(has_bias)]
    if b is not None:
        case["b"] = tensor(b)
    cases[name] = case

write(__file__, cases)
