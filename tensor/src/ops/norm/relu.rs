//! Batch norm followed by ReLU (the pattern of every ResNet block): the backward through both,
//! with the ReLU's mask folded into batch norm's two backward passes instead of a pass of its
//! own.
//!
//! The mask comes from the ReLU's output (the gradient passes where it is > 0), or, for a
//! channels-last input on CUDA, is recomputed from batch norm's input `x` with the forward's
//! own per-channel factors: the kernels evaluate the ReLU's input with the forward's exact
//! arithmetic, so the mask is the same bit for bit, and the ReLU's output need not be kept for
//! the backward at all (it is freed as soon as the next layer is done with it).

use super::cpu::Channels;
use super::{backward, cuda, param, Tensor};
use crate::storage::Storage;
use std::sync::OnceLock;

/// Batch norm's per-channel factors as its CUDA output kernel used them, `[C]` f64 tensors on
/// the device: the batch's mean before any rounding, `scale = weight / sqrt(var + eps)` and
/// `shift = bias`.
#[derive(Clone, Debug)]
pub struct BatchNormFactors {
    pub(super) mean: Tensor,
    pub(super) scale: Tensor,
    pub(super) shift: Tensor,
}

/// Where batch norm's backward finds the mask of the ReLU that followed it.
#[derive(Clone, Debug)]
pub enum ReluMask {
    /// The ReLU's output: the gradient passes where it is > 0.
    Output(Tensor),
    /// Recomputed from batch norm's input with the forward's own factors, bit for bit (a
    /// channels-last input on CUDA): nothing of the forward's output is kept.
    Recompute(BatchNormFactors),
}

/// [`ReluMask`] borrowed, plus no mask at all; an output mask may come with an addend, a
/// second part of the output gradient.
#[derive(Clone, Copy)]
pub(super) enum FusedMask<'a> {
    None,
    Output { relu_out: &'a Tensor, addend: Option<&'a Tensor> },
    Recompute(&'a BatchNormFactors),
}

/// Whether CUDA folds the ReLU's mask into batch norm's backward passes (and recomputes it
/// where it can): on unless `OXTRAIN_DISABLE_BN_RELU_FOLD=1`, which restores the separate
/// `threshold_backward` pass and keeps the ReLU's output for it.
pub fn bn_relu_fold_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("OXTRAIN_DISABLE_BN_RELU_FOLD").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

impl Tensor {
    /// [`Tensor::batch_norm_relu_training`], also returning how its backward will find the
    /// ReLU's mask: on CUDA for a channels-last input the forward's factors (the backward
    /// recomputes the mask from `x`), else the output itself. Returns `(relu(output), mean,
    /// var, mask)`.
    pub fn batch_norm_relu_training_with_mask(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor, ReluMask) {
        let (ch, moments) = self.channel_moments("batch_norm");
        let (out, factors) = self.normalize_channels_into(ch, &moments, weight, bias, (eps, true), None);
        let recompute = bn_relu_fold_enabled() && cuda::channels_last(self.layout(), ch.channels);
        let mask = match factors {
            Some(f) if recompute => ReluMask::Recompute(f),
            _ => ReluMask::Output(out.clone()),
        };
        let (mean, var) = moments.tensors(ch.channels, self.dtype());
        (out, mean, var, mask)
    }

