//! Fused optimizer updates (`sgd_step_`, `adamw_step_`): one pass over a parameter, its
//! gradient and its state buffers, updating the parameter and the state in place; on CUDA also
//! over a whole list of parameters in one launch ([`MultiTensorStep`]), and batch norm's running
//! statistics in one launch (`Tensor::update_running_stats_`).
//!
//! Written out of tensor ops, one AdamW step reads and writes each buffer several times
//! (decay, two moment updates, sqrt, divide, add); fused, every element is loaded and stored
//! once, which is what bounds an optimizer step on a GPU. The formulas and their order of
//! operations are PyTorch's single-tensor (`foreach=False`) implementations, in f32.
//!
//! Parameters and state are contiguous f32 tensors (fp32 master weights); the gradient may be
//! f32, bf16 or f16 and is read as f32.

mod cpu;
pub(crate) mod cuda;
mod multi;
mod multi_cuda;
mod running;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_multi;

pub use multi::{AdamWParam, MultiTensorStep, SgdParam};

use crate::{DType, Storage, Tensor};

/// Hyper-parameters of one SGD step, as `torch.optim.SGD`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    pub maximize: bool,
}

/// Hyper-parameters of one AdamW step, as `torch.optim.AdamW`. `step` counts this step too
/// (1 on the first step): it drives the bias corrections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step: u64,
    pub maximize: bool,
}

/// The f32 coefficients the SGD kernels take, computed once on the host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SgdCoefs {
    pub lr: f32,
    pub momentum: f32,
    /// `1 - dampening`.
    pub keep: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    pub maximize: bool,
    /// Whether a momentum buffer is used (momentum != 0).
    pub has_buf: bool,
    /// First step: the buffer is set to the gradient instead of decayed into.
    pub first: bool,
}

/// The f32 coefficients the AdamW kernels take; the bias corrections are folded in on the host
/// in f64, as PyTorch computes them in Python floats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWCoefs {
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    /// `1 - beta1`, the weight of the gradient in the first moment.
    pub one_minus_beta1: f32,
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 - beta1^step)`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^step)`.
    pub bc2_sqrt: f32,
    pub eps: f32,
    pub maximize: bool,
}

impl SgdCoefs {
    pub(crate) fn new(cfg: &SgdStep, first: bool) -> SgdCoefs {
        SgdCoefs {
            lr: cfg.lr as f32,
            momentum: cfg.momentum as f32,
            keep: (1.0 - cfg.dampening) as f32,
            weight_decay: cfg.weight_decay as f32,
            nesterov: cfg.nesterov,
            maximize: cfg.maximize,
            has_buf: cfg.momentum != 0.0,
            first,
        }
    }
}

impl AdamWCoefs {
    pub(crate) fn new(cfg: &AdamWStep) -> AdamWCoefs {
        assert!(cfg.step >= 1, "adamw_step_: step counts the steps taken including this one; it starts at 1");
        let t = cfg.step as f64;
        AdamWCoefs {
            decay: (1.0 - cfg.lr * cfg.weight_decay) as f32,
            one_minus_beta1: (1.0 - cfg.beta1) as f32,
            beta2: cfg.beta2 as f32,
            one_minus_beta2: (1.0 - cfg.beta2) as f32,
            step_size: (cfg.lr / (1.0 - cfg.beta1.powf(t))) as f32,
            bc2_sqrt: (1.0 - cfg.beta2.powf(t)).sqrt() as f32,
            eps: cfg.eps as f32,
            maximize: cfg.maximize,
        }
    }
}

impl Tensor {
    /// One in-place SGD step on this f32 parameter (PyTorch's `torch.optim.SGD` update):
    /// `d = ±grad + weight_decay * p`; with momentum `buf = d` on the `first` step, else
    /// `buf = momentum * buf + (1 - dampening) * d`, then `d = d + momentum * buf` (Nesterov)
    /// or `d = buf`; finally `p -= lr * d`. `momentum_buf` must be given when momentum is not 0.
    pub fn sgd_step_(&self, grad: &Tensor, momentum_buf: Option<&Tensor>, first: bool, cfg: &SgdStep) {
        let (grad, buf) = self.check_sgd(grad, momentum_buf, cfg);
        let c = SgdCoefs::new(cfg, first);
        if self.elem_count() == 0 {
            return;
        }
        let n = self.elem_count();
        let (po, go) = (self.layout().offset(), grad.layout().offset());
        let mut p = self.storage_mut();
        let g = grad.storage();
        let mut b = buf.map(|b| (b.layout().offset(), b.storage_mut()));
        match (&mut *p, &*g) {
            (Storage::Cpu(p), Storage::Cpu(g)) => {
                let bs = b.as_mut().map(|(o, s)| &mut cpu_f32(s)[*o..*o + n]);
                cpu::sgd(&mut p.as_mut_slice::<f32>()[po..po + n], g, go, bs, &c)
            }
            (Storage::Cuda(p), Storage::Cuda(g)) => {
                let bp = b.as_ref().map(|(o, s)| cuda_ptr(s, *o));
                cuda::sgd(p, po, g, go, bp, n, &c)
            }
            _ => unreachable!("sgd_step_: devices were checked"),
        }
    }

