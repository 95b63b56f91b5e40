//! oxtrain: the trainer crate. It re-exports the workspace's crates under one name.

pub use oxtrain_tensor as tensor;
