"""Fixtures for creation ops: arange (fractional and negative steps, integer dtypes), linspace
(including one and zero steps, integer dtypes) and eye.

PyTorch is the reference. Run from anywhere (needs numpy and torch):
    python3 tensor/src/ops/creation/fixtures.py
Case names are `<op>/<index>`; each holds the arguments (`start`, `end`, `step`/`steps`, `n`) and
the expected `y`, whose dtype is the dtype to ask for.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
import fixture_io as fio  # noqa: E402

ARANGE = [
    (0, 10, 1, torch.float32), (0, 1, 0.1, torch.float32), (0, 1, 0.1, torch.float64), (10, 0, -3, torch.float32),
    (-1, 1, 0.25, torch.float16), (1, 2.5, 0.5, torch.bfloat16), (0.5, 3.7, 0.7, torch.float64),
    (5, -5, -0.3, torch.float32), (3, 3, 1, torch.float32), (0, 5, 1.5, torch.int64), (0, 7, 2, torch.int64),
    (10, 0, -3, torch.int64), (0.7, 5, 1, torch.int64), (0, 260, 7, torch.uint8), (-3, 3, 1, torch.float64),
]
LINSPACE = [
    (0, 1, 5, torch.float32), (-1, 1, 7, torch.float32), (0, 10, 1, torch.float32), (3, 3, 4, torch.float32),
    (0, 1, 0, torch.float32), (2, -3, 6, torch.float64), (0.5, 10.5, 5, torch.int64), (0, 1, 11, torch.float16),
    (-2, 2, 9, torch.bfloat16), (0, 255, 18, torch.uint8), (1e-3, 1e3, 50, torch.float64),
]
EYE = [(0, torch.float32), (1, torch.float32), (4, torch.float64), (3, torch.int64), (5, torch.bool)]

cases = {}
for i, (start, end, step, dtype) in enumerate(ARANGE):
    cases[f"arange/{i}"] = {"start": start, "end": end, "step": step,
                            "y": fio.tensor(torch.arange(start, end, step, dtype=dtype))}
for i, (start, end, steps, dtype) in enumerate(LINSPACE):
    cases[f"linspace/{i}"] = {"start": start, "end": end, "steps": steps,
                              "y": fio.tensor(torch.linspace(start, end, steps, dtype=dtype))}
for i, (n, dtype) in enumerate(EYE):
    cases[f"eye/{i}"] = {"n": n, "y": fio.tensor(torch.eye(n, dtype=dtype))}

fio.write(__file__, cases)
