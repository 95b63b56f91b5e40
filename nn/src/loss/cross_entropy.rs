//! `cross_entropy`: log-softmax and negative log-likelihood as one autograd node.

use super::Reduction;
use oxtrain_autograd::Var;
use oxtrain_tensor::{CmpOp, DType, Tensor};

/// Options of [`cross_entropy_with`], with PyTorch's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyOptions {
    /// Targets equal to this contribute no loss and no gradient, and are not counted by the
    /// mean.
    pub ignore_index: i64,
    /// In `[0, 1]`: the target distribution is `(1 - s) * one_hot + s / C`.
    pub label_smoothing: f64,
    pub reduction: Reduction,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean }
    }
}

/// Mean cross-entropy of `logits` against int64 class indices `target`
/// (`F.cross_entropy(logits, target)`). See [`cross_entropy_with`].
pub fn cross_entropy(logits: &Var, target: &Tensor) -> Var {
    cross_entropy_with(logits, target, &CrossEntropyOptions::default())
}

/// Cross-entropy of unnormalised `logits` of shape `[N, C]`, `[N, C, d1, ...]` or `[C]`
/// against int64 class indices of shape `[N]`, `[N, d1, ...]` or `[]`, as
/// `F.cross_entropy(logits, target, ignore_index=, label_smoothing=, reduction=)`.
///
/// Computed in f32 (log-softmax of widened logits); the loss has the logits' dtype, or f32 in
/// an autocast region. The mean
/// divides by the number of targets that are not `ignore_index` (NaN when all are ignored, as
/// in PyTorch). The gradient with respect to the logits is `(softmax - q) * scale` with `q`
/// the (smoothed) one-hot target, zero for ignored targets.
pub fn cross_entropy_with(logits: &Var, target: &Tensor, opts: &CrossEntropyOptions) -> Var {
    let op = "cross_entropy";
    let x = logits.tensor();
    assert!(x.dtype().is_float(), "{op}: logits must be floating point, got {}", x.dtype());
    assert!(
        target.dtype() == DType::I64,
        "{op}: target must hold int64 class indices, got {} with shape {:?}",
        target.dtype(),
        target.dims()
    );
    assert!(
        (0.0..=1.0).contains(&opts.label_smoothing),
        "{op}: label_smoothing must be in [0, 1], got {}",
        opts.label_smoothing
    );
    let rank = x.rank();
    assert!(rank >= 1, "{op}: logits must have a class dim, got a scalar");
    let expected_target: Vec<usize> =
        x.dims().iter().enumerate().filter(|&(i, _)| i != rank.min(2) - 1).map(|(_, &d)| d).collect();
    assert!(
        target.dims() == expected_target.as_slice(),
        "{op}: logits of shape {:?} need a target of shape {:?}, got {:?}",
        x.dims(),
        expected_target,
        target.dims()
    );
    let classes = x.dims()[rank.min(2) - 1];
    let rows = target.elem_count();

    // [rows, C] with the class dim last, in the logits' own dtype: the fused kernels widen
    // each element as they read it, so no f32 copy of the logits is made or kept.
    let compute = compute_dtype(x.dtype());
    let moved = if rank > 2 {
        let mut order: Vec<usize> = vec![0];
        order.extend(2..rank);
        order.push(1);
        x.permute(order.as_slice()).contiguous()
    } else {
        x.clone()
    };
    let moved_dims = moved.dims().to_vec();
    let flat = moved.reshape((rows, classes));
    let t = target.reshape(rows);
    let (ignore, s) = (opts.ignore_index, opts.label_smoothing);
    let (per_row, lse) = flat.cross_entropy_rows(&t, ignore, s);
    let valid_f = t.cmp_scalar(ignore as f64, CmpOp::Ne).to_dtype(compute);

    let count = valid_f.sum_all();
    let loss = match opts.reduction {
        Reduction::None => per_row.reshape(target.dims()),
        Reduction::Sum => per_row.sum_all(),
        Reduction::Mean => per_row.sum_all().div(&count),
    };
    // Under autocast the loss is f32, as PyTorch's autocast runs cross_entropy in f32; the
    // logits' gradient still comes back in their own dtype.
    let out_dtype = if oxtrain_autograd::autocast_dtype().is_some() { compute } else { x.dtype() };
    let (reduction, in_dims) = (opts.reduction, x.dims().to_vec());
    Var::from_op(op, loss.to_dtype(out_dtype), &[logits], move |g, _| {
        let g = g.to_dtype(compute);
        // Per-row weight of the gradient: the output gradient, the mean's 1/count (the kernel
        // zeroes ignored rows itself).
        let w = match reduction {
            Reduction::None => g.reshape(rows),
            Reduction::Sum => g.broadcast_as(rows).contiguous(),
            Reduction::Mean => g.div(&count).broadcast_as(rows).contiguous(),
        };
        let grad = flat.cross_entropy_rows_backward(&t, &lse, &w, ignore, s).reshape(moved_dims.as_slice());
        let grad = if rank > 2 {
            // Back from [N, d1.., C] to [N, C, d1..].
            let mut order: Vec<usize> = vec![0, rank - 1];
            order.extend(1..rank - 1);
            grad.permute(order.as_slice())
        } else {
            grad.reshape(in_dims.as_slice())
        };
        vec![Some(grad)]
    })
}

/// The dtype a loss computes in: f64 for f64 inputs (as PyTorch), else f32 (16-bit inputs widen
/// so the log-sum-exp keeps its precision).
pub(crate) fn compute_dtype(input: DType) -> DType {
    if input == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}
