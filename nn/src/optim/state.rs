//! Per-parameter optimizer state, and its saved form: named tensors plus JSON hyper-parameters.

use super::groups::{GroupConfig, ParamGroup};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Error, Result, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The hyper-parameters of one saved group, and the state indices of its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroupState {
    pub params: Vec<usize>,
    /// By PyTorch's names (`lr`, `momentum`, `weight_decay`, `initial_lr`, ...); flags are 0/1.
    pub hyper: BTreeMap<String, f64>,
}

/// An optimizer's saved state (`optimizer.state_dict()`): tensors named
/// `state.<index>.<buffer>` (`state.0.exp_avg`, `state.0.step`, ...) with `index` the
/// parameter's position over all groups, and the groups' hyper-parameters. A trainer writes
/// the tensors to safetensors and the groups to JSON ([`OptimizerState::save`] does both in
/// one file, the JSON in the safetensors metadata).
#[derive(Debug, Clone)]
pub struct OptimizerState {
    pub tensors: BTreeMap<String, Tensor>,
    pub param_groups: Vec<ParamGroupState>,
}

const GROUPS_KEY: &str = "param_groups";

impl OptimizerState {
    /// The groups as JSON: `[{"params": [0, 1], "lr": 0.1, ...}, ...]`.
    pub fn param_groups_json(&self) -> String {
        let groups: Vec<serde_json::Value> = self
            .param_groups
            .iter()
            .map(|g| {
                let mut m = serde_json::Map::new();
                m.insert("params".into(), serde_json::json!(g.params));
                for (k, v) in &g.hyper {
                    m.insert(k.clone(), serde_json::json!(v));
                }
                serde_json::Value::Object(m)
            })
            .collect();
        serde_json::Value::Array(groups).to_string()
    }

    /// Parses what [`OptimizerState::param_groups_json`] wrote.
    pub fn parse_param_groups(json: &str) -> Result<Vec<ParamGroupState>> {
        let bad = |what: &str| Error::Msg(format!("optimizer state: {what} in the param_groups JSON"));
        let v: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
        let groups = v.as_array().ok_or_else(|| bad("expected a list of groups"))?;
        groups
            .iter()
            .map(|g| {
                let obj = g.as_object().ok_or_else(|| bad("a group that is not an object"))?;
                let mut state = ParamGroupState { params: vec![], hyper: BTreeMap::new() };
                for (k, v) in obj {
                    if k == "params" {
                        state.params = serde_json::from_value(v.clone()).map_err(|_| bad("bad `params`"))?;
                    } else {
                        let x = v.as_f64().ok_or_else(|| bad(&format!("`{k}` is not a number")))?;
                        state.hyper.insert(k.clone(), x);
                    }
                }
                Ok(state)
            })
            .collect()
    }

    /// Writes the state to one safetensors file (groups in its metadata).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let meta = HashMap::from([(GROUPS_KEY.to_string(), self.param_groups_json())]);
        let tensors: Vec<(String, Tensor)> =
            self.tensors.iter().map(|(k, t)| (k.clone(), t.clone())).collect();
        oxtrain_tensor::safetensors::save(tensors, Some(&meta), path)
    }

    /// Reads a file written by [`OptimizerState::save`] (tensors on the CPU; loading into an
    /// optimizer moves them to its parameters' devices).
    pub fn load(path: impl AsRef<Path>) -> Result<OptimizerState> {
        let path = path.as_ref();
        let file = oxtrain_tensor::safetensors::load(path)?;
        let json = file.metadata().get(GROUPS_KEY).ok_or_else(|| {
            Error::Msg(format!("{}: no `{GROUPS_KEY}` metadata; not an optimizer state file", path.display()))
        })?;
        let param_groups = Self::parse_param_groups(json)?;
        let mut tensors = BTreeMap::new();
        for name in file.names() {
            tensors.insert(name.clone(), file.get(name)?);
        }
        Ok(OptimizerState { tensors, param_groups })
    }
}

/// One parameter's state: the steps taken (AdamW's bias correction) and named buffers (f32,
/// or f64 for an f64 parameter).
#[derive(Debug, Clone, Default)]
pub(crate) struct ParamState {
    pub step: u64,
    pub buffers: BTreeMap<String, Tensor>,
}

