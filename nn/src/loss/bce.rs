//! `binary_cross_entropy_with_logits`: sigmoid and binary cross-entropy in one stable node.

use super::Reduction;
use oxtrain_autograd::Var;
use oxtrain_tensor::Tensor;

/// Options of [`binary_cross_entropy_with_logits_with`], PyTorch's defaults.
#[derive(Debug, Clone, Default)]
pub struct BceWithLogitsOptions {
    /// A weight per element, broadcast to the input's shape.
    pub weight: Option<Tensor>,
    /// A weight for the positive term, broadcast along the last dim (one per class).
    pub pos_weight: Option<Tensor>,
    pub reduction: Reduction,
}

/// `F.binary_cross_entropy_with_logits(input, target)`, mean-reduced.
pub fn binary_cross_entropy_with_logits(input: &Var, target: &Tensor) -> Var {
    binary_cross_entropy_with_logits_with(input, target, &BceWithLogitsOptions::default())
}

/// `-w [p y log σ(x) + (1 - y) log(1 - σ(x))]` per element, computed in f32 as
/// `(1 - y) x + (1 + (p - 1) y) softplus(-x)` with a softplus that cannot overflow, then
/// reduced. `target` holds probabilities in `[0, 1]` of the input's shape.
pub fn binary_cross_entropy_with_logits_with(
    input: &Var,
    target: &Tensor,
    opts: &BceWithLogitsOptions,
) -> Var {
    let op = "binary_cross_entropy_with_logits";
    let x = input.tensor();
    assert!(x.dtype().is_float(), "{op}: input must be floating point, got {}", x.dtype());
    assert!(
        target.dims() == x.dims(),
        "{op}: target of shape {:?} for an input of shape {:?}; they must match",
        target.dims(),
        x.dims()
    );
    let compute = super::cross_entropy::compute_dtype(x.dtype());
    let wide = |t: &Tensor| t.to_dtype(compute);
    let (xf, y) = (wide(x), wide(target));
    // softplus(-x) = log(1 + e^-x) = log1p(e^-|x|) + max(-x, 0)
    let softplus_neg = xf.abs().neg().exp().log1p().add(&xf.neg().relu());
    let log_weight = opts.pos_weight.as_ref().map(|p| wide(p).add_scalar(-1.0).mul(&y).add_scalar(1.0));
    let one_minus_y = y.affine(-1.0, 1.0);
    let mut loss = one_minus_y.mul(&xf);
    loss = match &log_weight {
        Some(lw) => loss.add(&lw.mul(&softplus_neg)),
        None => loss.add(&softplus_neg),
    };
    let weight = opts.weight.as_ref().map(wide);
    if let Some(w) = &weight {
        loss = loss.mul(w);
    }
    let n = x.elem_count();
    let reduction = opts.reduction;
    let reduced = match reduction {
        Reduction::Mean => loss.mean_all(),
        Reduction::Sum => loss.sum_all(),
        Reduction::None => loss,
    };
    let out_dtype = x.dtype();
    let dims = x.dims().to_vec();
    Var::from_op(op, reduced.to_dtype(out_dtype), &[input], move |g, _| {
        // d/dx = (1 - y) - lw * σ(-x)
        let sig_neg = xf.neg().sigmoid();
        let pulled = match &log_weight {
            Some(lw) => lw.mul(&sig_neg),
            None => sig_neg,
        };
        let mut grad = one_minus_y.sub(&pulled);
        if let Some(w) = &weight {
            grad = grad.mul(w);
        }
        let g = g.to_dtype(compute);
        let g = if reduction == Reduction::Mean { g.mul_scalar(1.0 / n as f64) } else { g };
        vec![Some(grad.mul(&g).broadcast_as(dims.as_slice()).to_dtype(out_dtype))]
    })
}
