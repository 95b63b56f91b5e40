//! Tensor operations, one folder per family. Each folder holds the family's public API (methods
//! on [`Tensor`](crate::Tensor)), its CPU kernels and its tests; the CUDA backend adds a kernel
//! source and a dispatch arm beside them.

pub mod attention;
pub mod binary;
pub mod conv;
pub mod convert;
pub mod creation;
pub mod image;
pub mod index;
pub mod inplace;
pub mod join;
pub mod matmul;
pub mod ndarray_interop;
pub mod norm;
pub mod optim;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod softmax;
pub mod transfer;
pub mod unary;
pub mod view;
