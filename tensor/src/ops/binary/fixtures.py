"""Fixtures for the binary op family: arithmetic with broadcasting on every float dtype,
NaN propagation of maximum/minimum, comparisons, where/masked_fill, wrapping integer arithmetic.

PyTorch is the reference. Run from anywhere (needs numpy and torch):
    python3 tensor/src/ops/binary/fixtures.py
Case names are `<kind>/<dtype>/<op>/<index>`; each case holds inputs `a`, `b` (and `cond`,
`value` for where/masked_fill) and the expected `y`.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
import fixture_io as fio  # noqa: E402

NAN, INF = float("nan"), float("inf")
gen = torch.Generator().manual_seed(1)

# Broadcast-compatible shape pairs: equal, rank differences, size-1 dims on either side, scalars.
SHAPES = [([2, 3], [2, 3]), ([2, 3], [3]), ([4, 1, 3], [5, 1]), ([], [2, 2]), ([3, 1], [1, 4]),
          ([1], [2, 3, 4]), ([2, 1, 3, 1], [4, 1, 5]), ([0, 3], [1, 3])]
ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
         "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow}

cases = {}


def randn(shape, dtype):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).to(dtype)


for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
    dname = str(dtype).replace("torch.", "")
    for name, fn in ARITH.items():
        for i, (sa, sb) in enumerate(SHAPES):
            a, b = randn(sa, dtype), randn(sb, dtype)
            if name == "pow":
                # Positive bases for real powers; small integer exponents on negative bases.
                a = a.abs() + 0.25
                if i % 2 == 1:
                    a = -a
                    b = torch.round(b)
            cases[f"arith/{dname}/{name}/{i}"] = {"a": fio.tensor(a), "b": fio.tensor(b), "y": fio.tensor(fn(a, b))}

# Special values on both sides of every float op: the outer product of an edge list with itself.
edges = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.0, 1e30, -1e30, NAN, INF, -INF], dtype=torch.float32)
a, b = edges.reshape(-1, 1), edges.reshape(1, -1)
for name, fn in ARITH.items():
    cases[f"edges/float32/{name}/0"] = {"a": fio.tensor(a), "b": fio.tensor(b), "y": fio.tensor(fn(a, b))}

# Comparisons (bool results), with ties and NaN, on floats and integers.
CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
ints = torch.tensor([-3, 0, 2, 2, 7], dtype=torch.int64)
for name, fn in CMP.items():
    cases[f"cmp/float32/{name}/0"] = {"a": fio.tensor(a), "b": fio.tensor(b), "y": fio.tensor(fn(a, b))}
    ia, ib = ints.reshape(-1, 1), ints.reshape(1, -1)
    cases[f"cmp/int64/{name}/0"] = {"a": fio.tensor(ia), "b": fio.tensor(ib), "y": fio.tensor(fn(ia, ib))}
    h = randn([3, 4], torch.bfloat16)
    hb = h[:, 1:2]
    cases[f"cmp/bfloat16/{name}/0"] = {"a": fio.tensor(h), "b": fio.tensor(hb), "y": fio.tensor(fn(h, hb))}

# Integer arithmetic wraps on overflow.
I64_BIG = [0, 1, -1, 2**40, -(2**40), 2**52, 3 * 10**9, 123456789]
U8S = [0, 1, 7, 100, 128, 200, 255]
INT_OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum}
for dname, values, dtype in (("int64", I64_BIG, torch.int64), ("uint8", U8S, torch.uint8)):
    t = torch.tensor(values, dtype=dtype)
    ta, tb = t.reshape(-1, 1), t.reshape(1, -1)
    for name, fn in INT_OPS.items():
        y = fn(ta, tb)
        if dtype == torch.int64:
            # Keep only results that JSON's float64 numbers hold exactly.
            keep = y.abs() < 2**53
            assert keep.any()
            y = torch.where(keep, y, torch.zeros_like(y))
            cases[f"int/{dname}/{name}/0"] = {"a": fio.tensor(ta), "b": fio.tensor(tb), "y": fio.tensor(y),
                                              "keep": fio.tensor(keep)}
        else:
            cases[f"int/{dname}/{name}/0"] = {"a": fio.tensor(ta), "b": fio.tensor(tb), "y": fio.tensor(y),
                                              "keep": fio.tensor(torch.ones_like(y, dtype=torch.bool))}

# where(cond, a, b) with all three broadcast, and masked_fill with a broadcast mask.
for i, (sc, sa, sb) in enumerate([([2, 3], [2, 3], [2, 3]), ([3, 1], [1, 4], [4]), ([1, 4], [2, 1], [])]):
    cond = torch.rand(sc, generator=gen) > 0.5
    ta, tb = randn(sa, torch.float32), randn(sb, torch.float32)
    cases[f"where/float32/where/{i}"] = {"cond": fio.tensor(cond), "a": fio.tensor(ta), "b": fio.tensor(tb),
                                         "y": fio.tensor(torch.where(cond, ta, tb))}
for i, (sx, sm) in enumerate([([2, 3], [2, 3]), ([3, 4], [4]), ([2, 3, 4], [3, 1])]):
    x = randn(sx, torch.float32)
    mask = torch.rand(sm, generator=gen) > 0.5
    cases[f"masked_fill/float32/masked_fill/{i}"] = {"a": fio.tensor(x), "cond": fio.tensor(mask), "value": -1.5,
                                                     "y": fio.tensor(x.masked_fill(mask, -1.5))}

fio.write(__file__, cases)
