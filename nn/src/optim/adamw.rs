//! `AdamW`: Adam with decoupled weight decay.

use super::groups::{hypers, GroupConfig, Groups, IntoParamGroups};
use super::sgd::{is_master, with_master};
use super::state::state_dtype;
use oxtrain_tensor::{AdamWParam, AdamWStep, DType, MultiTensorStep, Tensor};
use std::collections::BTreeMap;

/// Hyper-parameters of [`AdamW`], PyTorch's names and defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled: `p *= 1 - lr * weight_decay` before the Adam update.
    pub weight_decay: f64,
    pub amsgrad: bool,
    pub maximize: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl GroupConfig for AdamWConfig {
    hypers! { Num "lr" => lr, Num "beta1" => betas.0, Num "beta2" => betas.1, Num "eps" => eps,
    Num "weight_decay" => weight_decay, Flag "amsgrad" => amsgrad, Flag "maximize" => maximize }
}

/// `torch.optim.AdamW`: per parameter, in one fused pass, `p *= 1 - lr*wd`,
/// `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g²` (AMSGrad: `vmax = max(vmax, v)` used below),
/// `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`. On CUDA the f32 parameters
/// of a group are updated by one launch (`MultiTensorStep`).
pub struct AdamW {
    pub(crate) held: Groups<AdamWConfig>,
    fused: MultiTensorStep,
}

impl AdamW {
    pub fn new(params: impl IntoParamGroups, config: AdamWConfig) -> AdamW {
        let (b1, b2) = config.betas;
        assert!(
            (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2),
            "AdamW: betas must be in [0, 1), got {:?}",
            config.betas
        );
        AdamW { held: Groups::new(params, &config, "AdamW"), fused: MultiTensorStep::new() }
    }

    fn update(&mut self) {
        let AdamW { held, fused } = self;
        held.for_each_group(|c, members| {
            // By step count (its bias corrections), the same for a whole group but for
            // parameters that missed steps.
            let mut lists: BTreeMap<u64, Vec<AdamWParam>> = BTreeMap::new();
            for (p, grad, st) in members {
                st.step += 1;
                let step = adamw_step(c, st.step);
                let (m, v) = (st.buffer("exp_avg", p), st.buffer("exp_avg_sq", p));
                let vmax = c.amsgrad.then(|| st.buffer("max_exp_avg_sq", p));
                if state_dtype(p) == DType::F64 {
                    adamw_composed(p.tensor(), &grad.to_dtype(DType::F64), (&m, &v, vmax.as_ref()), &step);
                } else if is_master(p) {
                    lists.entry(st.step).or_default().push(AdamWParam {
                        param: p.tensor().clone(),
                        grad,
                        exp_avg: m,
                        exp_avg_sq: v,
                        max_exp_avg_sq: vmax,
                    });
                } else {
                    with_master(p, |master| master.adamw_step_(&grad, &m, &v, vmax.as_ref(), &step));
                }
            }
            for (step, list) in &lists {
                fused.adamw_step_(list, &adamw_step(c, *step));
            }
        });
    }
}

fn adamw_step(c: &AdamWConfig, step: u64) -> AdamWStep {
    AdamWStep {
        lr: c.lr,
        beta1: c.betas.0,
        beta2: c.betas.1,
        eps: c.eps,
        weight_decay: c.weight_decay,
        step,
        maximize: c.maximize,
    }
}

/// The AdamW step of f64 parameters, from tensor ops in f64 (the fused kernel is f32-only).
fn adamw_composed(
    p: &Tensor,
    grad: &Tensor,
    (m, v, vmax): (&Tensor, &Tensor, Option<&Tensor>),
    s: &AdamWStep,
) {
    let g = if s.maximize { grad.neg() } else { grad.clone() };
    if s.weight_decay != 0.0 {
        p.copy_(&p.mul_scalar(1.0 - s.lr * s.weight_decay));
    }
    m.copy_(&m.mul_scalar(s.beta1).add(&g.mul_scalar(1.0 - s.beta1)));
    v.copy_(&v.mul_scalar(s.beta2).add(&g.square().mul_scalar(1.0 - s.beta2)));
    let second = match vmax {
        Some(vmax) => {
            vmax.copy_(&vmax.maximum(v));
            vmax.clone()
        }
        None => v.clone(),
    };
    let t = s.step as i32;
    let (bias1, bias2) = (1.0 - s.beta1.powi(t), 1.0 - s.beta2.powi(t));
    let denom = second.sqrt().mul_scalar(1.0 / bias2.sqrt()).add_scalar(s.eps);
    p.copy_(&p.sub(&m.div(&denom).mul_scalar(s.lr / bias1)));
}

super::impl_optimizer!(AdamW, AdamWConfig);
