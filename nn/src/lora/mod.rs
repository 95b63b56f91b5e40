//! LoRA (Hu et al., 2021) as PEFT implements it: a layer's frozen weight `W` plus a trainable
//! low-rank update, `y = base(x) + scale * B(A(dropout(x)))` with `A` `[rank, in]`
//! (PyTorch's `nn.Linear` initialisation), `B` `[out, rank]` (zeros) and `scale = alpha / rank`.
//!
//! [`LoraModel::new`] puts an adapter on every module whose name matches a target (PEFT's
//! `target_modules`: the name itself or its last dotted parts, `c_attn`, `query`) and freezes
//! everything else. The base weights stay where they are (frozen in place, never copied); the
//! wrapper shows only the adapters (and the modules to save) to whatever walks it, under the
//! names PEFT saves, so an optimizer, DDP's buckets and a checkpoint see the adapters alone.
//! [`peft`] reads and writes PEFT's adapter folders; [`LoraModel::merged_state_dict`] is the
//! full model with `W + scale * B @ A` under PyTorch's names.

pub mod peft;

use crate::functional::{dropout, linear};
use crate::module::{convert, set_requires_grad};
use crate::{init, Module, Parameter, TrainingFlag, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::OnceLock;

/// The prefix PEFT's files put before the base model's names (`PeftModel.base_model.model`).
pub const PEFT_PREFIX: &str = "base_model.model.";

/// What LoRA to apply: `[lora]` of a config, or PEFT's `adapter_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// Dropout on the adapter path's input (training only).
    pub dropout: f64,
    /// Module names to adapt: a module matches when its dotted name is the target or ends with
    /// `.target` (PEFT's rule for a list of `target_modules`).
    pub targets: Vec<String>,
    /// Modules trained whole and saved beside the adapters (a new classifier head); names
    /// matched as targets are; a name matching no module is skipped, as in PEFT.
    pub modules_to_save: Vec<String>,
}

impl LoraConfig {
    /// `alpha / rank`, PEFT's scaling without rsLoRA.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// Why LoRA could not be applied, saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("lora.rank must be at least 1 (PEFT's `r`), got 0")]
    ZeroRank,
    #[error(
        "lora target {target:?} matches no module of the model; targets are module names or \
         their last dotted parts, e.g. {examples}"
    )]
    NoMatch { target: String, examples: String },
    #[error(
        "lora target {target:?} matches `{module}`, which is not a linear layer; LoRA adapts \
         Linear and GPT-2's Conv1D layers - name those (e.g. `c_attn`, `query`, `value`)"
    )]
    NotAdaptable { target: String, module: String },
    #[error("{path}: {what}")]
    BadAdapterFile { path: std::path::PathBuf, what: String },
    #[error("{path}: {action}")]
    Io {
        path: std::path::PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not PEFT's adapter_config.json")]
    Json {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),
    #[error(transparent)]
    Load(#[from] crate::LoadError),
}

/// The trainable update of one layer: `A` `[rank, in]`, `B` `[out, rank]`.
#[derive(Debug)]
pub struct LoraAdapter {
    pub lora_a: Parameter,
    pub lora_b: Parameter,
    pub scaling: f64,
    pub dropout: f64,
    training: TrainingFlag,
}

impl LoraAdapter {
    /// PEFT's initialisation: `A` as `nn.Linear`'s weight (Kaiming uniform, a = sqrt 5), `B`
    /// zeros, so the adapted layer starts equal to the base.
    pub fn new(
        in_features: usize,
        out_features: usize,
        config: &LoraConfig,
        dtype: DType,
        device: Device,
    ) -> oxtrain_tensor::Result<LoraAdapter> {
        let a = Tensor::zeros([config.rank, in_features], dtype, device)?;
        init::default_weight_(&a, None);
        Ok(LoraAdapter {
            lora_a: Parameter::new(a),
            lora_b: Parameter::new(Tensor::zeros([out_features, config.rank], dtype, device)?),
            scaling: config.scaling(),
            dropout: config.dropout,
            training: TrainingFlag::default(),
        })
    }

    /// `scale * B(A(dropout(x)))`, `[..., out]` for `x` `[..., in]`.
    pub fn delta(&self, x: &Var) -> Var {
        let x = dropout(x, self.dropout, self.training.get());
        linear(&linear(&x, &self.lora_a.var(), None), &self.lora_b.var(), None).mul_scalar(self.scaling)
    }

    /// `scale * B @ A` `[out, in]`, the change to an `nn.Linear` weight.
    pub fn delta_weight(&self) -> Tensor {
        self.lora_b.tensor().matmul(&self.lora_a.tensor()).mul_scalar(self.scaling)
    }
}

/// Where a linear layer keeps its adapter once LoRA is applied (empty before).
#[derive(Debug, Default)]
pub struct LoraSlot(OnceLock<LoraAdapter>);

impl LoraSlot {
    pub fn get(&self) -> Option<&LoraAdapter> {
        self.0.get()
    }

    /// `base + delta(x)` with an adapter, `base` without: what a layer's forward returns.
    pub fn add_to(&self, x: &Var, base: Var) -> Var {
        match self.get() {
            Some(a) => base.add(&a.delta(x)),
            None => base,
        }
    }

    /// The adapter's training flag, which the host layer reports as its own so `train()` and
    /// `eval()` reach the adapter's dropout.
    pub fn training_flag(&self) -> Option<&TrainingFlag> {
        self.get().map(|a| &a.training)
    }
}

/// A layer LoRA can adapt, as [`Module::lora_host`] shows it.
pub struct LoraHost<'a> {
    pub weight: &'a Parameter,
    pub slot: &'a LoraSlot,
    /// The weight is stored `[in, out]` (GPT-2's Conv1D; PEFT's `fan_in_fan_out`).
    pub fan_in_fan_out: bool,
}

