//! The model folder a run ends with: `model.safetensors` (the state dict, PyTorch's names) and
//! `config.toml` (the resolved config), the part of a checkpoint that `oxtrain eval` reads.

use super::TrainError;
use crate::config::Config;
use oxtrain_nn::Module;
use std::path::{Path, PathBuf};

/// Writes `dir` atomically: into a temporary folder beside it, then renamed over it.
pub fn write_model_dir<M: Module>(dir: &Path, model: &M, config: &Config) -> Result<PathBuf, TrainError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| TrainError::output(parent, e))?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::output(&tmp, e))?;
    let weights = tmp.join("model.safetensors");
    model.save_safetensors(&weights).map_err(|e| TrainError::output(&weights, e))?;
    let cfg = tmp.join("config.toml");
    std::fs::write(&cfg, config.to_toml()).map_err(|e| TrainError::output(&cfg, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| TrainError::output(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| TrainError::output(dir, e))?;
    Ok(dir.to_path_buf())
}

/// The config of a model folder (or checkpoint) and the path of its weights.
pub fn read_model_dir(dir: &Path) -> Result<(Config, PathBuf), TrainError> {
    let weights = dir.join("model.safetensors");
    let cfg = dir.join("config.toml");
    for p in [&weights, &cfg] {
        if !p.is_file() {
            return Err(TrainError::Model(format!(
                "{} is not a model folder: {} is missing (a folder written by `oxtrain train` has model.safetensors \
                 and config.toml)",
                dir.display(),
                p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
            )));
        }
    }
    let config = Config::load::<&str>(Some(&cfg), &[])?;
    Ok((config, weights))
}
