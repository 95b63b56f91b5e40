"""Writes a safetensors file with every dtype oxtrain supports, using the reference
`safetensors` package and PyTorch, plus the exact bit pattern of every element as JSON.

    python3 tensor/src/safetensors/fixtures.py

Needs numpy, torch and safetensors (`pip install numpy torch safetensors`). The Rust tests
embed both outputs and check the file loads element for element, bit for bit.
"""

import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
NAN, INF = float("nan"), float("inf")


def tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "float32": torch.tensor(
            [[0.0, -0.0, 1.5, NAN], [INF, -INF, 1e-45, 3.4028234663852886e38], [-2.5, 0.1, 1e-38, 7.0]],
            dtype=torch.float32,
        ),
        "float32_random": torch.randn(4, 5, generator=g, dtype=torch.float32),
        "float64": torch.tensor(
            [[3.141592653589793, -1e-300], [5e-324, NAN], [-INF, 0.1]], dtype=torch.float64
        ),
        "float16": torch.tensor([65504.0, -0.0, 6e-8, NAN, INF, -1.0009765625, 0.1, 2049.0], dtype=torch.float16),
        "bfloat16": torch.tensor([[3.3895e38, 1e-40, NAN], [-INF, 0.1, -7.5]], dtype=torch.bfloat16),
        "int64": torch.tensor([-(2**63), 2**63 - 1, -1, 0, 1, 2**53 + 1], dtype=torch.int64),
        "uint32": torch.tensor([0, 1, 2**32 - 1, 123456789], dtype=torch.uint32),
        "uint8": torch.tensor([[0, 255, 7], [128, 1, 64]], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True, True, False]),
        "scalar_f64": torch.tensor(2.718281828459045, dtype=torch.float64),
        "empty_f32": torch.zeros(0, 3, dtype=torch.float32),
    }


def bits(t):
    """Every element's raw bits (floats) or value (integers, bool as 0/1), row-major."""
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
        view = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}.get(arr.dtype.type)
        if view is not None:
            arr = arr.view(view)
    return [int(x) for x in arr.reshape(-1).tolist()]


def main():
    ts = tensors()
    metadata = {"format": "pt", "written_by": "fixtures.py"}
    save_file(ts, os.path.join(HERE, "fixture_all_dtypes.safetensors"), metadata=metadata)
    expected = {
        name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "bits": bits(t)}
        for name, t in ts.items()
    }
    out = os.path.join(HERE, "fixtures.json")
    with open(out, "w") as f:
        json.dump({"metadata": metadata, "tensors": expected}, f, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(ts)} tensors to fixture_all_dtypes.safetensors and {out}")


if __name__ == "__main__":
    main()
