//! PEFT's adapter folder: `adapter_model.safetensors` (the adapters under names such as
//! `base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`, plus the modules to save) and
//! `adapter_config.json`. [`save_adapter`] writes what `PeftModel.from_pretrained` loads;
//! [`read_config`] and [`load_adapter`] read what `PeftModel.save_pretrained` wrote.

use super::{LoraConfig, LoraError, LoraModel};
use crate::Module;
use oxtrain_tensor::Tensor;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

/// `adapter_config.json` for `model`, with the keys PEFT's `LoraConfig` needs (the rest take
/// PEFT's defaults when it loads the file).
pub fn config_json<M: Module>(model: &LoraModel<M>, base_model_name_or_path: &str) -> Value {
    let c = &model.config;
    let saved = (!model.saved_modules.is_empty()).then(|| model.saved_modules.clone());
    json!({
        "peft_type": "LORA",
        "task_type": null,
        "base_model_name_or_path": base_model_name_or_path,
        "r": c.rank,
        "lora_alpha": c.alpha,
        "lora_dropout": c.dropout,
        "target_modules": c.targets,
        "modules_to_save": saved,
        "fan_in_fan_out": model.fan_in_fan_out(),
        "bias": "none",
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
    })
}

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> LoraError + 'a {
    move |source| LoraError::Io { path: path.to_path_buf(), action, source }
}

/// Writes `dir/adapter_model.safetensors` and `dir/adapter_config.json` as PEFT's
/// `save_pretrained` does; `base_model_name_or_path` is what PEFT loads the base from.
pub fn save_adapter<M: Module>(
    model: &LoraModel<M>,
    dir: impl AsRef<Path>,
    base_model_name_or_path: &str,
) -> Result<(), LoraError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(io(dir, "creating the adapter folder"))?;
    let entries = model.state_dict();
    let refs: Vec<(&str, &Tensor)> = entries.iter().map(|(n, t)| (n.as_str(), t)).collect();
    oxtrain_tensor::safetensors::save(&refs, None, dir.join(ADAPTER_WEIGHTS_FILE))?;
    let config = config_json(model, base_model_name_or_path);
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises");
    std::fs::write(&path, text + "\n").map_err(io(&path, "writing the adapter config"))
}

/// The file inside an adapter folder, or the path itself when it names the file.
fn in_folder(path: &Path, file: &str) -> PathBuf {
    if path.is_dir() {
        path.join(file)
    } else {
        path.to_path_buf()
    }
}

/// The [`LoraConfig`] of PEFT's `adapter_config.json` (a folder holding one, or the file).
/// Refused: other PEFT methods, regex `target_modules`, rsLoRA and DoRA (other arithmetic).
pub fn read_config(path: impl AsRef<Path>) -> Result<LoraConfig, LoraError> {
    let path = in_folder(path.as_ref(), ADAPTER_CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path, "reading the adapter config"))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|source| LoraError::Json { path: path.clone(), source })?;
    let bad = |what: String| LoraError::BadAdapterFile { path: path.clone(), what };
    if v["peft_type"] != "LORA" {
        return Err(bad(format!("peft_type is {}, oxtrain reads LORA adapters only", v["peft_type"])));
    }
    for flag in ["use_rslora", "use_dora"] {
        if v[flag] == true {
            return Err(bad(format!("{flag} is true; oxtrain implements plain LoRA only")));
        }
    }
    let names = |key: &str| -> Result<Vec<String>, LoraError> {
        match &v[key] {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .map(|i| {
                    i.as_str().map(String::from).ok_or_else(|| bad(format!("{key} holds {i}, not a name")))
                })
                .collect(),
            Value::String(s) => Err(bad(format!(
                "{key} is the regular expression {s:?}; oxtrain takes a list of module names"
            ))),
            other => Err(bad(format!("{key} is {other}, not a list of module names"))),
        }
    };
    let number = |key: &str| v[key].as_f64().ok_or_else(|| bad(format!("{key} is {}, not a number", v[key])));
    Ok(LoraConfig {
        rank: number("r")? as usize,
        alpha: number("lora_alpha")?,
        dropout: v["lora_dropout"].as_f64().unwrap_or(0.0),
        targets: names("target_modules")?,
        modules_to_save: names("modules_to_save")?,
    })
}

/// Loads PEFT's `adapter_model.safetensors` (a folder holding one, or the file) into `model`'s
/// adapters and saved modules; every name must fit (a strict load).
pub fn load_adapter<M: Module>(model: &LoraModel<M>, path: impl AsRef<Path>) -> Result<(), LoraError> {
    let path = in_folder(path.as_ref(), ADAPTER_WEIGHTS_FILE);
    let state: HashMap<String, Tensor> = oxtrain_tensor::safetensors::load_all(&path)?.into_iter().collect();
    model.load_state_dict(&state, true)?;
    Ok(())
}
