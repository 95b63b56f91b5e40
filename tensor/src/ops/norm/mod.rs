//! Normalisation primitives for the batch-norm and layer-norm layers: per-channel batch
//! statistics, the per-channel affine normalisation, and `layer_norm` as
//! `torch.native_layer_norm` (returning the mean and rstd that the backward pass needs), with
//! its fused forms in `layer.rs`.
//!
//! Inputs are floating point. Statistics (mean, var, rstd) come back in the input's dtype for
//! f32/f64 and in f32 for f16/bf16 inputs, as PyTorch's CUDA kernels return them: backward
//! wants them more precise than a half type holds. Weights, biases and given statistics may be
//! of any float dtype (bf16 activations with f32 parameters under autocast).

mod backward;
pub(crate) mod channels_last;
mod cpu;
pub(crate) mod cuda;
mod layer;
mod layer_backward;
pub(crate) mod layer_rows;
mod planes;
mod relu;
#[cfg(test)]
mod relu_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_layer;

pub use layer::{LayerNormGradOptions, LayerNormGrads};

use crate::cuda::CudaStorage;
use crate::memory_order::MemoryOrder;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Element, Layout, Tensor};
use cpu::Channels;
use relu::FusedMask;
pub use relu::{BatchNormFactors, ReluMask};

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

/// Panics unless statistics or parameters `t` are floats of `shape` on the input's device.
fn check_param(t: &Tensor, shape: &[usize], what: &str, op: &str, input: &Tensor) {
    input.same_device(t, op);
    float_input(t, op);
    assert!(
        t.dims() == shape,
        "{op}: {what} must have shape {shape:?} for an input of shape {:?}, got {:?}",
        input.dims(),
        t.dims()
    );
}

/// Statistics or parameters as an f64 vector, checked to have `shape`.
fn param(t: &Tensor, shape: &[usize], what: &str, op: &str, input: &Tensor) -> Vec<f64> {
    check_param(t, shape, what, op, input);
    t.kernel_f64_values()
}

/// Statistics or parameters as a contiguous f64 tensor on the (CUDA) input's device; a
/// parameter's f64 copy is kept while it is unchanged (a fused optimizer step rewrites it).
fn device_param(t: &Tensor, shape: &[usize], what: &str, op: &str, input: &Tensor) -> Tensor {
    check_param(t, shape, what, op, input);
    t.to_dtype_cached(DType::F64).contiguous()
}

/// Per-channel mean and biased variance in f64: host vectors for a CPU input, `[C]` f64
/// tensors on the device for a CUDA one (so statistics never leave the GPU).
enum Moments {
    Host(Vec<f64>, Vec<f64>),
    Device(Tensor, Tensor),
}

impl Moments {
    /// Mean and variance as `[C]` tensors in the statistics dtype of an input of `dtype`.
    fn tensors(self, channels: usize, dtype: DType) -> (Tensor, Tensor) {
        match self {
            Moments::Host(mean, var) => {
                (stats_tensor(mean, channels, dtype), stats_tensor(var, channels, dtype))
            }
            Moments::Device(mean, var) => {
                (mean.to_dtype(stats_dtype(dtype)), var.to_dtype(stats_dtype(dtype)))
            }
        }
    }
}

/// A CUDA kernel's packed result `t` seen in the layout of its channels-last input `like` (the
/// kernels write such results in the input's memory order); any other result is row-major.
fn in_layout_of(t: Tensor, like: &Tensor, ch: Channels) -> Tensor {
    if cuda::channels_last(like.layout(), ch.channels) && !like.is_contiguous() {
        t.with_layout(Layout::new(like.dims(), like.layout().strides().to_vec(), 0))
    } else {
        t
    }
}

