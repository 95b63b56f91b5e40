//! Cross-entropy for the models' `loss` methods.
//!
//! TODO(issue 6): replace with `oxtrain_nn::loss::cross_entropy` once the optimizer/loss work
//! lands; this local version exists so the models can compute Hugging Face's losses today.

use oxtrain_autograd::Var;
use oxtrain_tensor::{CmpOp, DType, Tensor};

/// Labels equal to this are left out of the loss (`ignore_index=-100`, PyTorch's default and
/// what Hugging Face uses for padding in labels).
pub const IGNORE_INDEX: i64 = -100;

/// Mean cross-entropy of `logits [N, C]` against integer `labels [N]`, over the labels that
/// are not [`IGNORE_INDEX`] (`F.cross_entropy(logits, labels)`). NaN when every label is
/// ignored, as in PyTorch.
pub fn cross_entropy(logits: &Var, labels: &Tensor) -> Var {
    assert!(
        logits.rank() == 2 && labels.rank() == 1 && labels.dims()[0] == logits.dims()[0],
        "cross_entropy: expected logits [N, C] and labels [N], got {:?} and {:?}",
        logits.dims(),
        labels.dims()
    );
    let labels = labels.to_dtype(DType::I64);
    let keep = labels.cmp_scalar(IGNORE_INDEX as f64, CmpOp::Ne);
    // Ignored positions gather class 0 and are then zeroed, so any label value is safe there.
    let safe = labels.masked_fill(&labels.cmp_scalar(IGNORE_INDEX as f64, CmpOp::Eq), 0.0);
    let picked = logits.log_softmax(1).gather(1, &safe.unsqueeze(1)).squeeze(1);
    let weight = keep.to_dtype(logits.dtype());
    let count = weight.sum_all().item();
    picked.mul(&Var::constant(weight)).sum_all().mul_scalar(-1.0 / count)
}
