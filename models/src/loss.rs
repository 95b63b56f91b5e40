//! The models' losses: `oxtrain_nn::loss::cross_entropy` with Hugging Face's conventions.

use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Tensor};

/// Labels equal to this are left out of the loss (`ignore_index=-100`, PyTorch's default and
/// what Hugging Face uses for padding in labels).
pub const IGNORE_INDEX: i64 = -100;

/// Mean cross-entropy of `logits [N, C]` against integer `labels [N]`, over the labels that
/// are not [`IGNORE_INDEX`] (`F.cross_entropy(logits, labels)`). NaN when every label is
/// ignored, as in PyTorch.
pub fn cross_entropy(logits: &Var, labels: &Tensor) -> Var {
    let options = oxtrain_nn::loss::CrossEntropyOptions { ignore_index: IGNORE_INDEX, ..Default::default() };
    oxtrain_nn::loss::cross_entropy_with(logits, &labels.to_dtype(DType::I64), &options)
}
