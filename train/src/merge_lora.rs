//! `oxtrain export --merge-lora`: a LoRA run's checkpoint (its adapters, under PEFT's names)
//! merged into the base it adapted (`model.init_from`), written as the full model with
//! PyTorch's names: what PEFT's `merge_and_unload()` then `save_pretrained` gives.

use crate::config::{Config, ConfigError, ModelName};
use crate::runtime::TrainError;
use crate::tasks::finetune::{tune, LoraDefaults, Tuned, BERT_LORA, GPT2_LORA};
use crate::tasks::language_model::build_gpt2;
use crate::tasks::text_classification::{build_bert, tokenizer_for};
use crate::tasks::{Placement, TaskResult};
use crate::trainer::read_model_dir;
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::path::Path;

/// What [`export_merged`] or [`export_peft_adapter`] wrote.
#[derive(Debug, Clone)]
pub struct Merged {
    /// The adapted modules, merged (`transformer.h.0.attn.c_attn`).
    pub adapted: Vec<String>,
    /// Tensors written (the merged model's, or the adapter file's).
    pub tensors: usize,
}

/// What an export of a LoRA run writes.
#[derive(Clone, Copy)]
enum Output<'a> {
    /// The full model with the adapters merged, one safetensors file.
    Merged(&'a Path),
    /// PEFT's adapter folder (`adapter_model.safetensors`, `adapter_config.json`).
    PeftAdapter(&'a Path),
}

/// Rebuilds the run's base from its config, adds its adapters from `weights` (strictly) and
/// writes `output`.
fn write<M: Module>(
    model: M,
    config: &Config,
    defaults: LoraDefaults,
    weights: &Path,
    output: Output<'_>,
) -> TaskResult<Merged> {
    let Tuned::Lora(lora) = tune(model, config, defaults)? else {
        unreachable!("export checks lora.rank first")
    };
    lora.load_safetensors(weights, true).map_err(|e| TrainError::model(weights.display().to_string(), e))?;
    let adapted = lora.adapted.clone();
    match output {
        Output::Merged(out) => {
            let state = lora.merged_state_dict();
            write_atomically(&state, out)?;
            Ok(Merged { adapted, tensors: state.len() })
        }
        Output::PeftAdapter(dir) => {
            oxtrain_nn::lora::peft::save_adapter(&lora, dir, &config.model.init_from)
                .map_err(|e| TrainError::output(dir, e))?;
            Ok(Merged { adapted, tensors: lora.state_dict().len() })
        }
    }
}

/// Merges the adapters of the LoRA checkpoint or model folder `checkpoint` into the base its
/// config names and writes the full model to `out` (written beside it, then renamed).
pub fn export_merged(checkpoint: &Path, out: &Path) -> TaskResult<Merged> {
    export(checkpoint, Output::Merged(out))
}

/// Writes the adapters of the LoRA checkpoint or model folder `checkpoint` as PEFT's adapter
/// folder `dir`, which `PeftModel.from_pretrained(base, dir)` loads (its
/// `base_model_name_or_path` is the run's `model.init_from`).
pub fn export_peft_adapter(checkpoint: &Path, dir: &Path) -> TaskResult<Merged> {
    export(checkpoint, Output::PeftAdapter(dir))
}

fn export(checkpoint: &Path, output: Output<'_>) -> TaskResult<Merged> {
    let (config, weights) = read_model_dir(checkpoint)?;
    if config.lora.rank == 0 {
        return Err(ConfigError::invalid(
            "lora.rank",
            0,
            "--merge-lora and --peft-adapter export a LoRA run's adapters, and this checkpoint's run trained \
             the whole model: export it without them",
        )
        .into());
    }
    let place = Placement { rank: 0, world_size: 1, device: Device::Cpu };
    let vocab = tokenizer_for(&config)?.vocab_size();
    match config.model.name {
        ModelName::Gpt2 => {
            write(build_gpt2(&config, vocab, place.device)?, &config, GPT2_LORA, &weights, output)
        }
        ModelName::Bert => {
            let model = build_bert(&config, vocab, config.model.num_classes, place)?;
            write(model, &config, BERT_LORA, &weights, output)
        }
        other => unreachable!("the config check allows LoRA on gpt2 and bert only, not {other:?}"),
    }
}

/// `state` to the safetensors file `out`, written beside it and renamed into place.
fn write_atomically(state: &[(String, Tensor)], out: &Path) -> TaskResult<()> {
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder).map_err(|e| TrainError::output(&folder, e))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let temp = folder.join(format!(".{name}.merge-{}", std::process::id()));
    let refs: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let written = oxtrain_tensor::safetensors::save(&refs, None, &temp)
        .map_err(|e| TrainError::output(out, e))
        .and_then(|()| std::fs::rename(&temp, out).map_err(|e| TrainError::output(out, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}
