//! Parameter groups: which parameters share hyper-parameters, and the usual decay/no-decay split.

use super::state::{ParamState, StateTable};
use oxtrain_autograd::Var;
use oxtrain_tensor::Tensor;
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
/// A hyper-parameter of an optimizer's config, borrowed for reading or setting by name.
pub(crate) enum Hyper<'a> {
    Num(&'a mut f64),
    /// A boolean, saved as 0 or 1 (as torch's `param_groups` JSON holds it).
    Flag(&'a mut bool),
}

/// Implements [`GroupConfig::hypers`] from a table of `Kind "torch name" => field`.
macro_rules! hypers {
    ($($kind:ident $name:literal => $($field:tt).+),* $(,)?) => {
        fn hypers(&mut self) -> Vec<(&'static str, $crate::optim::groups::Hyper<'_>)> {
            vec![$(($name, $crate::optim::groups::Hyper::$kind(&mut self.$($field).+))),*]
        }
    };
}
pub(crate) use hypers;

/// An optimizer's config as its groups hold it. The optimizer lists its hyper-parameters by
/// their PyTorch names; the overrides of a spec, saving and loading follow from that list.
pub(crate) trait GroupConfig: Clone {
    /// Every hyper-parameter, by the name torch's `param_groups` uses for it.
    fn hypers(&mut self) -> Vec<(&'static str, Hyper<'_>)>;

    /// The config with a spec's overrides applied (`lr`, `weight_decay`, `lars_exclude`).
    fn with_spec(&self, spec: &ParamGroupSpec) -> Self {
        let mut config = self.clone();
        for (name, hyper) in config.hypers() {
            match (name, hyper) {
                ("lr", Hyper::Num(v)) => *v = spec.lr.unwrap_or(*v),
                ("weight_decay", Hyper::Num(v)) => *v = spec.weight_decay.unwrap_or(*v),
                ("lars_exclude", Hyper::Flag(b)) => *b |= spec.lars_exclude,
                _ => {}
            }
        }
        config
    }

    /// Hyper-parameters by name (booleans as 0 and 1).
    fn to_map(&self) -> BTreeMap<String, f64> {
        let mut config = self.clone();
        let hypers = config.hypers();
        hypers
            .into_iter()
            .map(|(name, hyper)| match hyper {
                Hyper::Num(v) => (name.to_string(), *v),
                Hyper::Flag(b) => (name.to_string(), *b as u8 as f64),
            })
            .collect()
    }

    /// Sets the hyper-parameters `map` names (others keep their values).
    fn set_from_map(&mut self, map: &BTreeMap<String, f64>) {
        for (name, hyper) in self.hypers() {
            match (map.get(name), hyper) {
                (Some(&x), Hyper::Num(v)) => *v = x,
                (Some(&x), Hyper::Flag(b)) => *b = x != 0.0,
                (None, _) => {}
            }
        }
    }
}

/// What every optimizer holds: its parameter groups and their per-parameter state. The
/// optimizers differ only in their config and their update; this is the rest.
pub(crate) struct Groups<C> {
    pub(crate) groups: Vec<ParamGroup<C>>,
    pub(crate) state: StateTable,
}

impl<C: GroupConfig> Groups<C> {
    /// The groups of a new optimizer `op` from `params` (panics on an empty list or a
    /// non-parameter, as torch raises).
    pub(crate) fn new(params: impl IntoParamGroups, defaults: &C, op: &str) -> Groups<C> {
        Groups { groups: build(params.into_param_groups(), defaults, op), state: StateTable::default() }
    }

    /// Calls `f(index, group config, parameter, gradient, state)` for every parameter with a
    /// gradient, `index` being the state's numbering (the order over all groups).
    pub(crate) fn for_each_grad_at(&mut self, mut f: impl FnMut(usize, &C, &Var, Tensor, &mut ParamState)) {
        let params = self.groups.iter().flat_map(|g| g.params.iter().map(move |p| (&g.config, p)));
        for (index, (config, p)) in params.enumerate() {
            if let Some(grad) = p.grad() {
                f(index, config, p, grad, self.state.get_mut(index));
            }
        }
    }

    /// Calls `f(group config, [(parameter, gradient, state)])` once per group with the group's
    /// parameters that have a gradient, in the state's numbering: for updates that take a
    /// whole group at once.
    pub(crate) fn for_each_group(&mut self, mut f: impl FnMut(&C, Vec<(&Var, Tensor, &mut ParamState)>)) {
        let total: usize = self.groups.iter().map(|g| g.params.len()).sum();
        if total > 0 {
            self.state.get_mut(total - 1);
        }
        let mut states = self.state.params.iter_mut();
        for g in &self.groups {
            let members = g
                .params
                .iter()
                .zip(states.by_ref())
                .filter_map(|(p, st)| p.grad().map(|grad| (p, grad, st)))
                .collect();
            f(&g.config, members);
        }
    }
}

/// Builds the groups of a new optimizer from specs and its defaults.
fn build<C: GroupConfig>(specs: Vec<ParamGroupSpec>, defaults: &C, op: &str) -> Vec<ParamGroup<C>> {
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
