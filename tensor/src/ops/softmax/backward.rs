//! The gradients of `softmax` and `log_softmax` along the last dim, each in one pass over a
//! row (PyTorch's `_softmax_backward_data`): from the output `y` and its gradient `g`,
//! `softmax: y * (g - sum(g * y))` and `log_softmax: g - exp(y) * sum(g)`, the sum in the
//! compute type (f32 for f16/bf16, as PyTorch's kernels), accumulated in f64 on the CPU.
//! The composed form took four tensor passes and two temporaries of the full size, which for
//! attention's `[B, H, T, T]` weights was most of a GPT-2 backward's memory traffic.

use super::SoftmaxOp;
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::storage::CpuStorage;
use crate::strided::PAR_THRESHOLD;
use rayon::prelude::*;

/// Contiguous rows of `n` of `g` and `y` (same dtype): the input gradient, contiguous.
pub(super) fn softmax_backward(
    g: &CpuStorage,
    y: &CpuStorage,
    (offset_g, offset_y): (usize, usize),
    rows: usize,
    n: usize,
    op: SoftmaxOp,
) -> CpuStorage {
    with_float_storage!(g, "softmax_backward", gv, T => {
        let yv = y.as_slice::<T>();
        T::into_storage(rows_backward(&gv[offset_g..offset_g + rows * n], &yv[offset_y..offset_y + rows * n], n, op))
    })
}

fn rows_backward<T: ComputeAs>(g: &[T], y: &[T], n: usize, op: SoftmaxOp) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); g.len()];
    if n == 0 {
        return out;
    }
    let row = |((o, g), y): ((&mut [T], &[T]), &[T])| match op {
        SoftmaxOp::Softmax => {
            let dot: f64 = g.iter().zip(y).map(|(&g, &y)| g.to_f64() * y.to_f64()).sum();
            let dot = <T::C as Special>::of(dot);
            for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                *o = T::down(y.up() * (g.up() - dot));
            }
        }
        SoftmaxOp::LogSoftmax => {
            let sum = <T::C as Special>::of(g.iter().map(|&g| g.to_f64()).sum::<f64>());
            for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                *o = T::down(g.up() - num_traits::Float::exp(y.up()) * sum);
            }
        }
    };
    let rows_per_task = (PAR_THRESHOLD / n).max(1);
    if g.len() <= PAR_THRESHOLD {
        out.chunks_mut(n).zip(g.chunks(n)).zip(y.chunks(n)).for_each(row);
    } else {
        out.par_chunks_mut(n)
            .zip(g.par_chunks(n))
            .zip(y.par_chunks(n))
            .with_min_len(rows_per_task)
            .for_each(row);
    }
    out
}