    /// [`Tensor::batch_norm_backward`] through the ReLU that followed batch norm (and the
    /// residual added before that ReLU, if any): `self` is the gradient of the ReLU's output
    /// `relu_out`, masked with `relu_out > 0` (as [`Tensor::threshold_backward`] with
    /// threshold 0) before batch norm's backward. Returns `(dx, dweight, dbias, masked)`, the
    /// masked gradient (the residual's gradient) only when `keep_masked`.
    ///
    /// The mask is applied as the two passes read the gradient, and the masked gradient, when
    /// kept (always on CUDA), is written by the first and read by the second; on CUDA for an
    /// input that is not channels-last the mask is its own pass.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_relu_backward(
        &self,
        relu_out: &Tensor,
        x: &Tensor,
        stats: (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        input_grad: bool,
        keep_masked: bool,
    ) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
        let mask = FusedMask::Output { relu_out, addend: None };
        self.relu_backward(mask, x, stats, weight, eps, (input_grad, keep_masked))
    }

    /// [`Tensor::batch_norm_relu_backward`] for the output gradient `self + addend` (the two
    /// gradients of a ResNet block's input: its identity's and its first convolution's). Where
    /// [`Tensor::batch_norm_relu_fuses_addend`] says so the first pass adds them as it reads
    /// them (rounded as `add` rounds, so the same values), else they are added first.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_relu_backward_plus(
        &self,
        addend: &Tensor,
        relu_out: &Tensor,
        x: &Tensor,
        stats: (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        input_grad: bool,
        keep_masked: bool,
    ) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
        let mask = FusedMask::Output { relu_out, addend: Some(addend) };
        self.relu_backward(mask, x, stats, weight, eps, (input_grad, keep_masked))
    }

    /// Whether batch norm's backward through a ReLU of this input (`x`) reads a second part
    /// of the output gradient as it goes ([`Tensor::batch_norm_relu_backward_plus`]): a
    /// channels-last CUDA input, with the fold on (see [`bn_relu_fold_enabled`]).
    pub fn batch_norm_relu_fuses_addend(&self) -> bool {
        self.device().is_cuda()
            && self.rank() >= 2
            && cuda::channels_last(self.layout(), self.dims()[1])
            && bn_relu_fold_enabled()
    }

    /// [`Tensor::batch_norm_relu_backward`] with the mask `mask`, as
    /// [`Tensor::batch_norm_relu_training_with_mask`] returned it.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_relu_backward_with(
        &self,
        mask: &ReluMask,
        x: &Tensor,
        stats: (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        input_grad: bool,
        keep_masked: bool,
    ) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
        let mask = match mask {
            ReluMask::Output(y) => FusedMask::Output { relu_out: y, addend: None },
            ReluMask::Recompute(f) => FusedMask::Recompute(f),
        };
        self.relu_backward(mask, x, stats, weight, eps, (input_grad, keep_masked))
    }

    fn relu_backward(
        &self,
        mask: FusedMask<'_>,
        x: &Tensor,
        (mean, var): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        eps: f64,
        (input_grad, keep_masked): (bool, bool),
    ) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
        let op = "batch_norm_relu_backward";
        let ch = x.channel_view(op);
        check_like_x(self, x, "output gradient", op);
        let cl = x.device().is_cuda() && cuda::channels_last(x.layout(), ch.channels);
        let (relu_out, addend) = match mask {
            FusedMask::Output { relu_out, addend } => {
                check_like_x(relu_out, x, "ReLU's output", op);
                if let Some(a) = addend {
                    check_like_x(a, x, "addend", op);
                }
                (relu_out.clone(), addend)
            }
            FusedMask::Recompute(f) => {
                assert!(
                    cl && f.mean.dims() == [ch.channels] && f.mean.device() == x.device(),
                    "{op}: a recomputed ReLU mask needs the channels-last CUDA input it was made from, got {:?} on {:?}",
                    x.dims(),
                    x.device()
                );
                if !keep_masked {
                    let (dx, dw, db, _) =
                        self.device_backward(x, (mean, var), weight, eps, (input_grad, mask), op);
                    return (dx, dw, db, None);
                }
                // The masked gradient is asked for: the ReLU's output once more, then as below.
                (recomputed_relu_out(x, ch, f, op), None)
            }
            FusedMask::None => unreachable!("{op}: called with a mask"),
        };
        if cl && bn_relu_fold_enabled() {
            let fused = (input_grad, FusedMask::Output { relu_out: &relu_out, addend });
            let (dx, dw, db, masked) = self.device_backward(x, (mean, var), weight, eps, fused, op);
            return (dx, dw, db, masked.filter(|_| keep_masked));
        }
        let dy = match addend {
            Some(a) => self.add(a),
            None => self.clone(),
        };
        if !x.device().is_cuda() {
            let shape = [ch.channels];
            let stats = backward::HostStats {
                mean: param(mean, &shape, "mean", op, x),
                var: param(var, &shape, "var", op, x),
                weight: weight.map(|w| param(w, &shape, "weight", op, x)),
                eps,
            };
            return backward::cpu_backward(&dy, Some(&relu_out), x, ch, &stats, (input_grad, keep_masked));
        }
        let masked = dy.threshold_backward(&relu_out, 0.0);
        let (dx, dw, db) = masked.batch_norm_backward(x, (mean, var), weight, eps, input_grad);
        (dx, dw, db, keep_masked.then_some(masked))
    }
}

/// Panics unless `t` (the `what` of batch norm's backward) matches the input `x` in shape,
/// dtype and device.
fn check_like_x(t: &Tensor, x: &Tensor, what: &str, op: &str) {
    x.same_dtype(t, op);
    x.same_device(t, op);
    assert!(t.dims() == x.dims(), "{op}: the {what} has shape {:?}, the input {:?}", t.dims(), x.dims());
}

/// The ReLU's output of a channels-last CUDA input, made again with the forward's factors.
fn recomputed_relu_out(x: &Tensor, ch: Channels, f: &BatchNormFactors, op: &str) -> Tensor {
    let storage = match &*x.storage() {
        Storage::Cuda(s) => {
            cuda::channel_affine(s, x.layout(), ch, (&f.mean, &f.scale, &f.shift), (true, None), op)
        }
        Storage::Cpu(_) => unreachable!("{op}: checked to be a CUDA input"),
    };
    super::in_layout_of(Tensor::from_storage(Storage::Cuda(storage), x.dims()), x, ch)
}
