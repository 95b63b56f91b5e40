//! `oxtrain export`: the model part of a checkpoint as a plain safetensors state_dict with
//! PyTorch's names, which `model.load_state_dict(safetensors.torch.load_file(path))` and Hugging
//! Face's `from_pretrained` (beside a config.json) load as they are.

use super::discover::{latest_valid, verify_checkpoint, Skipped};
use super::error::{io, CheckpointError, Result};
use super::manifest::MANIFEST;
use super::snapshot::MODEL_FILE;
use super::write::sync_dir;
use std::path::{Path, PathBuf};

/// What [`export`] wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The checkpoint it came from (the newest valid one when given a checkpoint folder).
    pub checkpoint: PathBuf,
    pub step: u64,
    pub out: PathBuf,
    pub bytes: u64,
    /// Newer checkpoints of the folder that were passed over, each with its problem.
    pub skipped: Vec<Skipped>,
}

/// Writes the model of `checkpoint` (a step directory, or a run's checkpoint folder, whose
/// newest valid checkpoint is used) to `out`, after checking its checksums. The file is
/// written beside `out` and renamed into place.
pub fn export(checkpoint: impl AsRef<Path>, out: impl AsRef<Path>) -> Result<Exported> {
    let (checkpoint, out) = (checkpoint.as_ref(), out.as_ref());
    let mut skipped = Vec::new();
    let (dir, manifest) = if checkpoint.join(MANIFEST).exists() {
        let m = verify_checkpoint(checkpoint)?
            .map_err(|problem| CheckpointError::Invalid { path: checkpoint.to_path_buf(), problem })?;
        (checkpoint.to_path_buf(), m)
    } else {
        // A run's folder (`log.dir`) holds its checkpoints in `checkpoints/`.
        let runs_checkpoints = checkpoint.join(super::layout::CHECKPOINTS_DIR);
        let folder = if runs_checkpoints.is_dir() { runs_checkpoints } else { checkpoint.to_path_buf() };
        let found = latest_valid(&folder)?;
        let why =
            found.skipped.iter().map(|s| format!("; skipped {}: {}", s.path.display(), s.problem)).collect();
        let chosen = found.chosen.ok_or_else(|| CheckpointError::NotFound {
            dir: folder.clone(),
            why,
            hint: hint(&folder),
        })?;
        skipped = found.skipped;
        chosen
    };
    let source = dir.join(MODEL_FILE);
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder).map_err(io(&folder, "creating the output folder"))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let temp = folder.join(format!(".{name}.export-{}", std::process::id()));
    let result = (|| -> Result<u64> {
        let bytes = std::fs::copy(&source, &temp).map_err(io(&temp, "copying the model file"))?;
        std::fs::File::open(&temp).and_then(|f| f.sync_all()).map_err(io(&temp, "flushing to disk"))?;
        std::fs::rename(&temp, out).map_err(io(out, "renaming the exported file into place"))?;
        sync_dir(&folder)?;
        Ok(bytes)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    Ok(Exported { checkpoint: dir, step: manifest.step, out: out.to_path_buf(), bytes: result?, skipped })
}

/// What to do when `--checkpoint` names no checkpoint, by what it names instead.
fn hint(folder: &Path) -> String {
    let takes = "--checkpoint takes a checkpoint (a step folder such as runs/NAME/checkpoints/step-000100), \
                 a run's checkpoints folder, or the run's folder";
    if !folder.exists() {
        format!("the folder does not exist; {takes}")
    } else if folder.join(MODEL_FILE).is_file() {
        format!(
            "it is a model folder ({MODEL_FILE} and config.toml, as a run writes at its end), not a checkpoint: \
             its {MODEL_FILE} already has PyTorch's names and loads as it is"
        )
    } else {
        takes.to_string()
    }
}
