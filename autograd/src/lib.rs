//! oxtrain-autograd: reverse-mode automatic differentiation over oxtrain tensors.
//!
//! [`Var`] wraps a [`Tensor`](oxtrain_tensor::Tensor) and records the ops applied to it;
//! [`Var::backward`] walks the recorded graph in reverse topological order without recursion,
//! accumulates gradients into parameters, fires their gradient-ready hooks the moment each is
//! final, and frees saved tensors as it goes. The ops only call `Tensor` methods, so the same
//! code runs on every device the tensor crate supports.
#![doc = include_str!("../README.md")]

mod autocast;
mod callback;
mod checkpoint;
mod convert;
mod gradcheck;
mod graph;
mod ops;
mod var;

pub use autocast::{autocast, autocast_disabled, autocast_dtype};
pub use callback::{in_backward, queue_callback, BackwardError};
pub use checkpoint::{checkpoint, checkpoint_many, is_recomputing};
pub use gradcheck::{gradcheck, GradcheckError};
pub use graph::sum_to_shape;
pub use ops::profile;
pub use var::{is_grad_enabled, no_grad, HookHandle, Var};

#[cfg(test)]
mod tests;
