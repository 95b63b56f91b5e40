//! oxtrain-tensor: strided n-dimensional tensors, the numeric core of oxtrain.
//!
//! A [`Tensor`] is an `Arc` to its [`Storage`] plus a [`Layout`] (shape, strides, offset), a
//! [`DType`] and a [`Device`]. Views share storage; `contiguous()` copies only when it must.
//! Ops live in `ops/`, one folder per family, each dispatching on the storage's backend.
//!
//! Errors: mistakes in tensor math (shapes that do not broadcast, a dtype an op cannot take)
//! panic with a message naming the op and the shapes, as PyTorch raises; anything that touches
//! the outside world (files, devices, memory) returns [`Result`].
#![doc = include_str!("../README.md")]

pub use half;

#[macro_use]
mod storage;
mod cell;
mod cpu_memory;
pub mod cuda;
mod device;
mod dtype;
mod error;
mod huge_pages;
mod layout;
mod memory_order;
pub mod ops;
pub mod safetensors;
mod shape;
pub mod strided;
mod tensor;
#[doc(hidden)]
pub mod testing;
mod vmath;

pub use cpu_memory::{cpu_memory_stats, reset_cpu_peak, CpuMemoryStats};
pub use device::Device;
pub use dtype::{DType, Element, FloatElement};
pub use error::{Error, Result};
pub use layout::Layout;
pub use ops::attention::FlashAttention;
pub use ops::binary::{BinaryOp, CmpOp};
pub use ops::norm::{BatchNormFactors, LayerNormGradOptions, LayerNormGrads, ReluMask};
pub use ops::optim::{AdamWParam, AdamWStep, MultiTensorStep, SgdParam, SgdStep};
pub use ops::random::{
    default_generator_state, manual_seed, set_default_generator_state, Distribution, Generator,
    GeneratorState,
};
pub use ops::reduce::ReduceOp;
pub use ops::softmax::SoftmaxOp;
pub use ops::unary::UnaryOp;
pub use ops::view::ShapeArg;
pub use shape::{broadcast_shapes, Dim, Dims, Shape};
pub use storage::{CpuStorage, Storage};
pub use tensor::{host_reads, Tensor, TensorData};
