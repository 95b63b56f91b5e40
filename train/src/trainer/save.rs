//! The model folder a run ends with: `model.safetensors` (the state dict, PyTorch's names) and
//! `config.toml` (the resolved config), the part of a checkpoint that `oxtrain eval` reads.

use super::TrainError;
use crate::checkpoint::layout::{CHECKPOINTS_DIR, CONFIG_FILE, FINAL_DIR, MANIFEST, MODEL_FILE};
use crate::checkpoint::{verify_checkpoint, write_model_folder, CheckpointError};
use crate::config::Config;
use oxtrain_nn::Module;
use std::path::{Path, PathBuf};

/// Writes the model folder `dir` (weights, config, manifest) with the checkpoints' durable
/// writer: complete or not there, and verified by whoever reads it.
pub fn write_model_dir<M: Module>(
    dir: &Path,
    model: &M,
    config: &Config,
    step: u64,
    epoch: u64,
) -> Result<PathBuf, TrainError> {
    Ok(write_model_folder(dir, model, &config.to_toml(), step, epoch)?)
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
    let folder = format!(
        "--checkpoint takes a folder with {MODEL_FILE} and {CONFIG_FILE}: a run's \
         {CHECKPOINTS_DIR}/{FINAL_DIR} or one of its {CHECKPOINTS_DIR}/step-NNNNNN"
    );
    if !dir.exists() {
        return format!("it does not exist; {folder}");
    }
    if !dir.is_dir() {
        return format!("it is a file; {folder}");
    }
    for inner in [Path::new(FINAL_DIR).to_path_buf(), Path::new(CHECKPOINTS_DIR).join(FINAL_DIR)] {
        if dir.join(&inner).join(MODEL_FILE).is_file() {
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
