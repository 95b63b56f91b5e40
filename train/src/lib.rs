//! oxtrain: the trainer crate. It re-exports the workspace's crates under one name and holds
//! the built-in example that `oxtrain train` runs.

pub mod builtin;
pub mod config;
pub mod eval;
pub mod launch;
pub mod metrics;
pub mod tasks;
pub mod trainer;

pub use oxtrain_autograd as autograd;
pub use oxtrain_nn as nn;
pub use oxtrain_tensor as tensor;
