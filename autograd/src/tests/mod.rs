//! Tests: every op's gradient against finite differences (`gradcheck`), and the engine's
//! contracts (hooks, retain_graph, no_grad, freeing, deep graphs).

mod autocast;
mod callbacks;
mod elementwise;
mod engine;
mod index;
mod layer_norm;
mod linear;
mod matmul;
mod multi_output;
mod nn;
mod reduce;
mod shape;

use crate::{gradcheck, Var};
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};

/// Standard normal f64 samples, reproducible per `seed`.
pub(crate) fn randn(shape: &[usize], seed: u64, dev: Device) -> Tensor {
    Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(seed), shape, DType::F64, dev).unwrap()
}

/// Samples in [0.5, 2.5): inside the domain of log, sqrt, reciprocal, ...
pub(crate) fn positive(shape: &[usize], seed: u64, dev: Device) -> Tensor {
    Distribution::Uniform { low: 0.5, high: 2.5 }
        .sample_with(&mut Generator::new(seed), shape, DType::F64, dev)
        .unwrap()
}

/// Gradcheck with the tolerances every f64 op here meets; panics naming `what`.
#[track_caller]
pub(crate) fn check(what: &str, f: impl Fn(&[Var]) -> Var, inputs: &[Tensor]) {
    if let Err(e) = gradcheck(f, inputs, 1e-6, 1e-6) {
        panic!("{what}: {e}");
    }
}
