//! Parameter groups: which parameters share hyper-parameters, and the usual decay/no-decay split.

use oxtrain_autograd::Var;
use std::collections::BTreeMap;

/// One group as an optimizer holds it: its parameters and its own copy of the hyper-parameters
/// (`C` is the optimizer's config), which may be changed between steps.
#[derive(Debug, Clone)]
pub struct ParamGroup<C> {
    pub params: Vec<Var>,
    pub config: C,
    /// Set by the first LR scheduler attached (`group["initial_lr"]`).
    pub initial_lr: Option<f64>,
}

/// A group as the user asks for it: parameters plus overrides of the optimizer's defaults
/// (`{"params": ..., "weight_decay": 0.0}` in PyTorch).
#[derive(Debug, Clone, Default)]
pub struct ParamGroupSpec {
    pub params: Vec<Var>,
    pub lr: Option<f64>,
    pub weight_decay: Option<f64>,
    /// Leave these parameters out of LARS's trust-ratio scaling (biases, norm weights).
    pub lars_exclude: bool,
}

impl ParamGroupSpec {
    pub fn new(params: Vec<Var>) -> Self {
        ParamGroupSpec { params, ..Default::default() }
    }

    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = Some(lr);
        self
    }

    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = Some(weight_decay);
        self
    }

    pub fn lars_exclude(mut self, exclude: bool) -> Self {
        self.lars_exclude = exclude;
        self
    }
}

/// What optimizer constructors take: a list of parameters (one group) or group specs.
pub trait IntoParamGroups {
    fn into_param_groups(self) -> Vec<ParamGroupSpec>;
}

impl IntoParamGroups for Vec<Var> {
    fn into_param_groups(self) -> Vec<ParamGroupSpec> {
        vec![ParamGroupSpec::new(self)]
    }
}

impl IntoParamGroups for &[Var] {
    fn into_param_groups(self) -> Vec<ParamGroupSpec> {
        vec![ParamGroupSpec::new(self.to_vec())]
    }
}

impl IntoParamGroups for Vec<ParamGroupSpec> {
    fn into_param_groups(self) -> Vec<ParamGroupSpec> {
        self
    }
}

impl IntoParamGroups for ParamGroupSpec {
    fn into_param_groups(self) -> Vec<ParamGroupSpec> {
        vec![self]
    }
}

/// Splits named parameters into two groups, the usual recipe for AdamW and LARS: weights of
/// rank 2 and more get `weight_decay`; biases and every 1-d parameter (norm scales and shifts)
/// get none and are excluded from LARS. Empty groups are dropped.
pub fn decay_groups(named: Vec<(String, Var)>, weight_decay: f64) -> Vec<ParamGroupSpec> {
    let (mut decay, mut no_decay) = (vec![], vec![]);
    for (name, p) in named {
        if p.rank() <= 1 || name.ends_with(".bias") || name == "bias" {
            no_decay.push(p);
        } else {
            decay.push(p);
        }
    }
    let mut groups = vec![];
    if !decay.is_empty() {
        groups.push(ParamGroupSpec::new(decay).weight_decay(weight_decay));
    }
    if !no_decay.is_empty() {
        groups.push(ParamGroupSpec::new(no_decay).weight_decay(0.0).lars_exclude(true));
    }
    groups
}

/// The hyper-parameters of an optimizer's config, by PyTorch's names, for checkpoints.
pub(crate) trait GroupConfig: Clone {
    /// The config with a spec's overrides applied.
    fn with_spec(&self, spec: &ParamGroupSpec) -> Self;
    /// Hyper-parameters by name (booleans as 0 and 1).
    fn to_map(&self) -> BTreeMap<String, f64>;
    /// Sets the hyper-parameters `map` names (others keep their values).
    fn set_from_map(&mut self, map: &BTreeMap<String, f64>);
}

/// Builds the groups of a new optimizer from specs and its defaults.
pub(crate) fn build<C: GroupConfig>(
    specs: Vec<ParamGroupSpec>,
    defaults: &C,
    op: &str,
) -> Vec<ParamGroup<C>> {
    assert!(!specs.is_empty(), "{op}: got no parameter groups");
    let groups: Vec<ParamGroup<C>> = specs
        .into_iter()
        .map(|s| ParamGroup { config: defaults.with_spec(&s), params: s.params, initial_lr: None })
        .collect();
    for g in &groups {
        for p in &g.params {
            assert!(
                p.requires_grad() && p.is_leaf(),
                "{op}: can only optimize parameters (Var::parameter), got {p:?}"
            );
        }
    }
    groups
}