    /// One in-place AdamW step on this f32 parameter (`torch.optim.AdamW`, decoupled weight
    /// decay, bias-corrected): `p *= 1 - lr*wd; m += (1-b1)(g - m); v = b2 v + (1-b2) g²;`
    /// with `max_exp_avg_sq` (AMSGrad) `vmax = max(vmax, v)` replaces `v` below;
    /// `p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`.
    pub fn adamw_step_(
        &self,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        max_exp_avg_sq: Option<&Tensor>,
        cfg: &AdamWStep,
    ) {
        let grad = self.check_adamw(grad, exp_avg, exp_avg_sq, max_exp_avg_sq);
        let c = AdamWCoefs::new(cfg);
        if self.elem_count() == 0 {
            return;
        }
        let n = self.elem_count();
        let offs = [self, &grad, exp_avg, exp_avg_sq].map(|t| t.layout().offset());
        let mut p = self.storage_mut();
        let g = grad.storage();
        let mut m = exp_avg.storage_mut();
        let mut v = exp_avg_sq.storage_mut();
        let mut vm = max_exp_avg_sq.map(|t| (t.layout().offset(), t.storage_mut()));
        match (&mut *p, &*g) {
            (Storage::Cpu(p), Storage::Cpu(g)) => {
                let [po, go, mo, vo] = offs;
                let vms = vm.as_mut().map(|(o, s)| &mut cpu_f32(s)[*o..*o + n]);
                cpu::adamw(
                    &mut p.as_mut_slice::<f32>()[po..po + n],
                    g,
                    go,
                    &mut cpu_f32(&mut m)[mo..mo + n],
                    &mut cpu_f32(&mut v)[vo..vo + n],
                    vms,
                    &c,
                )
            }
            (Storage::Cuda(p), Storage::Cuda(g)) => {
                let [po, go, mo, vo] = offs;
                let ptrs =
                    [cuda_ptr(&m, mo), cuda_ptr(&v, vo), vm.as_ref().map_or(0, |(o, s)| cuda_ptr(s, *o))];
                cuda::adamw(p, po, g, go, ptrs, n, &c)
            }
            _ => unreachable!("adamw_step_: devices were checked"),
        }
    }

    /// The checks of `sgd_step_`: returns the gradient (contiguous) and the momentum buffer
    /// when momentum is used.
    pub(crate) fn check_sgd<'a>(
        &self,
        grad: &Tensor,
        momentum_buf: Option<&'a Tensor>,
        cfg: &SgdStep,
    ) -> (Tensor, Option<&'a Tensor>) {
        let op = "sgd_step_";
        self.check_master(op, "param");
        let grad = checked_grad(self, grad, op);
        let has_buf = cfg.momentum != 0.0;
        assert!(
            !has_buf || momentum_buf.is_some(),
            "{op}: momentum is {} but no momentum buffer was given",
            cfg.momentum
        );
        let buf = if has_buf { momentum_buf } else { None };
        if let Some(b) = buf {
            check_state(self, b, op, "momentum_buffer");
        }
        (grad, buf)
    }

    /// The checks of `adamw_step_`: returns the gradient (contiguous).
    pub(crate) fn check_adamw(
        &self,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        max_exp_avg_sq: Option<&Tensor>,
    ) -> Tensor {
        let op = "adamw_step_";
        self.check_master(op, "param");
        let grad = checked_grad(self, grad, op);
        check_state(self, exp_avg, op, "exp_avg");
        check_state(self, exp_avg_sq, op, "exp_avg_sq");
        assert!(!exp_avg.same_storage(exp_avg_sq), "{op}: exp_avg and exp_avg_sq share storage");
        if let Some(vm) = max_exp_avg_sq {
            check_state(self, vm, op, "max_exp_avg_sq");
            assert!(
                !vm.same_storage(exp_avg) && !vm.same_storage(exp_avg_sq),
                "{op}: max_exp_avg_sq shares storage with another state buffer"
            );
        }
        grad
    }

    /// Panics naming `op` unless this is a contiguous f32 tensor (a master weight or state).
    fn check_master(&self, op: &str, what: &str) {
        assert!(
            self.dtype() == DType::F32,
            "{op}: {what} must be f32 (fp32 master weights), got {} with shape {:?}",
            self.dtype(),
            self.dims()
        );
        assert!(
            self.is_contiguous(),
            "{op}: {what} must be contiguous, got shape {:?} with strides {:?}",
            self.dims(),
            self.strides()
        );
    }
}

/// The gradient, contiguous (a contiguous view stays a view: the kernels take its offset),
/// after checking its shape, dtype and device against `param`.
fn checked_grad(param: &Tensor, grad: &Tensor, op: &str) -> Tensor {
    param.same_device(grad, op);
    assert!(
        grad.dims() == param.dims(),
        "{op}: gradient of shape {:?} for a parameter of shape {:?}",
        grad.dims(),
        param.dims()
    );
    assert!(
        matches!(grad.dtype(), DType::F32 | DType::BF16 | DType::F16),
        "{op}: gradient must be f32, bf16 or f16, got {}",
        grad.dtype()
    );
    assert!(!grad.same_storage(param), "{op}: the gradient shares storage with the parameter");
    if grad.is_contiguous() {
        grad.clone()
    } else {
        grad.contiguous()
    }
}

/// Panics unless `state` is a contiguous f32 buffer of the parameter's shape, on its device,
/// with storage of its own (it is written alongside the parameter).
fn check_state(param: &Tensor, state: &Tensor, op: &str, what: &str) {
    param.same_device(state, op);
    state.check_master(op, what);
    assert!(
        state.dims() == param.dims(),
        "{op}: {what} of shape {:?} for a parameter of shape {:?}",
        state.dims(),
        param.dims()
    );
    assert!(!state.same_storage(param), "{op}: {what} shares storage with the parameter");
}

fn cpu_f32(s: &mut Storage) -> &mut [f32] {
    match s {
        Storage::Cpu(s) => s.as_mut_slice::<f32>(),
        Storage::Cuda(_) => unreachable!("devices were checked"),
    }
}

fn cuda_ptr(s: &Storage, offset: usize) -> u64 {
    match s {
        Storage::Cuda(s) => s.ptr() + (offset * s.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("devices were checked"),
    }
}
