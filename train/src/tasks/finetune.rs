//! Fine-tuning a pretrained model, the same for every task: a new head when `model.num_classes`
//! differs from the checkpoint's, freezing by name (`optim.freeze`), and LoRA (`[lora]`). What
//! the task builds is a [`Tuned`] model: the whole model, or its LoRA adapters alone as far as
//! the optimizer, DDP and checkpoints can see.

use super::TaskResult;
use crate::config::Config;
use crate::runtime::TrainError;
use oxtrain_nn::lora::{LoraConfig, LoraModel};
use oxtrain_nn::{freeze_matching, Module, TrainingFlag, Visitor};
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::HashMap;

/// A model as a fine-tuning run trains it.
pub enum Tuned<M> {
    /// Every parameter that is not frozen learns and is saved.
    Whole(M),
    /// Only the adapters (and the modules to save) learn and are saved, under PEFT's names.
    Lora(LoraModel<M>),
}

impl<M: Module> Tuned<M> {
    /// The model itself (with its adapters, if any), for the forward pass.
    pub fn inner(&self) -> &M {
        match self {
            Tuned::Whole(m) => m,
            Tuned::Lora(l) => &l.model,
        }
    }
}

impl<M> std::ops::Deref for Tuned<M> {
    type Target = M;
    fn deref(&self) -> &M {
        match self {
            Tuned::Whole(m) => m,
            Tuned::Lora(l) => &l.model,
        }
    }
}

impl<M: Module> Module for Tuned<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        match self {
            Tuned::Whole(m) => m.visit(v),
            Tuned::Lora(l) => l.visit(v),
        }
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        match self {
            Tuned::Whole(m) => m.training_flag(),
            Tuned::Lora(_) => None,
        }
    }
    fn train(&self, training: bool) {
        self.inner().train(training)
    }
    fn is_training(&self) -> bool {
        self.inner().is_training()
    }
    fn to_device(&self, device: Device) -> oxtrain_tensor::Result<()> {
        match self {
            Tuned::Whole(m) => m.to_device(device),
            Tuned::Lora(l) => l.to_device(device),
        }
    }
    fn to_dtype(&self, dtype: DType) -> oxtrain_tensor::Result<()> {
        match self {
            Tuned::Whole(m) => m.to_dtype(dtype),
            Tuned::Lora(l) => l.to_dtype(dtype),
        }
    }
}

/// Which modules LoRA adapts and saves by default for a model family (PEFT's defaults).
#[derive(Clone, Copy, Debug)]
pub struct LoraDefaults {
    pub targets: &'static [&'static str],
    /// Trained whole and saved beside the adapters (a task's new head: PEFT's SEQ_CLS).
    pub modules_to_save: &'static [&'static str],
}

pub const GPT2_LORA: LoraDefaults = LoraDefaults { targets: &["c_attn"], modules_to_save: &[] };
pub const BERT_LORA: LoraDefaults =
    LoraDefaults { targets: &["query", "value"], modules_to_save: &["classifier"] };

/// The LoRA of the config's `[lora]`, `None` when `lora.rank` is 0.
pub fn lora_config(config: &Config, defaults: LoraDefaults) -> Option<LoraConfig> {
    let l = &config.lora;
    (l.rank > 0).then(|| LoraConfig {
        rank: l.rank,
        alpha: l.alpha,
        dropout: l.dropout,
        targets: if l.targets.is_empty() {
            defaults.targets.iter().map(|t| t.to_string()).collect()
        } else {
            l.targets.clone()
        },
        modules_to_save: defaults.modules_to_save.iter().map(|t| t.to_string()).collect(),
    })
}

/// Freezes what `optim.freeze` names, then adds LoRA when `[lora]` asks for it.
pub fn tune<M: Module>(model: M, config: &Config, defaults: LoraDefaults) -> TaskResult<Tuned<M>> {
    freeze(&model, config)?;
    match lora_config(config, defaults) {
        None => Ok(Tuned::Whole(model)),
        Some(lora) => {
            LoraModel::new(model, &lora).map(Tuned::Lora).map_err(|e| TrainError::model("[lora]", e))
        }
    }
}

/// Freezes the parameters `optim.freeze` names (nothing when it is empty).
pub fn freeze(model: &dyn Module, config: &Config) -> TaskResult<()> {
    if !config.optim.freeze.is_empty() {
        freeze_matching(model, &config.optim.freeze).map_err(|e| TrainError::model("optim.freeze", e))?;
    }
    Ok(())
}

/// A classifier head left out of a checkpoint load because its shape differs from the run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHead {
    pub head: String,
    pub checkpoint: Vec<usize>,
    pub model: Vec<usize>,
}

impl std::fmt::Display for NewHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "model.init_from: new head `{h}`: the checkpoint's {h}.weight is {:?}, this run's {:?} \
             (model.num_classes); `{h}` starts freshly initialised, everything else loads strictly",
            self.checkpoint,
            self.model,
            h = self.head
        )
    }
}

/// When the checkpoint's `head.weight` has another shape than the model's (a new number of
/// classes), puts the model's own freshly initialised `head.weight` and `head.bias` in `state`
/// in place of the checkpoint's, so a strict load keeps the new head and checks everything
/// else; says which head and both shapes. A head of the same shape loads as usual.
pub fn replace_head(model: &dyn Module, state: &mut HashMap<String, Tensor>, head: &str) -> Option<NewHead> {
    let weight = format!("{head}.weight");
    let theirs = state.get(&weight)?.dims().to_vec();
    let own: Vec<(String, Tensor)> = model
        .state_dict()
        .into_iter()
        .filter(|(n, _)| n.strip_prefix(head).is_some_and(|r| r.starts_with('.')))
        .collect();
    let ours = own.iter().find(|(n, _)| *n == weight)?.1.dims().to_vec();
    if theirs == ours {
        return None;
    }
    state.retain(|n, _| !n.strip_prefix(head).is_some_and(|r| r.starts_with('.')));
    state.extend(own.into_iter().map(|(n, t)| (n, t.copy())));
    Some(NewHead { head: head.to_string(), checkpoint: theirs, model: ours })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxtrain_nn::Linear;

    #[test]
    fn a_head_of_another_shape_is_dropped_and_named() {
        let model = oxtrain_nn::Sequential::new().append(Linear::new(8, 4, Device::Cpu).unwrap());
        let mut state: HashMap<String, Tensor> = HashMap::new();
        state.insert("0.weight".into(), Tensor::zeros([1000, 8], DType::F32, Device::Cpu).unwrap());
        state.insert("0.bias".into(), Tensor::zeros(1000, DType::F32, Device::Cpu).unwrap());
        let new = replace_head(&model, &mut state, "0").unwrap();
        assert_eq!((new.checkpoint, new.model), (vec![1000, 8], vec![4, 8]));
        assert_eq!(state["0.weight"].dims(), [4, 8], "the model's own head takes the checkpoint's place");
        assert_eq!(state["0.bias"].dims(), [4]);
        let line = replace_head(
            &model,
            &mut HashMap::from([(
                "0.weight".into(),
                Tensor::zeros([3, 8], DType::F32, Device::Cpu).unwrap(),
            )]),
            "0",
        )
        .unwrap()
        .to_string();
        assert!(
            line.contains("new head `0`") && line.contains("[3, 8]") && line.contains("[4, 8]"),
            "{line}"
        );
        // The same shape is no new head.
        let mut same: HashMap<String, Tensor> = model.state_dict().into_iter().collect();
        assert_eq!(replace_head(&model, &mut same, "0"), None);
        assert_eq!(same.len(), 2);
    }
}
