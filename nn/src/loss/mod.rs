//! Loss functions with PyTorch's semantics (`torch.nn.functional`): `cross_entropy`,
//! `mse_loss`, `binary_cross_entropy_with_logits`.
//!
//! The classification losses compute in f32 whatever the input dtype (bf16/f16 logits are
//! widened before the log-softmax, as autocast does in PyTorch), return the loss in the input's
//! dtype, and are single autograd nodes with a closed-form backward
//! (`softmax - target distribution` for cross-entropy) instead of a chain of small ops.

mod bce;
mod cross_entropy;
mod mse;
#[cfg(test)]
mod tests;

pub use bce::{
    binary_cross_entropy_with_logits, binary_cross_entropy_with_logits_with, BceWithLogitsOptions,
};
pub use cross_entropy::{cross_entropy, cross_entropy_with, CrossEntropyOptions};
pub use mse::mse_loss;

/// How per-element losses are combined (`reduction=` in PyTorch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean (for cross-entropy: over the targets that are not ignored).
    #[default]
    Mean,
    Sum,
    /// No reduction: one loss per element (per target for cross-entropy).
    None,
}
