"""Fixtures for the index ops, computed by PyTorch on strided views.

Each case stores the contiguous base tensors; the Rust test rebuilds the same views (the
transposes and slices named in the comments) before calling the op.
Run: python3 tensor/src/ops/index/fixtures.py (needs numpy and torch).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}

# index_select along dim 1 of base.transpose(0, 2), repeated indices.
base = torch.randn(4, 5, 6)
idx = torch.tensor([4, 0, 0, 2])
cases["index_select"] = {
    "base": tensor(base), "index": tensor(idx),
    "out": tensor(torch.index_select(base.transpose(0, 2), 1, idx)),
}

# gather along dim 1 of base.t() (float64).
base = torch.randn(5, 6, dtype=torch.float64)
idx = torch.randint(0, 5, (6, 3))
cases["gather"] = {"base": tensor(base), "index": tensor(idx), "out": tensor(torch.gather(base.t(), 1, idx))}

# scatter_add along dim 0 into base.t(), src = src_base[:, 1:5]; index with many repeats.
base = torch.randn(4, 5)
src_base = torch.randn(6, 7)
idx = torch.randint(0, 5, (3, 4))
cases["scatter_add"] = {
    "base": tensor(base), "src_base": tensor(src_base), "index": tensor(idx),
    "out": tensor(torch.scatter_add(base.t(), 0, idx, src_base[:, 1:5])),
}

# index_add along dim 1 with alpha, source = src_base.permute(2, 0, 1); repeated indices.
base = torch.randn(3, 7, 4)
src_base = torch.randn(5, 3, 4).permute(1, 2, 0).contiguous()  # (3, 4, 5)
idx = torch.tensor([6, 1, 6, 6, 0])
cases["index_add"] = {
    "base": tensor(base), "src_base": tensor(src_base), "index": tensor(idx), "alpha": 0.5,
    "out": tensor(torch.index_add(base, 1, idx, src_base.permute(0, 2, 1), alpha=0.5)),
}

weight = torch.randn(10, 3)
ids = torch.tensor([[1, 9, 1, 0], [3, 3, 7, 2]])
cases["embedding"] = {
    "weight": tensor(weight), "ids": tensor(ids), "out": tensor(torch.nn.functional.embedding(ids, weight)),
}

ids = torch.tensor([[0, 4, 2], [2, 2, 1]])
cases["one_hot"] = {"ids": tensor(ids), "num_classes": 5, "out": tensor(torch.nn.functional.one_hot(ids, 5))}

write(__file__, cases)
