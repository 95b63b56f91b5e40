//! `Sgd`: stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use super::groups::{hypers, GroupConfig, Groups, IntoParamGroups};
use super::state::state_dtype;
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, MultiTensorStep, SgdParam, SgdStep, Tensor};

/// Hyper-parameters of [`Sgd`], PyTorch's names and defaults (`lr` 1e-3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    /// L2 penalty added to the gradient (coupled, as `torch.optim.SGD`).
    pub weight_decay: f64,
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl GroupConfig for SgdConfig {
    hypers! { Num "lr" => lr, Num "momentum" => momentum, Num "dampening" => dampening,
    Flag "nesterov" => nesterov, Num "weight_decay" => weight_decay, Flag "maximize" => maximize }
}

/// `torch.optim.SGD`: `d = g + wd * p`; with momentum `buf = momentum * buf + (1 - dampening) * d`
/// (`buf = d` on the first step), `d = d + momentum * buf` (Nesterov) or `d = buf`; `p -= lr * d`.
/// On CUDA the f32 parameters of a group are updated by one launch (`MultiTensorStep`).
pub struct Sgd {
    pub(crate) held: Groups<SgdConfig>,
    fused: MultiTensorStep,
}

impl Sgd {
    /// `params`: a `Vec<Var>` (one group) or `Vec<ParamGroupSpec>` with per-group overrides.
    pub fn new(params: impl IntoParamGroups, config: SgdConfig) -> Sgd {
        assert!(
            !config.nesterov || (config.momentum > 0.0 && config.dampening == 0.0),
            "Sgd: Nesterov momentum requires a momentum and zero dampening"
        );
        Sgd { held: Groups::new(params, &config, "Sgd"), fused: MultiTensorStep::new() }
    }

    fn update(&mut self) {
        let Sgd { held, fused } = self;
        held.for_each_group(|c, members| {
            let step = SgdStep {
                lr: c.lr,
                momentum: c.momentum,
                dampening: c.dampening,
                nesterov: c.nesterov,
                weight_decay: c.weight_decay,
                maximize: c.maximize,
            };
            // By whether this is the buffer's first step (it starts from the gradient).
            let mut lists: [Vec<SgdParam>; 2] = [vec![], vec![]];
            for (p, grad, st) in members {
                let first = !st.buffers.contains_key(MOMENTUM);
                let buf = (c.momentum != 0.0).then(|| st.buffer(MOMENTUM, p));
                if state_dtype(p) == DType::F64 {
                    sgd_composed(p.tensor(), &grad.to_dtype(DType::F64), buf.as_ref(), first, c);
                } else if is_master(p) {
                    lists[first as usize].push(SgdParam {
                        param: p.tensor().clone(),
                        grad,
                        momentum_buf: buf,
                    });
                } else {
                    with_master(p, |master| master.sgd_step_(&grad, buf.as_ref(), first, &step));
                }
            }
            for (first, list) in [false, true].into_iter().zip(&lists) {
                if !list.is_empty() {
                    fused.sgd_step_(list, first, &step);
                }
            }
        });
    }
}

const MOMENTUM: &str = "momentum_buffer";

/// The SGD step of f64 parameters, from tensor ops in f64 (the fused kernel is f32-only).
fn sgd_composed(p: &Tensor, grad: &Tensor, buf: Option<&Tensor>, first: bool, c: &SgdConfig) {
    let g = if c.maximize { grad.neg() } else { grad.clone() };
    let mut d = if c.weight_decay != 0.0 { g.add(&p.mul_scalar(c.weight_decay)) } else { g };
    if let Some(buf) = buf {
        let b =
            if first { d.clone() } else { buf.mul_scalar(c.momentum).add(&d.mul_scalar(1.0 - c.dampening)) };
        buf.copy_(&b);
        d = if c.nesterov { d.add(&b.mul_scalar(c.momentum)) } else { b };
    }
    p.copy_(&p.sub(&d.mul_scalar(c.lr)));
}

super::impl_optimizer!(Sgd, SgdConfig);

/// Whether the fused steps update this parameter in place: contiguous f32.
pub(crate) fn is_master(p: &Var) -> bool {
    p.dtype() == DType::F32 && p.tensor().is_contiguous()
}

/// Runs a fused step on the parameter itself when it is contiguous f32, else on an f32 copy
/// that is written back (bf16 parameters, non-contiguous views).
pub(crate) fn with_master(p: &Var, f: impl FnOnce(&Tensor)) {
    let t = p.tensor();
    if is_master(p) {
        f(t);
    } else {
        let master = t.to_dtype(DType::F32).copy();
        f(&master);
        t.copy_(&master);
    }
}
