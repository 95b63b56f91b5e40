"""Fixtures for the normalisation primitives, from PyTorch (torch.native_layer_norm,
torch.native_batch_norm, F.batch_norm).

Cases store contiguous bases; the Rust test rebuilds the views named in the comments. For
bf16 inputs the statistics are computed by torch in float32 from the bf16-rounded input (our
statistics of half inputs are float32), and the output by torch in bf16. The `offset` cases put
a large mean under a small spread, computed in float64 from the float32 data: they catch
statistics that lose the variance to cancellation.
Run: python3 tensor/src/ops/norm/fixtures.py (needs numpy and torch).
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}


def layer_norm_case(name, x, view, normalized_shape, weight, bias, eps, stats_from=None):
    out, mean, rstd = torch.native_layer_norm(view, normalized_shape, weight, bias, eps)
    if stats_from is not None:
        _, mean, rstd = torch.native_layer_norm(stats_from, normalized_shape, None, None, eps)
    case = {"x": tensor(x), "out": tensor(out), "mean": tensor(mean), "rstd": tensor(rstd), "eps": eps,
            "normalized_shape": list(normalized_shape)}
    if weight is not None:
        case["weight"] = tensor(weight)
    if bias is not None:
        case["bias"] = tensor(bias)
    cases[name] = case


# x.transpose(0, 1): [5, 3, 8] over [8].
x = torch.randn(3, 5, 8)
layer_norm_case("ln_f32_strided", x, x.transpose(0, 1), [8], torch.randn(8), torch.randn(8), 1e-5)
x = torch.randn(4, 3, 6, dtype=torch.float64)
layer_norm_case("ln_f64_two_dims", x, x, [3, 6], torch.randn(3, 6, dtype=torch.float64), None, 1e-6)
x = torch.randn(6, 16).bfloat16()
layer_norm_case("ln_bf16", x, x, [16], torch.randn(16).bfloat16(), torch.randn(16).bfloat16(), 1e-5,
                stats_from=x.float())
x = (1000 + 0.01 * torch.randn(4, 64)).float()
w, b = torch.randn(64), torch.randn(64)
out, mean, rstd = torch.native_layer_norm(x.double(), [64], w.double(), b.double(), 1e-5)
cases["ln_offset_f32"] = {"x": tensor(x), "weight": tensor(w), "bias": tensor(b), "eps": 1e-5,
                          "normalized_shape": [64], "out": tensor(out.float()),
                          "mean": tensor(mean), "rstd": tensor(rstd)}


def batch_norm_case(name, x, view, weight, bias, eps, stats_from=None):
    out, mean, invstd = torch.native_batch_norm(view, weight, bias, None, None, True, 0.1, eps)
    src = view if stats_from is None else stats_from
    dims = [0] + list(range(2, src.dim()))
    mean = src.mean(dim=dims)
    var = src.var(dim=dims, unbiased=False)
    case = {"x": tensor(x), "out": tensor(out), "mean": tensor(mean), "var": tensor(var), "eps": eps}
    if weight is not None:
        case["weight"] = tensor(weight)
    if bias is not None:
        case["bias"] = tensor(bias)
    cases[name] = case


# Channels-last storage: x.permute(0, 3, 1, 2) is NCHW [2, 3, 5, 4].
x = torch.randn(2, 5, 4, 3)
batch_norm_case("bn_nchw_f32_channels_last", x, x.permute(0, 3, 1, 2), torch.randn(3), torch.randn(3), 1e-5)
x = torch.randn(7, 4, dtype=torch.float64)
batch_norm_case("bn_nc_f64", x, x, None, None, 1e-3)
x = (3 + torch.randn(3, 4, 5)).bfloat16()
batch_norm_case("bn_ncl_bf16", x, x, torch.randn(4).bfloat16(), torch.randn(4).bfloat16(), 1e-5,
                stats_from=x.float())
x = (1e4 + 1e-2 * torch.randn(8, 2, 16)).float()
batch_norm_case("bn_offset_f32", x, x, None, None, 1e-8, stats_from=x.double())
cases["bn_offset_f32"]["out"] = tensor(torch.native_batch_norm(x.double(), None, None, None, None, True, 0.1,
                                                               1e-8)[0].float())

# Eval mode with running statistics.
x = torch.randn(2, 3, 4, 4)
running_mean, running_var = torch.randn(3), torch.rand(3) + 0.5
w, b = torch.randn(3), torch.randn(3)
cases["bn_eval"] = {"x": tensor(x), "running_mean": tensor(running_mean), "running_var": tensor(running_var),
                    "weight": tensor(w), "bias": tensor(b), "eps": 1e-5,
                    "out": tensor(F.batch_norm(x, running_mean, running_var, w, b, training=False, eps=1e-5))}

write(__file__, cases)
