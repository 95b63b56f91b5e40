//! The model folder a run ends with (`checkpoints/final`): the model's state_dict and the
//! resolved config, written as a checkpoint part is (every file fsynced, a manifest with
//! checksums last, one rename), so a crash leaves the previous folder or the complete new
//! one, and `oxtrain eval` and `export` verify it as resume verifies a step.

use super::error::Result;
use super::image::safetensors_image;
use super::layout::{CONFIG_FILE, MODEL_FILE};
use super::write::{commit, Content, PartFile, PartInfo, PartWrite};
use oxtrain_nn::Module;
use std::path::{Path, PathBuf};

/// Writes `model`'s state_dict and `config_toml` into the folder `dir` (replacing one that is
/// there only once the new one is complete), labelled with `step` and `epoch`.
pub fn write_model_folder<M: Module>(
    dir: &Path,
    model: &M,
    config_toml: &str,
    step: u64,
    epoch: u64,
) -> Result<PathBuf> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let part = PartWrite::begin(parent, &name, step, None)?;
    part.start_checksums();
    let written = (|| {
        let image = safetensors_image(&model.state_dict(), None, None, Path::new(MODEL_FILE))?;
        let files = [
            PartFile { name: MODEL_FILE.into(), content: Content::Image(image) },
            PartFile { name: CONFIG_FILE.into(), content: Content::Bytes(config_toml.as_bytes().to_vec()) },
        ];
        let entries = files.iter().map(|f| part.write_file(f)).collect::<Result<Vec<_>>>()?;
        // A folder that stands alone: no other rank's part belongs to it.
        part.write_manifest(&PartInfo { epoch, rank: 0, world_size: 1 }, entries)?;
        commit(&part.temp, &parent.join(&name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&part.temp);
    }
    written.map(|()| parent.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::verify_checkpoint;
    use oxtrain_nn::Linear;
    use oxtrain_tensor::Device;

    #[test]
    fn a_model_folder_verifies_and_a_corrupt_one_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let model = Linear::new(3, 2, Device::Cpu).unwrap();
        let dir = write_model_folder(&tmp.path().join("final"), &model, "[model]\n", 7, 1).unwrap();
        let manifest = verify_checkpoint(&dir).unwrap().expect("a fresh model folder verifies");
        assert_eq!((manifest.step, manifest.world_size), (7, 1));
        let loaded = oxtrain_tensor::safetensors::load_all(dir.join(MODEL_FILE)).unwrap();
        assert_eq!(loaded.len(), model.state_dict().len());
        // Written again over itself: the new folder replaces the old, nothing is left beside it.
        write_model_folder(&dir, &model, "[model]\n", 9, 2).unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("final")]);
        // One flipped byte in the weights: the manifest's checksum catches it.
        let path = dir.join(MODEL_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        assert!(verify_checkpoint(&dir).unwrap().is_err(), "a corrupt model file must not verify");
    }
}
