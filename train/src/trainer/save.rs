//! The model folder a run ends with: `model.safetensors` (the state dict, PyTorch's names) and
//! `config.toml` (the resolved config), the part of a checkpoint that `oxtrain eval` reads.

use super::TrainError;
use crate::checkpoint::manifest::MANIFEST;
use crate::checkpoint::{verify_checkpoint, CheckpointError, CONFIG_FILE, MODEL_FILE};
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

/// The config of a model folder (or checkpoint) and the path of its weights. A checkpoint's
/// files are checked against its manifest first, as a resume checks them; a path that is no
/// model folder gets an error saying what it is and which folder to give instead.
pub fn read_model_dir(dir: &Path) -> Result<(Config, PathBuf), TrainError> {
    let weights = dir.join(MODEL_FILE);
    let cfg = dir.join(CONFIG_FILE);
    if dir.join(MANIFEST).is_file() {
        verify_checkpoint(dir)?
            .map_err(|problem| CheckpointError::Invalid { path: dir.to_path_buf(), problem })?;
    } else if !(weights.is_file() && cfg.is_file()) {
        return Err(TrainError::NotAModelFolder { dir: dir.to_path_buf(), problem: not_a_model(dir) });
    }
    let config = Config::load::<&str>(Some(&cfg), &[])?;
    Ok((config, weights))
}

/// What `dir` is instead of a model folder, and what to pass.
fn not_a_model(dir: &Path) -> String {
    let folder = "--checkpoint takes a folder with model.safetensors and config.toml: a run's \
                  checkpoints/final or one of its checkpoints/step-NNNNNN";
    if !dir.exists() {
        return format!("it does not exist; {folder}");
    }
    if !dir.is_dir() {
        return format!("it is a file; {folder}");
    }
    for inner in ["final", "checkpoints/final"] {
        if dir.join(inner).join(MODEL_FILE).is_file() {
            return format!(
                "it holds a run; evaluate its final model with --checkpoint {}",
                dir.join(inner).display()
            );
        }
    }
    match (dir.join(MODEL_FILE).is_file(), dir.join(CONFIG_FILE).is_file()) {
        (true, false) => format!("{CONFIG_FILE} is missing beside {MODEL_FILE}; {folder}"),
        (false, true) => format!("{MODEL_FILE} is missing beside {CONFIG_FILE}; {folder}"),
        _ => format!("it has neither {MODEL_FILE} nor {CONFIG_FILE}; {folder}"),
    }
}
