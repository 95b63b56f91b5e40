"""Fixtures for the pooling ops, from PyTorch (needs numpy and torch).

    python3 tensor/src/ops/pool/fixtures.py

Each case holds the input `x`, the forward's outputs (`values`, and `indices` for max pooling),
a random `grad_out` and `grad_in`, the input gradient torch.autograd.grad computes from it, and
the op's parameters as integer lists (booleans as 0/1, `divisor_override` empty for None).

Case names start with the op: `max_`, `avg_`, `adaptavg_`, `adaptmax_`. Most cases compute in
float64 from float32-exact inputs (so the tests can run them in f32 and f64); `half_` cases
compute in bfloat16 / float16 as torch's CPU kernels do. `maxfwd_` cases have no backward.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

torch.manual_seed(0)
cases = {}


def make_input(shape, dtype=torch.float64, ints=False):
    """Float32-exact values in `dtype`; `ints` gives small integers, so windows hold ties."""
    if ints:
        x = torch.randint(-2, 3, shape).float()
    else:
        x = torch.randn(shape)
    return x.to(dtype)


def record(name, x, forward, params, backward=True):
    x = x.detach().clone().requires_grad_(backward)
    out = forward(x)
    values, indices = out if isinstance(out, tuple) else (out, None)
    case = {"x": tensor(x), "values": tensor(values)}
    if indices is not None:
        case["indices"] = tensor(indices)
    if backward:
        grad_out = torch.randn(values.shape).to(values.dtype)
        (grad_in,) = torch.autograd.grad(values, x, grad_out)
        case["grad_out"] = tensor(grad_out)
        case["grad_in"] = tensor(grad_in)
    case.update(params)
    cases[name] = case


def max_case(name, x, kernel, stride, padding, dilation=(1, 1), ceil_mode=False, backward=True):
    params = {
        "kernel": list(kernel), "stride": list(stride), "padding": list(padding),
        "dilation": list(dilation), "ceil_mode": [int(ceil_mode)],
    }
    forward = lambda t: F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode, return_indices=True)  # noqa: E731
    record(name, x, forward, params, backward)


def avg_case(name, x, kernel, stride, padding, ceil_mode=False, count_include_pad=True, divisor_override=None):
    params = {
        "kernel": list(kernel), "stride": list(stride), "padding": list(padding),
        "ceil_mode": [int(ceil_mode)], "count_include_pad": [int(count_include_pad)],
        "divisor_override": [] if divisor_override is None else [divisor_override],
    }
    forward = lambda t: F.avg_pool2d(t, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)  # noqa: E731
    record(name, x, forward, params)


def adaptive_case(name, x, output_size):
    params = {"output_size": list(output_size)}
    record("adaptavg_" + name, x, lambda t: F.adaptive_avg_pool2d(t, output_size), params)
    record("adaptmax_" + name, x, lambda t: F.adaptive_max_pool2d(t, output_size, return_indices=True), params)


# max_pool2d
max_case("max_basic", make_input((2, 3, 8, 8)), (2, 2), (2, 2), (0, 0))
max_case("max_stride_ne_kernel", make_input((2, 2, 9, 7)), (3, 2), (1, 2), (1, 0))
max_case("max_dilation", make_input((1, 2, 11, 10)), (3, 2), (2, 1), (1, 1), dilation=(2, 3))
max_case("max_ceil", make_input((2, 2, 7, 8)), (3, 3), (2, 2), (1, 1), ceil_mode=True)
max_case("max_ceil_dilated_odd", make_input((1, 3, 6, 5)), (2, 3), (3, 2), (0, 1), dilation=(1, 2), ceil_mode=True)
# ceil mode drops a last window that would start in the right padding
max_case("max_ceil_drops_last", make_input((1, 2, 4, 7)), (2, 2), (5, 3), (1, 1), ceil_mode=True)
max_case("max_ties", make_input((2, 2, 6, 6), ints=True), (3, 3), (1, 1), (1, 1))
nan_input = make_input((2, 2, 6, 6))
nan_input[0, 0, 1, 1] = float("nan")
nan_input[1, 0, 0, 0] = float("nan")
nan_input[1, 0, 1, 1] = float("nan")  # a later NaN in the same window takes the index
nan_input[0, 1, 2, 2:4] = float("-inf")
max_case("max_nan_inf", nan_input, (2, 2), (2, 2), (0, 0))
max_case("max_unbatched", make_input((3, 7, 7)), (3, 3), (2, 2), (1, 1))
max_case("max_resnet_stem", make_input((1, 4, 16, 16)), (3, 3), (2, 2), (1, 1))
max_case("max_global", make_input((2, 3, 5, 6)), (5, 6), (1, 1), (0, 0))
# A window wholly in the padding: torch gives -inf and an index past the plane.
max_case("maxfwd_empty_window", make_input((1, 1, 2, 2)), (2, 2), (1, 1), (1, 1), dilation=(3, 3), backward=False)

# avg_pool2d
avg_case("avg_basic", make_input((2, 3, 8, 8)), (2, 2), (2, 2), (0, 0))
avg_case("avg_pad_include", make_input((2, 2, 7, 9)), (3, 3), (2, 2), (1, 1), count_include_pad=True)
avg_case("avg_pad_exclude", make_input((2, 2, 7, 9)), (3, 3), (2, 2), (1, 1), count_include_pad=False)
avg_case("avg_ceil_include", make_input((1, 2, 7, 8)), (3, 3), (2, 2), (1, 1), ceil_mode=True)
avg_case("avg_ceil_exclude", make_input((1, 2, 7, 8)), (3, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False)
avg_case("avg_ceil_no_pad", make_input((1, 1, 5, 5)), (2, 2), (2, 2), (0, 0), ceil_mode=True)
avg_case("avg_ceil_drops_last", make_input((1, 2, 4, 7)), (2, 2), (5, 3), (1, 1), ceil_mode=True)
avg_case("avg_divisor_override", make_input((2, 2, 6, 7)), (3, 2), (2, 1), (1, 1), divisor_override=5)
avg_case("avg_unbatched_odd", make_input((3, 5, 6)), (2, 3), (1, 2), (1, 1), ceil_mode=True)
avg_case("avg_stride_ne_kernel", make_input((2, 2, 9, 7)), (3, 2), (1, 3), (1, 1), count_include_pad=False)

# adaptive pools: sizes that do not divide, global, upsampling (overlapping windows), unbatched
adaptive_case("7to3", make_input((2, 3, 7, 7)), (3, 3))
adaptive_case("5x8to2x3", make_input((1, 2, 5, 8)), (2, 3))
adaptive_case("global", make_input((2, 4, 5, 6)), (1, 1))
adaptive_case("3x4to5x7", make_input((1, 2, 3, 4)), (5, 7))
adaptive_case("unbatched", make_input((3, 10, 9)), (4, 4))

# reduced precision, computed by torch in that dtype
max_case("half_max_bf16", make_input((2, 2, 9, 8), torch.bfloat16), (3, 3), (2, 2), (1, 1), ceil_mode=True)
avg_case("half_avg_bf16", make_input((2, 2, 9, 8), torch.bfloat16), (3, 3), (2, 2), (1, 1), count_include_pad=False)
avg_case("half_avg_f16", make_input((2, 2, 9, 8), torch.float16), (3, 2), (2, 2), (1, 1), ceil_mode=True)
record("half_adaptavg_bf16", make_input((2, 2, 7, 7), torch.bfloat16),
       lambda t: F.adaptive_avg_pool2d(t, (3, 3)), {"output_size": [3, 3]})

write(__file__, cases)
