//! oxtrain-nn: neural-network modules on `oxtrain_autograd::Var`, with PyTorch's names.
#![doc = include_str!("../README.md")]

pub mod functional;
pub mod init;
mod layers;
mod module;

pub use layers::*;
pub use module::{
    Buffer, Forward, LoadError, LoadReport, Module, Parameter, ShapeMismatch, TrainingFlag, Visitor,
};
