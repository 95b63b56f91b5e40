//! Gradients of the fused linear products (the tensor crate's `matmul/fused.rs`): `x @ w + b`
//! as one op, and GPT-2's MLP `gelu_tanh(x @ w_fc + b_fc) @ w_proj + b_proj` as one op, so that
//! its backward can put GELU's derivative and both bias gradients into the epilogues of the
//! products it runs anyway. Values and gradients are those of the composed ops (matmul, add,
//! gelu_tanh) to the dtype's rounding.

use crate::Var;
use oxtrain_tensor::Tensor;

/// Whether `x [.., k] @ w [k, n] + b [n]` fits, all three of one dtype.
fn fits_linear(x: &Var, w: &Var, b: &Var) -> bool {
    let (dt, wd) = (x.dtype(), w.dims());
    x.rank() >= 1
        && w.rank() == 2
        && x.dims()[x.rank() - 1] == wd[0]
        && b.dims() == [wd[1]]
        && w.dtype() == dt
        && b.dtype() == dt
}

/// The gradients of a linear layer's weight `w [k, n]` and bias from its input `x [.., k]` and
/// output gradient `g [.., n]`, each only when needed. Together they are one product (the bias
/// gradient in its epilogue on CUDA). A weight used transposed (stored `[out, in]`, as
/// `nn.Linear`'s) gets its gradient in its own layout, `(g^T x)^T`, as `Var::matmul` gives it.
fn weight_and_bias_grads(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    (need_w, need_b): (bool, bool),
) -> (Option<Tensor>, Option<Tensor>) {
    let (k, n) = (w.dims()[0], w.dims()[1]);
    let rows: usize = x.dims()[..x.rank() - 1].iter().product();
    let (x2, g2) = (x.reshape([rows, k]), g.reshape([rows, n]));
    let transposed = w.strides()[0] == 1 && w.strides()[1] != 1 && k > 1;
    match (need_w, need_b) {
        (true, true) if transposed => {
            let (gwt, gb) = g2.t().matmul_and_lhs_row_sums(&x2);
            (Some(gwt.t()), Some(gb))
        }
        (true, true) => {
            let (gw, gb) = x2.t().matmul_and_rhs_col_sums(&g2);
            (Some(gw), Some(gb))
        }
        (true, false) if transposed => (Some(g2.t().matmul(&x2).t()), None),
        (true, false) => (Some(x2.t().matmul(&g2)), None),
        (false, true) => (None, Some(g2.sum(0, false))),
        (false, false) => (None, None),
    }
}

impl Var {
    /// `self @ weight + bias` as one op (`self [.., k]`, `weight [k, n]`, `bias [n]`): the
    /// values and gradients of `self.matmul(weight).add(bias)`, with the bias added in the
    /// product's epilogue on CUDA and its gradient from the weight gradient's product. Under
    /// autocast all three run in the 16-bit dtype, the bias too (as `torch.addmm`). Shapes or
    /// dtypes that do not fit go to the composed ops.
    pub fn matmul_bias(&self, weight: &Var, bias: &Var) -> Var {
        if crate::autocast_dtype().is_some() {
            let (x, w, b) = (self.autocast_lower(), weight.autocast_lower(), bias.autocast_lower());
            return crate::autocast_disabled(|| x.matmul_bias(&w, &b));
        }
        if !fits_linear(self, weight, bias) {
            return self.matmul(weight).add(bias);
        }
        let (x, w) = (self.tensor().clone(), weight.tensor().clone());
        let out = x.matmul_bias(&w, bias.tensor());
        Var::from_op("matmul_bias", out, &[self, weight, bias], move |g, needs| {
            let (gw, gb) = weight_and_bias_grads(&x, &w, g, (needs[1], needs[2]));
            vec![needs[0].then(|| g.matmul(&w.t())), gw, gb]
        })
    }

    /// GPT-2's MLP without its dropout, `gelu_tanh(self @ w_fc + b_fc) @ w_proj + b_proj`, as
    /// one op (`self [.., e]`, `w_fc [e, h]`, `b_fc [h]`, `w_proj [h, n]`, `b_proj [n]`): the
    /// values and gradients of the composition. On CUDA the first product writes the GELU and
    /// keeps its input, the second adds its bias; backward, the input gradient of the second
    /// product applies GELU's derivative and sums `b_fc`'s gradient in its epilogue, and each
    /// weight gradient brings its bias gradient. Under autocast everything runs in the 16-bit
    /// dtype. Shapes or dtypes that do not fit go to the composed ops.
    pub fn gelu_tanh_mlp(&self, w_fc: &Var, b_fc: &Var, w_proj: &Var, b_proj: &Var) -> Var {
        if crate::autocast_dtype().is_some() {
            let [x, w1, b1, w2, b2] = [self, w_fc, b_fc, w_proj, b_proj].map(Var::autocast_lower);
            return crate::autocast_disabled(|| x.gelu_tanh_mlp(&w1, &b1, &w2, &b2));
        }
        let (dt, wp) = (self.dtype(), w_proj.dims());
        let proj_fits = wp.len() == 2
            && w_fc.dims().get(1) == Some(&wp[0])
            && b_proj.dims() == [wp[1]]
            && (w_proj.dtype(), b_proj.dtype()) == (dt, dt);
        if !fits_linear(self, w_fc, b_fc) || !proj_fits {
            return self.matmul_bias(w_fc, b_fc).gelu_tanh().matmul_bias(w_proj, b_proj);
        }
        let (x, w1, w2) = (self.tensor().clone(), w_fc.tensor().clone(), w_proj.tensor().clone());
        let (hidden, pre) = x.matmul_bias_gelu_tanh(&w1, b_fc.tensor());
        let out = hidden.matmul_bias(&w2, b_proj.tensor());
        Var::from_op("gelu_tanh_mlp", out, &[self, w_fc, b_fc, w_proj, b_proj], move |g, needs| {
            let (gw2, gb2) = weight_and_bias_grads(&hidden, &w2, g, (needs[3], needs[4]));
            if !(needs[0] || needs[1] || needs[2]) {
                return vec![None, None, None, gw2, gb2];
            }
            // The gradient at GELU's input, and b_fc's gradient with it.
            let (dpre, gb1) = g.matmul_gelu_tanh_backward(&w2.t(), &pre);
            let (gw1, _) = weight_and_bias_grads(&x, &w1, &dpre, (needs[1], false));
            vec![needs[0].then(|| dpre.matmul(&w1.t())), gw1, needs[2].then_some(gb1), gw2, gb2]
        })
    }
}
