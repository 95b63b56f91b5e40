"""Fixtures for dtype conversion: every pair of the 8 dtypes, with rounding ties, subnormals,
overflow to infinity, truncation and wrap-around of integer casts.

PyTorch is the reference. Run from anywhere (needs numpy and torch):
    python3 tensor/src/ops/convert/fixtures.py
Case names are `<from>-><to>`; each case holds `x` (of the source dtype) and the expected `y`.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
import fixture_io as fio  # noqa: E402

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint32, torch.uint8,
          torch.bool]

FLOATS = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1.5, -1.5, 2.5, -2.7, 255.9, 300.0, 65504.0, 65519.0, 65520.0, 1e5, -1e5,
    1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20,  # bf16: tie to even (down), tie to even (up), above the tie
    1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20,  # the same for f16
    2**-24, 2**-25, 3 * 2**-26, 6e-8, 1e-5,  # f16 subnormals: smallest, tie to zero, round up
    1e-40, -1e-40, 2**-133, 2**-134,  # f32 and bf16 subnormals
    3.3e38, 3.4e38, -3.4e38,  # the top of bf16's range and past it
    16777217.0, 2.0**31, NAN, INF, -INF,
]
# f64 values whose rounding to f16/bf16 differs between one rounding and PyTorch's two (via f32).
DOUBLE_ONLY = [1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40, 1e-300, 1e300, 2**-149 * 0.5 + 2**-180]
INTS = [0, 1, -1, 2, 127, 128, 255, 256, 300, -300, 2049, 2**31, 2**32 + 5, -(2**40) - 3, 16777217, 2**53 - 1]
INTEGER_TARGETS = (torch.int64, torch.uint32, torch.uint8)


def source(dtype):
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    if dtype.is_floating_point:
        values = FLOATS + (DOUBLE_ONLY if dtype == torch.float64 else [])
        return torch.tensor(values, dtype=torch.float64).to(dtype)
    if dtype == torch.int64:
        return torch.tensor(INTS, dtype=torch.int64)
    bits = 8 if dtype == torch.uint8 else 32
    return torch.tensor(sorted({v % 2**bits for v in INTS}), dtype=torch.int64).to(dtype)


cases = {}
for src in DTYPES:
    for dst in DTYPES:
        if src == dst:
            continue
        x = source(src)
        if src.is_floating_point and dst in INTEGER_TARGETS:
            # Casting NaN, infinities and values beyond int64 to an integer is undefined in
            # PyTorch; finite values truncate toward zero and then wrap to the target's width.
            x = x[torch.isfinite(x) & (x.double().abs() < 2**62)]
        y = x.to(dst)
        name = lambda d: str(d).replace("torch.", "")
        cases[f"{name(src)}->{name(dst)}"] = {"x": fio.tensor(x), "y": fio.tensor(y)}

fio.write(__file__, cases)
