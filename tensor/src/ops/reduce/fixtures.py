"""Fixtures for the reduce family: torch as the reference for var/std (data far from zero, where
naive one-pass formulas lose every digit), argmax/argmin ties and NaN, topk, and the dtypes of
sums. Needs numpy and torch.

    python3 tensor/src/ops/reduce/fixtures.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}

# var/std: the expected value is computed in f64 from the exact input values, then rounded to
# the input dtype, which is what a kernel that accumulates in f64 should produce.
base = torch.randn(4, 5, 6, dtype=torch.float64) * 3 + 1e4
for dtype in (torch.float32, torch.float64):
    x = base.to(dtype)
    for dims in ([1], [0, 2], [-1], [0, 1, 2]):
        for correction in (0, 1, 2):
            keepdim = correction == 1
            name = f"var_{str(dtype)[6:]}_d{''.join(map(str, dims))}_c{correction}"
            var = x.double().var(dim=dims, correction=correction, keepdim=keepdim)
            cases[name] = {
                "x": tensor(x), "dims": dims, "correction": correction, "keepdim": int(keepdim),
                "var": tensor(var.to(dtype)), "std": tensor(var.sqrt().to(dtype)),
            }

# argmax/argmin: small integers give many ties; NaNs placed in some rows.
nan = float("nan")
ties = torch.randint(-2, 3, (6, 7)).double()
ties[1, 3] = nan
ties[1, 5] = nan
ties[4, 0] = nan
ties[:, 6][torch.tensor([0, 2, 5])] = nan
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    x = ties.to(dtype)
    for dim in (0, 1, -1):
        cases[f"arg_{str(dtype)[6:]}_d{dim}"] = {
            "x": tensor(x), "dim": [dim],
            "argmax": tensor(x.argmax(dim)), "argmin": tensor(x.argmin(dim)),
            "max": tensor(x.amax(dim)), "min": tensor(x.amin(dim)),
        }
ints = torch.randint(0, 4, (5, 6))
for dtype in (torch.int64, torch.uint8):
    x = ints.to(dtype)
    for dim in (0, 1):
        cases[f"arg_{str(dtype)[6:]}_d{dim}"] = {
            "x": tensor(x), "dim": [dim],
            "argmax": tensor(x.argmax(dim)), "argmin": tensor(x.argmin(dim)),
            "max": tensor(x.amax(dim)), "min": tensor(x.amin(dim)),
        }

# Sums: integer and bool sums are int64; bf16/f16 sums stay in their dtype.
big = torch.randint(0, 256, (3, 300))
for dtype in (torch.uint8, torch.bool, torch.int64, torch.bfloat16, torch.float16):
    x = big.to(dtype) if dtype != torch.float16 else (big.double() / 64).half()
    for dim in (0, 1):
        s = x.sum(dim)
        cases[f"sum_{str(dtype)[6:]}_d{dim}"] = {"x": tensor(x), "dim": [dim], "sum": tensor(s)}

# topk on distinct values (ties may come in any order in torch), and NaN handling.
distinct = torch.randperm(4 * 5 * 7).double().reshape(4, 5, 7) / 8 - 10
for dim in (0, 1, 2, -1):
    for k in (0, 1, 4):
        for largest in (True, False):
            x = distinct
            v, i = x.topk(k, dim=dim, largest=largest, sorted=True)
            cases[f"topk_d{dim}_k{k}_l{int(largest)}"] = {
                "x": tensor(x), "k": k, "dim": [dim], "largest": int(largest),
                "values": tensor(v), "indices": tensor(i),
            }
x = torch.tensor([[1.0, nan, 3.0, -2.0, 0.5], [4.0, 2.0, nan, nan, -1.0]])
for largest in (True, False):
    v, i = x.topk(3, dim=1, largest=largest, sorted=True)
    cases[f"topk_nan_l{int(largest)}"] = {
        "x": tensor(x), "k": 3, "dim": [1], "largest": int(largest),
        "values": tensor(v), "indices": tensor(i),
    }

write(__file__, cases)
