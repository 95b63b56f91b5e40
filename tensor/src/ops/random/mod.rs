//! Random tensors from a seeded, counter-based generator (Philox4x32-10), as `torch.rand`,
//! `torch.randn`, `torch.bernoulli`, `torch.randint` and `torch.randperm`.
//!
//! Plain functions draw from the process-wide default generator ([`manual_seed`] seeds it);
//! the `_with` variants (and [`Distribution::sample_with`]) draw from a [`Generator`] of your own.
//!
//! # The stream, exactly
//!
//! So that another backend (CUDA) can reproduce these numbers bit for bit where the maths
//! allows: block `b` of a generator with seed `s` is `philox4x32_10([b_lo, b_hi, 0, 0], [s_lo, s_hi])`.
//! A draw of `n` elements that takes `k` elements per block uses blocks `offset .. offset +
//! ceil(n / k)` and then advances the generator's offset past them; element `i` comes from
//! block `offset + i / k`, words counted from 0:
//! - uniform f32 / f16 / bf16 (`k = 4`): word `i % 4`, its top 24 / 11 / 8 bits scaled to [0, 1);
//!   `uniform(low, high)` is `low + (high - low) * u` in f64, rounded once to the dtype.
//! - uniform f64 (`k = 2`): words `2j, 2j + 1` (low, high) with `j = i % 2`, top 53 bits.
//! - normal f32 / f16 / bf16 (`k = 4`): Box-Muller in f32 on words (0, 1) for elements 0 and 1
//!   of the block and on (2, 3) for 2 and 3: `u1 = 1 - U(w_a)`, `u2 = U(w_b)`,
//!   `r = sqrt(-2 ln u1)`, giving `r cos(2 pi u2)` then `r sin(2 pi u2)`.
//! - normal f64 (`k = 2`): the same in f64 with `u1` from words (0, 1) and `u2` from (2, 3).
//! - bernoulli (`k = 4`): `word * 2^-32 < p`.
//! - randint (`k = 2`): the 64-bit value of words `2j, 2j + 1` modulo `high - low`, plus `low`.
//! - randperm (`k = 2`): each index gets the 64-bit key of randint; indices sorted by key.
//!
//! # On CUDA
//!
//! `random.cu` computes the same Philox blocks with the same element-to-block mapping, and the
//! generator's offset advances exactly as for a CPU draw, so a draw on either device leaves the
//! generator in the same state. Uniform, bernoulli and randint values are bit-identical to the
//! CPU's. Normals differ in the last bit or so: Box-Muller's log, sin and cos come from `libm` on
//! the CPU and from CUDA's maths library on the GPU (agreement to about 1e-6 relative for
//! f32/f16/bf16, 1e-15 for f64). randperm is generated on the host and uploaded (it sorts).

mod cpu;
pub(crate) mod cuda;
mod generator;
pub mod philox;
#[cfg(test)]
mod tests;

pub use generator::{
    default_generator, default_generator_state, manual_seed, set_default_generator_state, Generator,
    GeneratorState, DEFAULT_SEED,
};

use crate::shape::Shape;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Result, Tensor};
use generator::Stream;
use std::ops::Range;

/// Reserves `blocks` from `gen`, or from the default generator, whose lock is held only for
/// the reservation so threads drawing concurrently do not wait on each other's kernels.
fn reserve(gen: Option<&mut Generator>, blocks: u64) -> Stream {
    match gen {
        Some(g) => g.reserve(blocks),
        None => default_generator().reserve(blocks),
    }
}

fn expect_float(op: &str, dtype: DType) {
    assert!(dtype.is_float(), "{op}: expected a floating-point dtype, got {dtype}");
}

/// Ones with probability `p(i)`, zeros otherwise, as `dtype`.
fn bernoulli_impl(
    gen: Option<&mut Generator>,
    n: usize,
    p: impl Fn(usize) -> f64 + Sync,
    dtype: DType,
) -> CpuStorage {
    let stream = reserve(gen, cpu::blocks_for(n, 4));
    cpu::generate(dtype, n, stream, 4, |w, first| {
        let mut out = [0.0; 4];
        for (j, o) in out.iter_mut().enumerate() {
            if first + j < n {
                *o = ((w[j] as f64 * (1.0 / 4_294_967_296.0)) < p(first + j)) as u8 as f64;
            }
        }
        out
    })
}

fn check_probability(op: &str, p: f64, index: Option<usize>) {
    if !(0.0..=1.0).contains(&p) {
        let at = index.map_or(String::new(), |i| format!(" at element {i}"));
        panic!("{op}: probabilities must be in [0, 1], got {p}{at}");
    }
}

