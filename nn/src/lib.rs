//! oxtrain-nn: neural-network modules on `oxtrain_autograd::Var` with PyTorch's names, losses,
//! optimizers, learning-rate schedules and mixed-precision helpers.
#![doc = include_str!("../README.md")]

pub mod amp;
pub mod functional;
pub mod init;
mod layers;
pub mod lora;
pub mod loss;
pub mod lr_scheduler;
mod module;
pub mod optim;

pub use layers::*;
pub use module::{
    freeze_matching, parameter_gates, set_requires_grad, Buffer, Forward, FreezeError, LoadError, LoadReport,
    Module, Parameter, PendingValue, ShapeMismatch, TrainingFlag, ValueGate, Visitor,
};
