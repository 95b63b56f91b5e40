//! Gradient of fused attention (`Tensor::flash_attention`, kernels in the tensor crate's
//! `ops/attention`): the backward recomputes the probabilities from the saved log-sum-exp, so
//! no `[L, S]` matrix is kept between forward and backward.

use crate::Var;
use oxtrain_tensor::FlashAttention;

impl Var {
    /// `softmax(q k^T * scale + mask) v` for `self` = q `[B, H, L, D]`, k and v `[B, H, S, D]`,
    /// as one op (see [`oxtrain_tensor::Tensor::flash_attention`]). Under autocast the inputs
    /// run in the low-precision dtype, as PyTorch's attention does.
    pub fn flash_attention(&self, k: &Var, v: &Var, opts: &FlashAttention) -> Var {
        if crate::autocast_dtype().is_some() {
            let (q, k, v) = (self.autocast_lower(), k.autocast_lower(), v.autocast_lower());
            return crate::autocast_disabled(|| q.flash_attention(&k, &v, opts));
        }
        let (q_t, k_t, v_t) = (self.tensor().clone(), k.tensor().clone(), v.tensor().clone());
        let (out, lse) = q_t.flash_attention(&k_t, &v_t, opts);
        let saved_out = out.clone();
        let opts = opts.clone();
        Var::from_op("flash_attention", out, &[self, k, v], move |g, needs| {
            let (dq, dk, dv) = g.flash_attention_backward((&q_t, &k_t, &v_t), (&saved_out, &lse), &opts);
            vec![needs[0].then_some(dq), needs[1].then_some(dk), needs[2].then_some(dv)]
        })
    }
}
