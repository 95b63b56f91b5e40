//! oxtrain: the front door. One dependency brings every crate of the workspace
//! (`oxtrain::{tensor, autograd, nn, comm, models, datasets}`), [`prelude`] brings what a
//! training script uses, and [`Error`] lets `?` cross every crate's error.
//!
//! A ResNet-50 training step (torchvision's architecture, here on a batch of two 32x32
//! images on the CPU):
//!
//! ```
//! use oxtrain::prelude::*;
//!
//! let model = ResNet::new(&ResNetConfig::resnet50(), Device::Cpu)?;
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
//! let images = Tensor::randn([2, 3, 32, 32], DType::F32, Device::Cpu)?;
//! let labels = Tensor::randint(0, 1000, [2], Device::Cpu)?;
//! let loss = cross_entropy(&model.forward(&images), &labels);
//! opt.zero_grad();
//! loss.backward();
//! opt.step();
//! # assert!(loss.tensor().item().is_finite());
//! # Ok::<(), oxtrain::Error>(())
//! ```
//!
//! Each crate keeps its own typed error for programs that use it alone; [`Error`] wraps them
//! all, so a script's `main` can return `Result<(), oxtrain::Error>`.

pub mod builtin;
pub mod checkpoint;
pub mod config;
mod error;
pub mod eval;
pub mod launch;
pub mod merge_lora;
pub mod metrics;
pub mod prelude;
pub mod runtime;
pub mod tasks;
pub mod tokenize;
pub mod trainer;

pub use error::{Error, Result};

pub use oxtrain_autograd as autograd;
pub use oxtrain_comm as comm;
pub use oxtrain_datasets as datasets;
pub use oxtrain_models as models;
pub use oxtrain_nn as nn;
pub use oxtrain_tensor as tensor;

/// The root README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