fn bernoulli_tensor_impl(probs: &Tensor, gen: Option<&mut Generator>) -> Tensor {
    let p = probs.to_f64_vec();
    for (i, &x) in p.iter().enumerate() {
        check_probability("bernoulli", x, Some(i));
    }
    if let Storage::Cuda(s) = &*probs.storage() {
        let stream = reserve(gen, cpu::blocks_for(p.len(), 4));
        let out =
            cuda::bernoulli_tensor(s, probs.layout(), stream).expect("bernoulli on the input's own device");
        return on_cuda(out, probs.dims().into());
    }
    let storage = bernoulli_impl(gen, p.len(), |i| p[i], probs.dtype());
    Tensor::from_cpu_on(storage, probs.dims(), probs.device()).expect("the input's own device")
}

fn randint_impl(
    gen: Option<&mut Generator>,
    low: i64,
    high: i64,
    shape: Shape,
    device: Device,
) -> Result<Tensor> {
    assert!(low < high, "randint: expected low < high, got low {low} and high {high} (high is exclusive)");
    device.check_available()?;
    let n = shape.elem_count();
    let stream = reserve(gen, cpu::blocks_for(n, 2));
    if let Device::Cuda(ordinal) = device {
        return Ok(on_cuda(cuda::randint(ordinal, n, stream, low, high)?, shape));
    }
    Tensor::from_cpu_on(CpuStorage::I64(cpu::randint(n, low, high, stream)), shape, device)
}

fn on_cuda(s: crate::cuda::CudaStorage, shape: Shape) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), shape)
}

/// Generated on the host and uploaded: the keys are cheap, and the sort is not worth a GPU
/// kernel until the data loader needs permutations of millions.
fn randperm_impl(gen: Option<&mut Generator>, n: usize, device: Device) -> Result<Tensor> {
    device.check_available()?;
    let stream = reserve(gen, cpu::blocks_for(n, 2));
    Tensor::from_cpu_on(CpuStorage::I64(cpu::randperm(n, stream)), n, device)
}

/// A continuous distribution to draw tensors from: `Distribution::Normal { mean: 0.0, std: 0.02 }
/// .sample(shape, dtype, device)` draws from the default generator, `.sample_with(&mut gen, ...)`
/// from your own. `Tensor::rand`, `uniform`, `randn` and `normal` are the PyTorch-named
/// shorthands for the default generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Uniform in [low, high), up to the dtype's rounding (`tensor.uniform_(low, high)`).
    Uniform { low: f64, high: f64 },
    /// Normal with `mean` and standard deviation `std`, by Box-Muller (`tensor.normal_(mean, std)`).
    Normal { mean: f64, std: f64 },
}

impl Distribution {
    /// Uniform in [0, 1) (`torch.rand`).
    pub const UNIT_UNIFORM: Distribution = Distribution::Uniform { low: 0.0, high: 1.0 };
    /// Mean 0, standard deviation 1 (`torch.randn`).
    pub const STANDARD_NORMAL: Distribution = Distribution::Normal { mean: 0.0, std: 1.0 };

    /// Samples from the process-wide default generator; `dtype` must be a float type.
    pub fn sample(self, shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        self.draw(None, shape.into(), dtype, device)
    }

    /// Samples from `gen`, advancing it past the blocks the draw used.
    pub fn sample_with(
        self,
        gen: &mut Generator,
        shape: impl Into<Shape>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        self.draw(Some(gen), shape.into(), dtype, device)
    }

    /// The kernel family's name and the distribution's two parameters, checked.
    fn checked(self) -> (&'static str, f64, f64) {
        match self {
            Distribution::Uniform { low, high } => {
                assert!(
                    low.is_finite() && high.is_finite() && low <= high,
                    "uniform: expected finite bounds with low <= high, got low {low} and high {high}"
                );
                ("uniform", low, high)
            }
            Distribution::Normal { mean, std } => {
                assert!(
                    std >= 0.0 && std.is_finite() && mean.is_finite(),
                    "normal: expected std >= 0 and finite, got mean {mean} and std {std}"
                );
                ("normal", mean, std)
            }
        }
    }

    fn draw(self, gen: Option<&mut Generator>, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
        let (name, a, b) = self.checked();
        expect_float(name, dtype);
        device.check_available()?;
        let n = shape.elem_count();
        // f64 takes two words an element, so a block of four words makes two.
        let per_block = if dtype == DType::F64 { 2 } else { 4 };
        let stream = reserve(gen, cpu::blocks_for(n, per_block));
        if let Device::Cuda(ordinal) = device {
            return Ok(on_cuda(cuda::sample(name, ordinal, dtype, n, per_block, stream, &[a, b])?, shape));
        }
        let storage = match self {
            Distribution::Uniform { .. } => cpu::generate(dtype, n, stream, per_block, |w, _| {
                let mut out = [0.0; 4];
                for (j, o) in out.iter_mut().enumerate().take(per_block) {
                    let words = if per_block == 2 { &w[2 * j..2 * j + 2] } else { &w[j..j + 1] };
                    *o = a + (b - a) * cpu::unit(dtype, words);
                }
                out
            }),
            Distribution::Normal { .. } => cpu::generate(dtype, n, stream, per_block, |w, _| {
                let z = if per_block == 2 {
                    let [z0, z1] = cpu::box_muller_f64(w);
                    [z0, z1, 0.0, 0.0]
                } else {
                    let [z0, z1] = cpu::box_muller_f32(w[0], w[1]);
                    let [z2, z3] = cpu::box_muller_f32(w[2], w[3]);
                    [z0, z1, z2, z3].map(|z| z as f64)
                };
                z.map(|z| a + b * z)
            }),
        };
        Tensor::from_cpu_on(storage, shape, device)
    }
}

