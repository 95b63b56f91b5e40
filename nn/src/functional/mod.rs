//! Stateless forms of the layers (`torch.nn.functional`): functions of `Var`s that modules call
//! and that model code can call directly.

use oxtrain_autograd::Var;
use oxtrain_tensor::{CmpOp, DType, Device, FlashAttention, Tensor};

/// `x W^T + b` over the last dim of `x` (`F.linear`); `weight` is `[out, in]`.
pub fn linear(x: &Var, weight: &Var, bias: Option<&Var>) -> Var {
    assert!(
        weight.rank() == 2 && x.rank() >= 1 && x.dims()[x.rank() - 1] == weight.dims()[1],
        "linear: input of shape {:?} does not fit a weight of shape {:?} ([out_features, in_features])",
        x.dims(),
        weight.dims()
    );
    match bias {
        // One op: on CUDA the bias is added in the product's epilogue and its gradient comes
        // with the weight's. Under autocast the bias joins the product's 16-bit dtype, as in
        // PyTorch's linear.
        Some(b) => x.matmul_bias(&weight.t(), b),
        None => x.matmul(&weight.t()),
    }
}

/// In training, zeroes each element with probability `p` and scales the others by
/// `1 / (1 - p)` (`F.dropout`); otherwise returns `x`. The mask comes from the process-wide
/// generator, so `oxtrain_tensor::manual_seed` makes it reproducible.
pub fn dropout(x: &Var, p: f64, training: bool) -> Var {
    assert!((0.0..=1.0).contains(&p), "dropout: p must be a probability in [0, 1], got {p}");
    if !training || p == 0.0 {
        return x.clone();
    }
    if p == 1.0 {
        return x.mul_scalar(0.0);
    }
    let keep = Tensor::bernoulli_scalar(x.dims(), 1.0 - p, x.dtype(), x.device())
        .expect("a dropout mask on the input's own device");
    x.mul(&Var::constant(keep.mul_scalar(1.0 / (1.0 - p))))
}

/// The `[l, s]` bool mask of positions a causal attention must NOT see: key `j` after query
/// `i` (`j > i`), i.e. the complement of `torch.ones(l, s).tril()`.
pub fn causal_mask(l: usize, s: usize, device: Device) -> Tensor {
    let index = |n: usize| {
        Tensor::arange(0.0, n as f64, 1.0, DType::I64, device).expect("indices on the attention's own device")
    };
    index(s).unsqueeze(0).gt(&index(l).unsqueeze(1))
}

/// An additive float mask from PyTorch's two kinds: a bool mask (where `true_means_masked`
/// tells which value hides a position) becomes 0 / -inf, a float mask is taken as it is.
pub(crate) fn additive_mask(mask: &Tensor, true_means_masked: bool, dtype: DType) -> Tensor {
    if mask.dtype() == DType::Bool {
        let masked = if true_means_masked { mask.clone() } else { mask.cmp_scalar(0.0, CmpOp::Eq) };
        Tensor::zeros(mask.dims(), dtype, mask.device())
            .expect("a mask on its own device")
            .masked_fill(&masked, f64::NEG_INFINITY)
    } else {
        assert!(
            mask.dtype().is_float(),
            "attention: a mask must be bool or floating-point, got {}",
            mask.dtype()
        );
        mask.to_dtype(dtype)
    }
}

/// `softmax(q k^T * scale + mask) v` over the last two dims (`F.scaled_dot_product_attention`),
/// with `q` `[..., l, e]`, `k` `[..., s, e]`, `v` `[..., s, ev]` and `scale = 1 / sqrt(e)`.
///
/// `attn_mask` broadcasts to `[..., l, s]`: a bool mask is **true where attention is allowed**
/// (PyTorch's convention here, the opposite of `nn.MultiheadAttention`'s), a float mask is
/// added to the scores. `is_causal` lets query `i` see keys `0..=i` and excludes `attn_mask`.
/// A query that may see no key gets NaN, as in PyTorch.
pub fn scaled_dot_product_attention(
    q: &Var,
    k: &Var,
    v: &Var,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
) -> Var {
    scaled_dot_product_attention_with(q, k, v, attn_mask, 0.0, is_causal, None)
}

/// [`scaled_dot_product_attention`] with dropout on the attention weights (`dropout_p`,
/// applied whenever it is non-zero, as PyTorch's function does) and an explicit `scale`.
pub fn scaled_dot_product_attention_with(
    q: &Var,
    k: &Var,
    v: &Var,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Var {
    let (r, e) = (q.rank(), q.dims()[q.rank() - 1]);
    assert!(
        r >= 2 && k.rank() == r && v.rank() == r && k.dims()[r - 1] == e && k.dims()[r - 2] == v.dims()[r - 2],
        "scaled_dot_product_attention: expected q [..., L, E], k [..., S, E], v [..., S, Ev], got {:?}, {:?}, {:?}",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert!(
        !(is_causal && attn_mask.is_some()),
        "scaled_dot_product_attention: pass either attn_mask or is_causal, not both (merge them into one mask)"
    );
    let (l, s) = (q.dims()[r - 2], k.dims()[r - 2]);
    // Fused attention where the kernels take it: no [L, S] scores in memory, forward or backward.
    let dtype = match oxtrain_autograd::autocast_dtype() {
        Some(low) if q.dtype() == DType::F32 => low,
        _ => q.dtype(),
    };
    let fused = r == 4
        && attn_mask.is_none()
        && dropout_p == 0.0
        && v.dims()[r - 1] == e
        && q.dtype() == k.dtype()
        && k.dtype() == v.dtype()
        && FlashAttention::is_fused(q.device(), dtype, e);
    if fused {
        return q.flash_attention(k, v, &FlashAttention { scale, causal: is_causal, key_lengths: None });
    }
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut scores = q.matmul(&k.transpose(-2, -1)).mul_scalar(scale);
    if is_causal {
        scores = scores.masked_fill(&causal_mask(l, s, q.device()), f64::NEG_INFINITY);
    }
    if let Some(mask) = attn_mask {
        scores = scores.add(&Var::constant(additive_mask(mask, false, scores.dtype())));
    }
    let weights = dropout(&scores.softmax(-1), dropout_p, true);
    weights.matmul(v)
}
