//! Normalisation primitives for the batch-norm and layer-norm layers: per-channel batch
//! statistics, the per-channel affine normalisation, and `layer_norm` as
//! `torch.native_layer_norm` (returning the mean and rstd that the backward pass needs).
//!
//! Inputs are floating point. Statistics (mean, var, rstd) come back in the input's dtype for
//! f32/f64 and in f32 for f16/bf16 inputs, as PyTorch's CUDA kernels return them: backward
//! wants them more precise than a half type holds. Weights, biases and given statistics may be
//! of any float dtype (bf16 activations with f32 parameters under autocast).

mod cpu;
#[cfg(test)]
mod tests;

use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Element, Tensor};
use cpu::Channels;

/// The dtype statistics of an input of `dtype` are returned in.
fn stats_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

fn float_input(t: &Tensor, op: &str) {
    assert!(
        t.dtype().is_float(),
        "{op}: expected a floating-point input, got {} with shape {:?}",
        t.dtype(),
        t.dims()
    );
}

/// Statistics or parameters as an f64 vector, checked to have `shape`.
fn param(t: &Tensor, shape: &[usize], what: &str, op: &str, input: &Tensor) -> Vec<f64> {
    input.same_device(t, op);
    float_input(t, op);
    assert!(
        t.dims() == shape,
        "{op}: {what} must have shape {shape:?} for an input of shape {:?}, got {:?}",
        input.dims(),
        t.dims()
    );
    t.to_f64_vec()
}

fn stats_tensor(values: Vec<f64>, shape: impl Into<Shape>, input_dtype: DType) -> Tensor {
    Tensor::from_cpu(f64::into_storage(values), shape).to_dtype(stats_dtype(input_dtype))
}

impl Tensor {
    /// `[N, C, ...]` seen as channels: the channel count and the elements per (sample, channel).
    fn channel_view(&self, op: &str) -> Channels {
        float_input(self, op);
        assert!(
            self.rank() >= 2,
            "{op}: expected an input of shape [N, C], [N, C, L] or [N, C, H, W], got {:?}",
            self.dims()
        );
        Channels { channels: self.dims()[1], spatial: self.dims()[2..].iter().product() }
    }

    /// Per-channel mean and biased variance over every dim but dim 1 (N, H, W of an NCHW
    /// tensor; N of `[N, C]`; N, L of `[N, C, L]`), each of shape `[C]`. The variance is the
    /// one batch norm normalises with; the running variance PyTorch tracks is the unbiased
    /// one, `var * n / (n - 1)` with `n = elem_count / C`.
    pub fn batch_norm_stats(&self) -> (Tensor, Tensor) {
        let (ch, mean, var) = self.channel_moments("batch_norm_stats");
        (stats_tensor(mean, ch.channels, self.dtype()), stats_tensor(var, ch.channels, self.dtype()))
    }

    /// Per-channel mean and biased variance in f64.
    fn channel_moments(&self, op: &str) -> (Channels, Vec<f64>, Vec<f64>) {
        let ch = self.channel_view(op);
        let (mean, var) = match &*self.storage() {
            Storage::Cpu(s) => with_float_storage!(s, op, v, T => cpu::channel_moments(v, self.layout(), ch)),
            Storage::Cuda(_) => crate::cuda::not_yet("norm"),
        };
        (ch, mean, var)
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias` per channel (dim 1), with `mean`, `var`,
    /// `weight` and `bias` of shape `[C]`: batch norm's forward with given statistics (the batch's
    /// in training, the running ones in eval). A missing weight is 1, a missing bias 0. The
    /// result has the input's shape and dtype.
    pub fn batch_norm_normalize(
        &self,
        mean: &Tensor,
        var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Tensor {
        let op = "batch_norm";
        let ch = self.channel_view(op);
        let mean = param(mean, &[ch.channels], "mean", op, self);
        let var = param(var, &[ch.channels], "var", op, self);
        self.normalize_channels(ch, &mean, &var, weight, bias, eps)
    }

    fn normalize_channels(
        &self,
        ch: Channels,
        mean: &[f64],
        var: &[f64],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Tensor {
        let (op, shape) = ("batch_norm", [ch.channels]);
        let weight = weight.map(|w| param(w, &shape, "weight", op, self));
        let bias = bias.map(|b| param(b, &shape, "bias", op, self)).unwrap_or_else(|| vec![0.0; ch.channels]);
        let scale: Vec<f64> =
            (0..ch.channels).map(|c| weight.as_ref().map_or(1.0, |w| w[c]) / (var[c] + eps).sqrt()).collect();
        let storage = match &*self.storage() {
            Storage::Cpu(s) => with_float_storage!(s, op, v, T => T::into_storage(
                cpu::channel_affine(v, self.layout(), ch, (mean, &scale, &bias))
            )),
            Storage::Cuda(_) => crate::cuda::not_yet("norm"),
        };
        Tensor::from_cpu(storage, self.dims())
    }

    /// Batch norm in training mode: the batch's statistics, then `batch_norm_normalize` with
    /// them (kept in f64 in between, so a large mean loses nothing to rounding). Returns `(output, mean, var)` with the biased variance; backward's inverse standard
    /// deviation is `(var + eps).rsqrt()`.
    pub fn batch_norm_training(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor) {
        let (ch, mean, var) = self.channel_moments("batch_norm");
        let out = self.normalize_channels(ch, &mean, &var, weight, bias, eps);
        (out, stats_tensor(mean, ch.channels, self.dtype()), stats_tensor(var, ch.channels, self.dtype()))
    }

    /// Layer norm over the trailing dims `normalized_shape`, as `torch.native_layer_norm`:
    /// returns `(output, mean, rstd)`, where `rstd = 1 / sqrt(biased var + eps)` and `mean` and
    /// `rstd` have the input's shape with the normalised dims set to 1. `weight` and `bias`, when
    /// given, have shape `normalized_shape`.
    pub fn layer_norm(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "layer_norm";
        float_input(self, op);
        let normalized = normalized_shape.into();
        let axis = self.rank().checked_sub(normalized.rank());
        assert!(
            axis.is_some_and(|a| self.dims()[a..] == *normalized.dims()) && normalized.rank() > 0,
            "layer_norm: normalized_shape {:?} must be a non-empty tail of the input's shape {:?}",
            normalized.dims(),
            self.dims()
        );
        let axis = axis.unwrap_or(0);
        let weight = weight.map(|w| param(w, &normalized, "weight", op, self));
        let bias = bias.map(|b| param(b, &normalized, "bias", op, self));
        let x = self.contiguous();
        let row_len = normalized.elem_count();
        let (out, mean, rstd) = match &*x.storage() {
            Storage::Cpu(s) => with_float_storage!(s, op, v, T => {
                let (out, mean, rstd) = cpu::layer_norm(v, row_len, weight.as_deref(), bias.as_deref(), eps);
                (T::into_storage(out), mean, rstd)
            }),
            Storage::Cuda(_) => crate::cuda::not_yet("norm"),
        };
        let mut stats_shape = self.dims().to_vec();
        stats_shape[axis..].iter_mut().for_each(|d| *d = 1);
        (
            Tensor::from_cpu(out, self.dims()),
            stats_tensor(mean, &stats_shape, self.dtype()),
            stats_tensor(rstd, stats_shape, self.dtype()),
        )
    }
}