impl Tensor {
    /// Uniform samples in [0, 1) (`torch.rand`); `dtype` must be a float type.
    pub fn rand(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Distribution::UNIT_UNIFORM.sample(shape, dtype, device)
    }

    /// Standard normal samples (`torch.randn`), by Box-Muller.
    pub fn randn(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Distribution::STANDARD_NORMAL.sample(shape, dtype, device)
    }

    /// Uniform samples in `range` = [low, high) (`tensor.uniform_(low, high)`), up to the
    /// dtype's rounding: `Tensor::uniform([2, 3], -0.1..0.1, DType::F32, Device::Cpu)`.
    pub fn uniform(shape: impl Into<Shape>, range: Range<f64>, dtype: DType, device: Device) -> Result<Self> {
        Distribution::Uniform { low: range.start, high: range.end }.sample(shape, dtype, device)
    }

    /// Normal samples with `mean` and standard deviation `std` (`tensor.normal_(mean, std)`).
    pub fn normal(
        shape: impl Into<Shape>,
        mean: f64,
        std: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Self> {
        Distribution::Normal { mean, std }.sample(shape, dtype, device)
    }

    /// Uniform [0, 1) samples with this tensor's shape, dtype and device (`torch.rand_like`).
    pub fn rand_like(&self) -> Tensor {
        Tensor::rand(self.dims(), self.dtype(), self.device()).expect("the tensor's own device")
    }

    /// Standard normal samples with this tensor's shape, dtype and device (`torch.randn_like`).
    pub fn randn_like(&self) -> Tensor {
        Tensor::randn(self.dims(), self.dtype(), self.device()).expect("the tensor's own device")
    }

    /// Each element 1 with the probability this tensor holds there, else 0, in this tensor's
    /// dtype (`torch.bernoulli(probs)`). Panics if a probability is outside [0, 1].
    pub fn bernoulli(&self) -> Tensor {
        bernoulli_tensor_impl(self, None)
    }

    pub fn bernoulli_with(&self, gen: &mut Generator) -> Tensor {
        bernoulli_tensor_impl(self, Some(gen))
    }

    /// Ones with probability `p`, zeros otherwise (`torch.empty(shape).bernoulli_(p)`), e.g.
    /// a dropout mask.
    pub fn bernoulli_scalar(shape: impl Into<Shape>, p: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::bernoulli_scalar_impl(None, shape.into(), p, dtype, device)
    }

    pub fn bernoulli_scalar_with(
        gen: &mut Generator,
        shape: impl Into<Shape>,
        p: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        Tensor::bernoulli_scalar_impl(Some(gen), shape.into(), p, dtype, device)
    }

    fn bernoulli_scalar_impl(
        gen: Option<&mut Generator>,
        shape: Shape,
        p: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        check_probability("bernoulli_scalar", p, None);
        device.check_available()?;
        if let Device::Cuda(ordinal) = device {
            let n = shape.elem_count();
            let stream = reserve(gen, cpu::blocks_for(n, 4));
            return Ok(on_cuda(cuda::sample("bernoulli", ordinal, dtype, n, 4, stream, &[p])?, shape));
        }
        let storage = bernoulli_impl(gen, shape.elem_count(), |_| p, dtype);
        Tensor::from_cpu_on(storage, shape, device)
    }

    /// Integers uniform in `low..high` (high exclusive) as int64 (`torch.randint(low, high, shape)`).
    pub fn randint(low: i64, high: i64, shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        randint_impl(None, low, high, shape.into(), device)
    }

    pub fn randint_with(
        gen: &mut Generator,
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
        device: Device,
    ) -> Result<Tensor> {
        randint_impl(Some(gen), low, high, shape.into(), device)
    }

    /// A random permutation of `0..n` as int64 (`torch.randperm(n)`).
    pub fn randperm(n: usize, device: Device) -> Result<Tensor> {
        randperm_impl(None, n, device)
    }

    pub fn randperm_with(gen: &mut Generator, n: usize, device: Device) -> Result<Tensor> {
        randperm_impl(Some(gen), n, device)
    }
}