impl LoraHost<'_> {
    /// (in, out) features of the layer.
    fn features(&self) -> (usize, usize) {
        let d = self.weight.dims();
        if self.fan_in_fan_out {
            (d[0], d[1])
        } else {
            (d[1], d[0])
        }
    }
}

/// Whether the module named `name` is one of `targets` (PEFT's suffix rule).
fn matches(name: &str, target: &str) -> bool {
    name == target || name.ends_with(&format!(".{target}"))
}

/// A model with LoRA adapters: the base is frozen; walking the wrapper finds only the adapters
/// and the modules to save, named as in PEFT's `adapter_model.safetensors`.
pub struct LoraModel<M> {
    pub model: M,
    pub config: LoraConfig,
    /// The adapted modules' names (`transformer.h.0.attn.c_attn`).
    pub adapted: Vec<String>,
    saved_modules: Vec<String>,
}

impl<M: Module> LoraModel<M> {
    /// Freezes `model` and adds an adapter to every target; fails, leaving the model frozen
    /// but unadapted, when a target matches nothing or a non-linear module.
    pub fn new(model: M, config: &LoraConfig) -> Result<LoraModel<M>, LoraError> {
        if config.rank == 0 {
            return Err(LoraError::ZeroRank);
        }
        let mut hosts: Vec<(String, usize)> = Vec::new();
        let mut names = Vec::new();
        let mut refused = None;
        model.visit_modules(&mut |name, m| {
            names.push(name.to_string());
            if let Some(i) = config.targets.iter().position(|t| matches(name, t)) {
                match m.lora_host() {
                    Some(_) => hosts.push((name.to_string(), i)),
                    None if refused.is_none() => {
                        refused = Some((config.targets[i].clone(), name.to_string()))
                    }
                    None => {}
                }
            }
        });
        if let Some((target, module)) = refused {
            return Err(LoraError::NotAdaptable { target, module });
        }
        if let Some(t) = (0..config.targets.len()).find(|i| !hosts.iter().any(|(_, j)| j == i)) {
            let examples: Vec<&str> = names.iter().rev().take(4).map(String::as_str).collect();
            return Err(LoraError::NoMatch {
                target: config.targets[t].clone(),
                examples: examples.join(", "),
            });
        }
        set_requires_grad(&model, false);
        let mut result = Ok(());
        let mut saved_modules = Vec::new();
        model.visit_modules(&mut |name, m| {
            if config.modules_to_save.iter().any(|s| matches(name, s)) {
                set_requires_grad(m, true);
                saved_modules.push(name.to_string());
            }
            let Some(host) = m.lora_host().filter(|_| hosts.iter().any(|(n, _)| n == name)) else { return };
            let (fan_in, fan_out) = host.features();
            let w = host.weight.tensor();
            match LoraAdapter::new(fan_in, fan_out, config, w.dtype(), w.device()) {
                // A layer adapted twice keeps its first adapter (one adapter per layer).
                Ok(adapter) => drop(host.slot.0.set(adapter)),
                Err(e) => result = Err(e),
            }
        });
        result?;
        Ok(LoraModel {
            model,
            config: config.clone(),
            adapted: hosts.into_iter().map(|(n, _)| n).collect(),
            saved_modules,
        })
    }