/// The dtype of a parameter's state and update arithmetic: f64 for an f64 parameter, so a
/// whole run can be checked in f64; else f32, the master precision of the fused steps.
pub(crate) fn state_dtype(p: &Var) -> DType {
    if p.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl ParamState {
    /// The buffer `name` of parameter `p`, zeros in `state_dtype(p)` the first time.
    pub fn buffer(&mut self, name: &str, p: &Var) -> Tensor {
        self.buffers
            .entry(name.into())
            .or_insert_with(|| Tensor::zeros(p.dims(), state_dtype(p), p.device()).expect("state buffer"))
            .clone()
    }
}

/// The state of all parameters, by position over all groups.
#[derive(Debug, Clone, Default)]
pub(crate) struct StateTable {
    pub params: Vec<ParamState>,
}

impl StateTable {
    pub fn get_mut(&mut self, index: usize) -> &mut ParamState {
        if self.params.len() <= index {
            self.params.resize_with(index + 1, ParamState::default);
        }
        &mut self.params[index]
    }

    /// The state as named tensors: copies of the buffers, or (`shared`) the buffers themselves.
    pub fn to_state<C: GroupConfig>(&self, groups: &[ParamGroup<C>], shared: bool) -> OptimizerState {
        let mut tensors = BTreeMap::new();
        for (i, s) in self.params.iter().enumerate() {
            if s.step > 0 {
                let step = Tensor::scalar(s.step as i64, oxtrain_tensor::Device::Cpu).expect("host scalar");
                tensors.insert(format!("state.{i}.step"), step);
            }
            for (name, t) in &s.buffers {
                tensors.insert(format!("state.{i}.{name}"), if shared { t.clone() } else { t.copy() });
            }
        }
        let mut next = 0;
        let param_groups = groups
            .iter()
            .map(|g| {
                let mut hyper = g.config.to_map();
                if let Some(lr) = g.initial_lr {
                    hyper.insert("initial_lr".into(), lr);
                }
                let params = (next..next + g.params.len()).collect();
                next += g.params.len();
                ParamGroupState { params, hyper }
            })
            .collect();
        OptimizerState { tensors, param_groups }
    }

    pub fn load<C: GroupConfig>(
        &mut self,
        groups: &mut [ParamGroup<C>],
        state: &OptimizerState,
    ) -> Result<()> {
        let err = |m: String| Err(Error::Msg(format!("load_state_dict: {m}")));
        if state.param_groups.len() != groups.len() {
            return err(format!(
                "the saved state has {} parameter groups, this optimizer {}",
                state.param_groups.len(),
                groups.len()
            ));
        }
        let params: Vec<_> = groups.iter().flat_map(|g| g.params.iter().cloned()).collect();
        let mut next = 0;
        for (i, (saved, g)) in state.param_groups.iter().zip(groups.iter()).enumerate() {
            let expect: Vec<usize> = (next..next + g.params.len()).collect();
            next += g.params.len();
            if saved.params != expect {
                return err(format!(
                    "group {i} holds parameters {:?} in the saved state, {expect:?} here; build the optimizer \
                     with the same parameter groups as the one that was saved",
                    saved.params
                ));
            }
        }
        let mut table: Vec<ParamState> = (0..params.len()).map(|_| ParamState::default()).collect();
        for (name, t) in &state.tensors {
            let parts: Vec<&str> = name.splitn(3, '.').collect();
            let (Some(&"state"), Some(idx), Some(buf)) = (parts.first(), parts.get(1), parts.get(2)) else {
                return err(format!("unexpected tensor `{name}` (expected state.<index>.<name>)"));
            };
            let Ok(idx) = idx.parse::<usize>() else { return err(format!("bad index in `{name}`")) };
            let Some(p) = params.get(idx) else {
                return err(format!("`{name}` is for parameter {idx}, this optimizer has {}", params.len()));
            };
            if *buf == "step" {
                table[idx].step = t.item() as u64;
                continue;
            }
            if t.dims() != p.dims() {
                return err(format!("`{name}` has shape {:?}, the parameter {:?}", t.dims(), p.dims()));
            }
            let moved = t.to_device(p.device())?.to_dtype(DType::F32).copy();
            table[idx].buffers.insert(buf.to_string(), moved);
        }
        for (saved, g) in state.param_groups.iter().zip(groups.iter_mut()) {
            g.config.set_from_map(&saved.hyper);
            if let Some(&lr) = saved.hyper.get("initial_lr") {
                g.initial_lr = Some(lr);
            }
        }
        self.params = table;
        Ok(())
    }
}
