//! Errors for everything that touches the world outside tensor math: files, devices, memory.
//!
//! Mistakes in tensor math itself (shapes that do not broadcast, a dtype an op cannot take)
//! panic with a message naming the op and the shapes, as PyTorch and ndarray do.

use crate::{DType, Device};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CUDA device {ordinal} is not available: {reason}")]
    CudaUnavailable { ordinal: usize, reason: String },

    #[error(
        "CUDA out of memory on cuda:{ordinal}: tried to allocate {requested} bytes with {allocated} bytes \
         allocated to tensors and {reserved} reserved in total ({reason}); free tensors you no longer \
         need, lower the batch size, or call empty_cache()"
    )]
    CudaOutOfMemory { ordinal: usize, requested: usize, allocated: usize, reserved: usize, reason: String },

    #[error("{op}: tensors are on different devices ({lhs} and {rhs}); move one with .to_device()")]
    DeviceMismatch { op: &'static str, lhs: Device, rhs: Device },

    #[error("cannot build a tensor of shape {shape:?} ({expected} elements) from {got} elements")]
    ElementCount { shape: Vec<usize>, expected: usize, got: usize },

    #[error("expected dtype {expected}, the tensor has {got}")]
    DTypeMismatch { expected: DType, got: DType },

    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("{path}: not a valid safetensors file: {reason}")]
    SafetensorsFormat { path: PathBuf, reason: String },

    #[error("{path}: tensor `{name}`: {reason}")]
    SafetensorsTensor { path: PathBuf, name: String, reason: String },

    /// A save that failed part-way; it wrote to a temporary file, so whatever was at `path`
    /// before is still there, unchanged.
    #[error("{path}: could not save ({stage}: {source}); any previous file at this path is unchanged - check that the folder exists, is writable and has free space")]
    SaveFailed { path: PathBuf, stage: &'static str, source: std::io::Error },

    #[error("{0}")]
    Msg(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
