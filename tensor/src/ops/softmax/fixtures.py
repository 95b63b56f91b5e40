"""Fixtures for softmax/log_softmax with PyTorch as the reference: extreme logits (huge, tiny,
-inf, a row of all -inf), along every dim of a 3-d tensor, in f32, f64 and bf16. Needs torch.

    python3 tensor/src/ops/softmax/fixtures.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
inf = float("inf")
cases = {}

extreme = torch.tensor([
    [1000.0, 0.0, -1000.0, 999.0],
    [-inf, 0.0, 1.0, -inf],
    [1e-30, -1e-30, 0.0, 1e-38],
    [-1e4, -1e4 - 1, -1e4 - 50, -1e4 - 100],
    [3e38, 3e38, -3e38, 0.0],
    [-inf, -inf, -inf, -inf],
    [88.0, 89.0, 90.0, -90.0],
    [0.5, 0.5, 0.5, 0.5],
], dtype=torch.float64)
for dtype in (torch.float32, torch.float64):
    x = extreme.to(dtype)
    for dim in (0, 1):
        # The expected value is torch's answer in f64 on the same (rounded) inputs.
        cases[f"extreme_{str(dtype)[6:]}_d{dim}"] = {
            "x": tensor(x), "dim": [dim],
            "softmax": tensor(torch.softmax(x.double(), dim).to(dtype)),
            "log_softmax": tensor(torch.log_softmax(x.double(), dim).to(dtype)),
        }

wide = torch.randn(3, 4, 5, dtype=torch.float64) * 20
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    x = wide.to(dtype)
    for dim in (0, 1, 2, -1):
        cases[f"wide_{str(dtype)[6:]}_d{dim}"] = {
            "x": tensor(x), "dim": [dim],
            "softmax": tensor(torch.softmax(x.double(), dim).to(dtype)),
            "log_softmax": tensor(torch.log_softmax(x.double(), dim).to(dtype)),
        }

write(__file__, cases)
