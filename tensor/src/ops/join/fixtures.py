"""Fixtures for cat/stack/split/chunk, from PyTorch.

Piece sizes of torch.chunk and torch.split for a range of dim sizes, and cat/stack results on
strided views (the Rust test rebuilds the views named in the comments).
Run: python3 tensor/src/ops/join/fixtures.py (needs numpy and torch).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}

for size in [0, 1, 5, 6, 7, 12, 13]:
    for chunks in [1, 2, 3, 4, 5, 6, 8]:
        pieces = torch.chunk(torch.empty(2, size), chunks, dim=1)
        cases[f"chunk_{size}_{chunks}"] = {"sizes": [p.shape[1] for p in pieces]}
    for split_size in [1, 2, 3, 5, 20]:
        pieces = torch.split(torch.empty(size, 2), split_size, dim=0)
        cases[f"split_{size}_{split_size}"] = {"sizes": [p.shape[0] for p in pieces]}

# cat along dim 1 of a.transpose(0, 1) [3, 2, 4], b [3, 5, 4] and c = c_base[:, ::2, :] [3, 1, 4].
a, b, c_base = torch.randn(2, 3, 4), torch.randn(3, 5, 4), torch.randn(3, 2, 4)
cases["cat"] = {
    "a": tensor(a), "b": tensor(b), "c_base": tensor(c_base),
    "out": tensor(torch.cat([a.transpose(0, 1), b, c_base[:, ::2, :]], dim=1)),
}
# stack along dim -1 of x.t() and y (both [3, 2]).
x, y = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
cases["stack"] = {"x": tensor(x), "y": tensor(y), "out": tensor(torch.stack([x.t(), y], dim=-1))}

write(__file__, cases)
