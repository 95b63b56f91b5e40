"""Fixtures for the unary op family: every op on f32 edge values and on f64/f16/bf16/int inputs.

PyTorch is the reference. Run from anywhere (needs numpy and torch):
    python3 tensor/src/ops/unary/fixtures.py
Case names are `<dtype>/<op>`; each case holds `x` and the expected `y`, plus the op's scalar
parameters (`mul`/`add`, `exponent`, `min`/`max`).
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
import fixture_io as fio  # noqa: E402

NAN, INF = float("nan"), float("inf")
# Signed zeros, halves (for round), tiny/subnormal, overflow for exp/square, NaN and infinities.
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.7, -3.7, 1e-3, -1e-3, 1e-40, -1e-40,
         10.0, -10.0, 30.0, -30.0, 88.5, -88.5, 100.0, -100.0, 1e20, -1e20, 3e38, -3e38, NAN, INF, -INF]
# Trig on huge arguments measures argument reduction, not our kernels; GELU and SiLU at +-inf
# give NaN in PyTorch (0 * inf inside) where the limits are finite, and PyTorch's GELU overflows
# an intermediate near the f32 maximum, so those inputs are left out.
NO_HUGE = [v for v in EDGES if v != v or abs(v) <= 100.0]
MODERATE = [v for v in EDGES if v == v and abs(v) <= 1e20]

OPS = {
    "neg": (torch.neg, EDGES),
    "abs": (torch.abs, EDGES),
    "exp": (torch.exp, EDGES),
    "log": (torch.log, EDGES),
    "log1p": (torch.log1p, EDGES),
    "sqrt": (torch.sqrt, EDGES),
    "rsqrt": (torch.rsqrt, EDGES),
    "sin": (torch.sin, NO_HUGE),
    "cos": (torch.cos, NO_HUGE),
    "tanh": (torch.tanh, EDGES),
    "sigmoid": (torch.sigmoid, EDGES),
    "relu": (torch.relu, EDGES),
    "gelu": (F.gelu, MODERATE),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), MODERATE),
    "silu": (F.silu, MODERATE),
    "square": (torch.square, EDGES),
    "reciprocal": (torch.reciprocal, EDGES),
    "sign": (torch.sign, EDGES),
    "floor": (torch.floor, EDGES),
    "ceil": (torch.ceil, EDGES),
    "round": (torch.round, EDGES),
}
PARAM_OPS = {
    "affine": ({"mul": 2.5, "add": -1.25}, lambda t, p: t * p["mul"] + p["add"]),
    "pow2": ({"exponent": 2.0}, lambda t, p: torch.pow(t, p["exponent"])),
    "pow3": ({"exponent": 3.0}, lambda t, p: torch.pow(t, p["exponent"])),
    "pow_half": ({"exponent": 0.5}, lambda t, p: torch.pow(t, p["exponent"])),
    "pow_neg": ({"exponent": -1.5}, lambda t, p: torch.pow(t, p["exponent"])),
    "clamp": ({"min": -1.0, "max": 2.0}, lambda t, p: torch.clamp(t, p["min"], p["max"])),
    # 1e300 is +inf once converted to the tensor's float type: a clamp with no upper bound.
    "clamp_min": ({"min": -0.5, "max": 1e300}, lambda t, p: torch.clamp(t, min=p["min"])),
}

cases = {}
for name, (fn, values) in OPS.items():
    x = torch.tensor(values, dtype=torch.float32)
    cases[f"float32/{name}"] = {"x": fio.tensor(x), "y": fio.tensor(fn(x))}
for name, (params, fn) in PARAM_OPS.items():
    x = torch.tensor(EDGES, dtype=torch.float32)
    cases[f"float32/{name}"] = {"x": fio.tensor(x), "y": fio.tensor(fn(x, params)), **params}

# Other float dtypes: moderate values in a 2-D tensor (the test also feeds a transposed view).
gen = torch.Generator().manual_seed(0)
base = torch.randn(6, 5, generator=gen, dtype=torch.float64) * 3
base[0, :] = torch.tensor([0.0, -0.5, 0.5, 1.5, 2.5], dtype=torch.float64)
positive = base.abs() + 0.1
for dtype in (torch.float64, torch.float16, torch.bfloat16):
    dname = str(dtype).replace("torch.", "")
    for name, (fn, _) in OPS.items():
        src = positive if name in ("log", "sqrt", "rsqrt") else base
        x = src.to(dtype)
        cases[f"{dname}/{name}"] = {"x": fio.tensor(x), "y": fio.tensor(fn(x))}
    for name, (params, fn) in PARAM_OPS.items():
        src = positive if name in ("pow_half", "pow_neg") else base
        x = src.to(dtype)
        cases[f"{dname}/{name}"] = {"x": fio.tensor(x), "y": fio.tensor(fn(x, params)), **params}

# Integer tensors: exact, wrapping arithmetic (u8 `neg` and `square` wrap modulo 256).
INT_OPS = {
    "neg": ({}, lambda t, p: torch.neg(t)),
    "abs": ({}, lambda t, p: torch.abs(t)),
    "relu": ({}, lambda t, p: torch.relu(t)),
    "square": ({}, lambda t, p: torch.square(t)),
    "sign": ({}, lambda t, p: torch.sign(t)),
    "affine": ({"mul": 3, "add": -7}, lambda t, p: t * p["mul"] + p["add"]),
    "clamp": ({"min": 2, "max": 200}, lambda t, p: torch.clamp(t, p["min"], p["max"])),
}
int_inputs = {
    "int64": torch.tensor([0, 1, -1, 7, -7, 100, -100, 3_000_000_000, -3_000_000_000, 2**40 + 3], dtype=torch.int64),
    "uint8": torch.tensor([0, 1, 2, 7, 15, 16, 100, 128, 200, 255], dtype=torch.uint8),
}
for dname, x in int_inputs.items():
    for name, (params, fn) in INT_OPS.items():
        if dname == "uint8" and name == "relu":
            continue  # not implemented for uint8 in PyTorch
        cases[f"{dname}/{name}"] = {"x": fio.tensor(x), "y": fio.tensor(fn(x, params)), **params}

fio.write(__file__, cases)
