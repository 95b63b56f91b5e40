//! `AdamW`: Adam with decoupled weight decay.

use super::groups::{build, GroupConfig, IntoParamGroups, ParamGroup, ParamGroupSpec};
use super::sgd::with_master;
use super::state::StateTable;
use oxtrain_tensor::{AdamWStep, DType, Tensor};
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
    fn with_spec(&self, spec: &ParamGroupSpec) -> Self {
        AdamWConfig {
            lr: spec.lr.unwrap_or(self.lr),
            weight_decay: spec.weight_decay.unwrap_or(self.weight_decay),
            ..*self
        }
    }
    fn to_map(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([
            ("lr".into(), self.lr),
            ("beta1".into(), self.betas.0),
            ("beta2".into(), self.betas.1),
            ("eps".into(), self.eps),
            ("weight_decay".into(), self.weight_decay),
            ("amsgrad".into(), self.amsgrad as u8 as f64),
            ("maximize".into(), self.maximize as u8 as f64),
        ])
    }
    fn set_from_map(&mut self, m: &BTreeMap<String, f64>) {
        let get = |k: &str, v: f64| m.get(k).copied().unwrap_or(v);
        self.lr = get("lr", self.lr);
        self.betas = (get("beta1", self.betas.0), get("beta2", self.betas.1));
        self.eps = get("eps", self.eps);
        self.weight_decay = get("weight_decay", self.weight_decay);
        self.amsgrad = get("amsgrad", self.amsgrad as u8 as f64) != 0.0;
        self.maximize = get("maximize", self.maximize as u8 as f64) != 0.0;
    }
}

/// `torch.optim.AdamW`: per parameter, in one fused pass, `p *= 1 - lr*wd`,
/// `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g²` (AMSGrad: `vmax = max(vmax, v)` used below),
/// `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
pub struct AdamW {
    pub(crate) groups: Vec<ParamGroup<AdamWConfig>>,
    pub(crate) state: StateTable,
}

impl AdamW {
    pub fn new(params: impl IntoParamGroups, config: AdamWConfig) -> AdamW {
        let (b1, b2) = config.betas;
        assert!(
            (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2),
            "AdamW: betas must be in [0, 1), got {:?}",
            config.betas
        );
        AdamW { groups: build(params.into_param_groups(), &config, "AdamW"), state: StateTable::default() }
    }

    pub fn param_groups(&self) -> &[ParamGroup<AdamWConfig>] {
        &self.groups
    }

    pub fn param_groups_mut(&mut self) -> &mut [ParamGroup<AdamWConfig>] {
        &mut self.groups
    }

    fn update(&mut self) {
        let mut index = 0;
        for g in &self.groups {
            let c = g.config;
            for p in &g.params {
                let i = index;
                index += 1;
                let Some(grad) = p.grad() else { continue };
                let st = self.state.get_mut(i);
                st.step += 1;
                let t = st.step;
                let mut buffer = |name: &str| {
                    st.buffers
                        .entry(name.into())
                        .or_insert_with(|| {
                            Tensor::zeros(p.dims(), DType::F32, p.device()).expect("state buffer")
                        })
                        .clone()
                };
                let (m, v) = (buffer("exp_avg"), buffer("exp_avg_sq"));
                let vmax = c.amsgrad.then(|| buffer("max_exp_avg_sq"));
                let step = AdamWStep {
                    lr: c.lr,
                    beta1: c.betas.0,
                    beta2: c.betas.1,
                    eps: c.eps,
                    weight_decay: c.weight_decay,
                    step: t,
                    maximize: c.maximize,
                };
                with_master(p, |master| master.adamw_step_(&grad, &m, &v, vmax.as_ref(), &step));
            }
        }
    }
}

super::impl_optimizer!(AdamW);