    /// Every adapter with its module's name.
    pub fn adapters(&self, on: &mut dyn FnMut(&str, &LoraHost<'_>, &LoraAdapter)) {
        self.model.visit_modules(&mut |name, m| {
            if let Some(host) = m.lora_host() {
                if let Some(a) = host.slot.get() {
                    on(name, &host, a);
                }
            }
        });
    }

    /// Whether any adapted weight is stored `[in, out]` (PEFT's `fan_in_fan_out`).
    pub fn fan_in_fan_out(&self) -> bool {
        let mut any = false;
        self.adapters(&mut |_, host, _| any |= host.fan_in_fan_out);
        any
    }

    /// The full model's state dict with every adapted weight replaced by `W + scale * B @ A`
    /// (transposed for `[in, out]` weights), under PyTorch's names: PEFT's `merge_and_unload`
    /// followed by `state_dict()`. The live model is not changed.
    pub fn merged_state_dict(&self) -> Vec<(String, Tensor)> {
        let mut merged: Vec<(String, Tensor)> = Vec::new();
        self.adapters(&mut |name, host, a| {
            let delta = a.delta_weight();
            let delta = if host.fan_in_fan_out { delta.t().contiguous() } else { delta };
            let w = host.weight.tensor();
            merged.push((format!("{name}.weight"), w.add(&delta.to_dtype(w.dtype()))));
        });
        self.model
            .state_dict()
            .into_iter()
            .map(|(n, t)| match merged.iter().find(|(m, _)| *m == n) {
                Some((_, w)) => (n, w.clone()),
                None => (n, t),
            })
            .collect()
    }
}

impl<M: Module> Module for LoraModel<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        self.model.visit_modules(&mut |name, m| {
            if let Some(a) = m.lora_host().and_then(|h| h.slot.get()) {
                v.param(&format!("{PEFT_PREFIX}{name}.lora_A.weight"), &a.lora_a);
                v.param(&format!("{PEFT_PREFIX}{name}.lora_B.weight"), &a.lora_b);
            }
            if self.saved_modules.iter().any(|s| s == name) {
                v.child(&format!("{PEFT_PREFIX}{name}"), m);
            }
        });
    }

    fn train(&self, training: bool) {
        self.model.train(training)
    }

    fn is_training(&self) -> bool {
        self.model.is_training()
    }

    fn to_device(&self, device: Device) -> oxtrain_tensor::Result<()> {
        self.model.to_device(device)?;
        convert(&|v| self.visit(v), Some(device), None)
    }

    fn to_dtype(&self, dtype: DType) -> oxtrain_tensor::Result<()> {
        self.model.to_dtype(dtype)?;
        convert(&|v| self.visit(v), None, Some(dtype))
    }
}

impl<M> std::ops::Deref for LoraModel<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.model
    }
}

#[cfg(test)]
mod tests;
