//! oxtrain-nn: layers, losses, optimizers, learning-rate schedules and mixed-precision helpers.
#![doc = include_str!("../README.md")]

pub mod amp;
pub mod loss;
pub mod lr_scheduler;
pub mod optim;
