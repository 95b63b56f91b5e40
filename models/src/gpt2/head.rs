//! The tied LM head on a padded vocabulary. GPT-2's 50257 rows are an odd N for the head's
//! three products: cuBLAS then loses its aligned kernels (on the H200 each product took six
//! times as long as at 50304). Here the weight, in the product's dtype, is copied once per
//! step into a buffer with zero rows up to a multiple of `multiple` (the copy of a weight that
//! autocast has already lowered, no cast), the logits are the first `vocab` columns of the
//! padded product (a view), and the backward runs both products over the padded rows: the
//! gradient of the logits keeps their row stride (the cross-entropy writes it so, with zeros in
//! the pad columns), so nothing is copied to pad it.

use crate::linear_cross_entropy::{padded_rows, padded_weight};
use oxtrain_autograd::Var;

/// `hidden [.., E] @ w^T` for `w [V, E]`, through `w` padded to `V.next_multiple_of(multiple)`
/// rows: the plain product's values and gradients.
pub(super) fn padded_head_logits(hidden: &Var, w: &Var, multiple: usize) -> Var {
    if oxtrain_autograd::autocast_dtype().is_some() {
        let (h, w) = (hidden.autocast_lower(), w.autocast_lower());
        return oxtrain_autograd::autocast_disabled(|| padded_head_logits(&h, &w, multiple));
    }
    let (vocab, embd) = (w.dims()[0], w.dims()[1]);
    let padded = vocab.next_multiple_of(multiple);
    if padded == vocab || hidden.dtype() != w.dtype() || hidden.dims().last() != Some(&embd) {
        return hidden.matmul(&w.t());
    }
    let rows = hidden.elem_count() / embd.max(1);
    let h2 = hidden.tensor().reshape([rows, embd]);
    let wp = padded_weight(w.tensor(), padded);
    let mut dims = hidden.dims().to_vec();
    *dims.last_mut().expect("checked to have an embedding dim") = vocab;
    let hidden_dims = hidden.dims().to_vec();
    let logits = h2.matmul(&wp.t()).narrow(1, 0, vocab).reshape(dims);
    Var::from_op("lm_head_padded", logits, &[hidden, w], move |g, needs| {
        let g = padded_rows(g, rows, vocab, padded);
        let dh = needs[0].then(|| g.matmul(&wp).reshape(hidden_dims.as_slice()));
        // [padded, E], of which the first `vocab` rows (a contiguous prefix) are w's.
        let dw = needs[1].then(|| g.t().matmul(&h2).narrow(0, 0, vocab));
        vec![dh, dw]
    })
}
