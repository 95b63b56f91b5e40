//! `Lars`: layer-wise adaptive rate scaling for large-batch training (You et al. 2017).
//!
//! The formula is the MLPerf ResNet-50 reference's (TensorFlow `LARSOptimizer`, also what
//! NVIDIA's MLPerf submissions implement), with the learning rate inside the momentum:
//!
//! ```text
//! trust = eta * ||p|| / (||g|| + wd * ||p|| + eps)   if ||p|| > 0 and ||g|| > 0, else 1
//! v     = momentum * v + lr * trust * (g + wd * p)
//! p     = p - v                                      (Nesterov: p - (momentum * v + lr * trust * (g + wd * p)))
//! ```
//!
//! Groups marked `lars_exclude` (biases and norm parameters, see
//! [`decay_groups`](super::decay_groups)) use `trust = 1`: plain momentum SGD with their own
//! weight decay, usually 0. Norms and the trust ratio stay on the device: no host sync.

use super::groups::{hypers, GroupConfig, Groups, IntoParamGroups};
use super::state::state_dtype;
use oxtrain_tensor::{CmpOp, Tensor};

/// Hyper-parameters of [`Lars`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LarsConfig {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    /// The trust coefficient `eta`.
    pub trust_coefficient: f64,
    pub eps: f64,
    pub nesterov: bool,
    /// Skip the trust ratio (set per group through `ParamGroupSpec::lars_exclude`).
    pub exclude: bool,
}

impl Default for LarsConfig {
    fn default() -> Self {
        LarsConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 5e-5,
            trust_coefficient: 1e-3,
            eps: 0.0,
            nesterov: false,
            exclude: false,
        }
    }
}

impl GroupConfig for LarsConfig {
    hypers! { Num "lr" => lr, Num "momentum" => momentum, Num "weight_decay" => weight_decay,
    Num "trust_coefficient" => trust_coefficient, Num "eps" => eps, Flag "nesterov" => nesterov,
    Flag "lars_exclude" => exclude }
}

/// LARS with momentum; see the module docs for the formula.
pub struct Lars {
    pub(crate) held: Groups<LarsConfig>,
    /// Under ZeRO-1, where each parameter is a slice: the norms of the whole parameters, set
    /// for the next step by
    /// [`Optimizer::set_whole_parameter_norms`](super::Optimizer::set_whole_parameter_norms).
    whole_norms: Option<Vec<(Tensor, Tensor)>>,
}

impl Lars {
    pub fn new(params: impl IntoParamGroups, config: LarsConfig) -> Lars {
        Lars { held: Groups::new(params, &config, "Lars"), whole_norms: None }
    }

    fn update(&mut self) {
        let whole = self.whole_norms.take();
        self.held.for_each_grad_at(|index, c, p, grad, st| {
            let dtype = state_dtype(p);
            let w = p.tensor().to_dtype(dtype);
            let gr = grad.to_dtype(dtype);
            let d = if c.weight_decay != 0.0 { gr.add(&w.mul_scalar(c.weight_decay)) } else { gr.clone() };
            // lr * trust as a rank-0 tensor, so the norms never leave the device.
            let scale = if c.exclude {
                w.scalar_like(c.lr)
            } else {
                let (w_norm, g_norm) = match whole.as_ref().and_then(|n| n.get(index)) {
                    Some((w_norm, g_norm)) => (w_norm.to_dtype(dtype), g_norm.to_dtype(dtype)),
                    None => (w.square().sum_all().sqrt(), gr.square().sum_all().sqrt()),
                };
                let ratio = w_norm
                    .mul_scalar(c.trust_coefficient)
                    .div(&g_norm.add(&w_norm.mul_scalar(c.weight_decay)).add_scalar(c.eps));
                let both_positive = w_norm.mul(&g_norm).cmp_scalar(0.0, CmpOp::Gt);
                both_positive.where_cond(&ratio, &ratio.ones_like()).mul_scalar(c.lr)
            };
            let scaled = d.mul(&scale);
            let buf = st.buffer("momentum_buffer", p);
            let v = buf.mul_scalar(c.momentum).add(&scaled);
            buf.copy_(&v);
            let delta = if c.nesterov { v.mul_scalar(c.momentum).add(&scaled) } else { v };
            p.tensor().copy_(&w.sub(&delta));
        });
    }
}

super::impl_optimizer!(Lars, LarsConfig, {
    fn set_whole_parameter_norms(&mut self, norms: Vec<(Tensor, Tensor)>) -> bool {
        self.whole_norms = Some(norms);
        true
    }
});
