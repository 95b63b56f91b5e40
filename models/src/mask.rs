//! Attention masks as Hugging Face's eager attention builds them: an additive float mask that
//! holds the dtype's most negative value where attention is not allowed.
//!
//! The most negative finite value (not -inf) keeps a row whose every key is masked finite:
//! softmax then spreads it evenly instead of producing NaN, as in `transformers`.

use oxtrain_tensor::{CmpOp, DType, Tensor};

/// The value added to masked scores: the dtype's lowest finite value (`torch.finfo(dtype).min`).
pub(crate) fn min_value(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MIN,
        DType::F16 => -65504.0,
        DType::BF16 => -3.3895313892515355e38,
        _ => f32::MIN as f64,
    }
}

/// `[B, 1, L, S]` (or `[1, 1, L, S]` without padding): `min` where a key is padding
/// (`attention_mask == 0`, mask `[B, S]` of 1s and 0s) or, when `causal`, lies after the query.
pub(crate) fn additive_mask(
    attention_mask: Option<&Tensor>,
    causal: bool,
    [l, s]: [usize; 2],
    dtype: DType,
    op: &str,
) -> Option<Tensor> {
    let mut blocked: Option<Tensor> = None; // float 0/1, 1 = blocked; broadcast sums then > 0
    if causal {
        let device = attention_mask.map_or(oxtrain_tensor::Device::Cpu, Tensor::device);
        let c = oxtrain_nn::functional::causal_mask(l, s, device).to_dtype(dtype);
        blocked = Some(c.reshape([1, 1, l, s]));
    }
    if let Some(m) = attention_mask {
        assert!(
            m.rank() == 2 && m.dims()[1] == s,
            "{op}: attention_mask must be [batch, {s}] of 1 (attend) and 0 (padding), got shape {:?}",
            m.dims()
        );
        let b = m.dims()[0];
        let pad = m.cmp_scalar(0.0, CmpOp::Eq).to_dtype(dtype).reshape([b, 1, 1, s]);
        blocked = Some(match blocked {
            Some(c) => c.add(&pad),
            None => pad,
        });
    }
    blocked.map(|b| b.cmp_scalar(0.0, CmpOp::Gt).to_dtype(dtype).mul_scalar(min_value(dtype)))
}