/// `t` (same dims as the packed `like`) in `like`'s memory order, copied only when it is not.
fn packed_like(t: &Tensor, like: &Tensor) -> Tensor {
    if t.layout().dense_order().is_some() && t.layout().dense_order() == like.layout().dense_order() {
        return t.clone();
    }
    match MemoryOrder::of(like.dims(), &[like]) {
        Some(m) => m.leave(m.enter(t).contiguous()),
        None => t.contiguous(),
    }
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
        let (ch, moments) = self.channel_moments("batch_norm_stats");
        moments.tensors(ch.channels, self.dtype())
    }

    /// Per-channel mean and biased variance in f64.
    fn channel_moments(&self, op: &str) -> (Channels, Moments) {
        let ch = self.channel_view(op);
        let moments = match &*self.storage() {
            Storage::Cpu(_) => {
                // The plane kernels read packed NCHW data; a strided view is copied first.
                let x = self.contiguous();
                let (mean, var) = match &*x.storage() {
                    Storage::Cpu(s) => with_float_storage!(s, op, v, T => planes::channel_moments(v, ch)),
                    Storage::Cuda(_) => unreachable!("a CPU tensor's copy is on the CPU"),
                };
                Moments::Host(mean, var)
            }
            Storage::Cuda(s) => {
                let (mean, var) = cuda::channel_moments(s, self.layout(), ch, op);
                Moments::Device(mean, var)
            }
        };
        (ch, moments)
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
        let moments = if self.device().is_cuda() {
            let mean = device_param(mean, &[ch.channels], "mean", op, self);
            Moments::Device(mean, device_param(var, &[ch.channels], "var", op, self))
        } else {
            let mean = param(mean, &[ch.channels], "mean", op, self);
            Moments::Host(mean, param(var, &[ch.channels], "var", op, self))
        };
        self.normalize_channels(ch, &moments, weight, bias, (eps, false))
    }

    /// The normalisation with given moments, then ReLU when `relu` (fused into the kernel).
    fn normalize_channels(
        &self,
        ch: Channels,
        moments: &Moments,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        (eps, relu): (f64, bool),
    ) -> Tensor {
        self.normalize_channels_into(ch, moments, weight, bias, (eps, relu), None).0
    }

    /// `normalize_channels` plus `residual` before the ReLU: on the CPU any residual of `self`'s
    /// shape and dtype, on CUDA only for channels-last inputs, packed like `self` (the tile
    /// kernel adds it). On CUDA also returns the per-channel factors the kernel normalised with.
    fn normalize_channels_into(
        &self,
        ch: Channels,
        moments: &Moments,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        (eps, relu): (f64, bool),
        residual: Option<&Tensor>,
    ) -> (Tensor, Option<BatchNormFactors>) {
        let (op, shape) = ("batch_norm", [ch.channels]);
        let (mean, var) = match moments {
            Moments::Host(mean, var) => (mean, var),
            Moments::Device(mean, var) => {
                let weight = weight.map(|w| device_param(w, &shape, "weight", op, self));
                let bias = bias.map(|b| device_param(b, &shape, "bias", op, self));
                let res_storage = residual.map(|r| r.storage());
                let res = match (residual, res_storage.as_deref()) {
                    (Some(r), Some(Storage::Cuda(rs))) => Some((rs, r.layout())),
                    _ => None,
                };
                let Storage::Cuda(s) = &*self.storage() else {
                    unreachable!("device moments of a CPU tensor")
                };
                let factors = (var, weight.as_ref(), bias.as_ref());
                let (scale, shift) = cuda::affine_factors(s.device(), ch.channels, factors, eps, op);
                let out = cuda::channel_affine(s, self.layout(), ch, (mean, &scale, &shift), (relu, res), op);
                let out = in_layout_of(Tensor::from_storage(Storage::Cuda(out), self.dims()), self, ch);
                return (out, Some(BatchNormFactors { mean: mean.clone(), scale, shift }));
            }
        };
        let weight = weight.map(|w| param(w, &shape, "weight", op, self));
        let bias = bias.map(|b| param(b, &shape, "bias", op, self)).unwrap_or_else(|| vec![0.0; ch.channels]);
        let scale: Vec<f64> =
            (0..ch.channels).map(|c| weight.as_ref().map_or(1.0, |w| w[c]) / (var[c] + eps).sqrt()).collect();
        let (x, residual) = (self.contiguous(), residual.map(Tensor::contiguous));
        let res_storage = residual.as_ref().map(|r| r.storage());
        let storage = match &*x.storage() {
            Storage::Cpu(s) => with_float_storage!(s, op, v, T => {
                let residual = res_storage.as_deref().map(|r| match r {
                    Storage::Cpu(r) => r.as_slice::<T>(),
                    Storage::Cuda(_) => unreachable!("{op}: the residual was checked to be on the CPU"),
                });
                let epilogue = planes::Epilogue { residual, relu };
                T::into_storage(planes::normalize(v, ch, (mean, &scale, &bias), epilogue))
            }),
            Storage::Cuda(_) => unreachable!("host moments of a CUDA tensor"),
        };
        (Tensor::from_cpu(storage, self.dims()), None)
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
        self.batch_norm_training_then(weight, bias, eps, false)
    }

    /// [`Tensor::batch_norm_training`] followed by ReLU, as one pass over the output (the
    /// pattern of every ResNet block): returns `(relu(output), mean, var)`.
    pub fn batch_norm_relu_training(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor) {
        self.batch_norm_training_then(weight, bias, eps, true)
    }

    /// `relu(batch_norm_training(x) + residual)`, the end of a ResNet bottleneck, as one pass
    /// over the output on the CPU and on CUDA for channels-last inputs (else batch norm, add
    /// and ReLU in turn): returns `(output, mean, var)`. `residual` has `x`'s shape and dtype.
    pub fn batch_norm_add_relu_training(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        residual: &Tensor,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "batch_norm_add_relu";
        assert!(
            residual.dims() == self.dims() && residual.dtype() == self.dtype(),
            "{op}: the residual is {:?} {}, the input {:?} {}",
            residual.dims(),
            residual.dtype(),
            self.dims(),
            self.dtype()
        );
        self.same_device(residual, op);
        let (ch, moments) = self.channel_moments("batch_norm");
        let out = if !self.device().is_cuda() {
            self.normalize_channels_into(ch, &moments, weight, bias, (eps, true), Some(residual)).0
        } else if cuda::channels_last(self.layout(), ch.channels) {
            let residual = packed_like(residual, self);
            self.normalize_channels_into(ch, &moments, weight, bias, (eps, true), Some(&residual)).0
        } else {
            self.normalize_channels(ch, &moments, weight, bias, (eps, false)).add(residual).relu()
        };
        let (mean, var) = moments.tensors(ch.channels, self.dtype());
        (out, mean, var)
    }

    fn batch_norm_training_then(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        relu: bool,
    ) -> (Tensor, Tensor, Tensor) {
        let (ch, moments) = self.channel_moments("batch_norm");
        let out = self.normalize_channels(ch, &moments, weight, bias, (eps, relu));
        let (mean, var) = moments.tensors(ch.channels, self.dtype());
        (out, mean, var)
    }

    /// Batch norm's gradients in training mode, `self` being the output gradient `dy`: returns
    /// `(dx, dweight, dbias)` for an input `x` normalised with the batch statistics `mean` and
    /// biased `var` (shape `[C]`, as [`Tensor::batch_norm_training`] returned them) and `weight`
    /// (1 when `None`). `dx` is `weight * rstd * (dy - mean(dy) - x_hat * mean(dy * x_hat))`
    /// with `x_hat = (x - mean) * rstd`, `rstd = 1 / sqrt(var + eps)`; `dweight = sum(dy * x_hat)`,
    /// `dbias = sum(dy)` over every dim but 1. `dx` has `x`'s dtype, `dweight` and `dbias` are
    /// `[C]` in `x`'s dtype.
    ///
    /// Two passes: the per-channel sums of `dy` and `dy * (x - mean)` together (accumulated in
    /// f64), then one elementwise pass for `dx` (skipped when `input_grad` is false). On CUDA
    /// the statistics stay on the device and nothing waits for it.
    pub fn batch_norm_backward(
        &self,
        x: &Tensor,
        (mean, var): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        input_grad: bool,
    ) -> (Option<Tensor>, Tensor, Tensor) {
        let op = "batch_norm_backward";
        let ch = x.channel_view(op);
        self.same_dtype(x, op);
        assert!(
            self.dims() == x.dims(),
            "{op}: the output gradient has shape {:?}, the input {:?}",
            self.dims(),
            x.dims()
        );
        self.same_device(x, op);
        let shape = [ch.channels];
        if x.device().is_cuda() {
            let (dx, dweight, dbias, _) =
                self.device_backward(x, (mean, var), weight, eps, (input_grad, FusedMask::None), op);
            return (dx, dweight, dbias);
        }
        let stats = backward::HostStats {
            mean: param(mean, &shape, "mean", op, x),
            var: param(var, &shape, "var", op, x),
            weight: weight.map(|w| param(w, &shape, "weight", op, x)),
            eps,
        };
        let (dx, dweight, dbias, _) = backward::cpu_backward(self, None, x, ch, &stats, (input_grad, false));
        (dx, dweight, dbias)
    }

    /// The CUDA side of [`Tensor::batch_norm_backward`], `self` being dy, with the gradient
    /// masked by the ReLU that followed batch norm as `mask` says (a channels-last `x` only):
    /// `(dx, dweight, dbias, masked)`, the masked gradient with [`FusedMask::Output`].
    fn device_backward(
        &self,
        x: &Tensor,
        (mean, var): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        (input_grad, mask): (bool, FusedMask<'_>),
        op: &str,
    ) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
        let ch = x.channel_view(op);
        let shape = [ch.channels];
        // A channels-last x wants dy (and the ReLU's output) packed the same way: one flat
        // pass over all of them.
        let cl = cuda::channels_last(x.layout(), ch.channels);
        let dy = if cl { packed_like(self, x) } else { self.clone() };
        let (relu_out, addend) = match mask {
            FusedMask::Output { relu_out, addend } => {
                (Some(packed_like(relu_out, x)), addend.map(|a| packed_like(a, x)))
            }
            _ => (None, None),
        };
        let (dy_storage, x_storage) = (dy.storage(), x.storage());
        let y_storage = relu_out.as_ref().map(|y| y.storage());
        let a_storage = addend.as_ref().map(|a| a.storage());
        let (Storage::Cuda(g), Storage::Cuda(s)) = (&*dy_storage, &*x_storage) else {
            unreachable!("{op}: checked to be on one device")
        };
        // The ReLU's output and the addend were checked to be on the input's device.
        fn on_device<'a>(
            st: Option<&'a Storage>,
            t: Option<&'a Tensor>,
        ) -> Option<(&'a CudaStorage, &'a Layout)> {
            match (st, t) {
                (Some(Storage::Cuda(st)), Some(t)) => Some((st, t.layout())),
                _ => None,
            }
        }
        let device_mask = match mask {
            FusedMask::None => cuda::DeviceMask::None,
            FusedMask::Output { .. } => {
                let Some((y, y_layout)) = on_device(y_storage.as_deref(), relu_out.as_ref()) else {
                    unreachable!("{op}: an output mask has the ReLU's output")
                };
                cuda::DeviceMask::Output(y, y_layout, on_device(a_storage.as_deref(), addend.as_ref()))
            }
            FusedMask::Recompute(f) => cuda::DeviceMask::Recompute(f),
        };
        let mean = device_param(mean, &shape, "mean", op, x);
        let var = device_param(var, &shape, "var", op, x);
        let weight = weight.map(|w| device_param(w, &shape, "weight", op, x));
        let (dx, dweight, dbias, masked) = cuda::batch_norm_backward(
            (g, dy.layout()),
            (s, x.layout()),
            ch,
            (&mean, &var, weight.as_ref()),
            eps,
            (input_grad, device_mask),
            op,
        );
        let as_input = |d| in_layout_of(Tensor::from_storage(Storage::Cuda(d), x.dims()), x, ch);
        (dx.map(as_input), dweight.to_dtype(x.dtype()), dbias.to_dtype(x.dtype()), masked.map(as_input))
    }
}
