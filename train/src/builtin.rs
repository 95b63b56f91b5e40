//! The built-in example's data: drawn shapes written once as an ImageFolder (`train/` and
//! `val/`) into a cache folder, then read through the same path as ImageNet.

use crate::config::Config;
use crate::runtime::TrainError;
use oxtrain_datasets::synthetic::write_shapes_image_folder;
use std::path::{Path, PathBuf};

/// The seeds of the pictures: fixed, so the data is the same whatever the training seed.
const TRAIN_SEED: u64 = 0x5ba9e5;
const VAL_SEED: u64 = 0x5ba9e6;

/// `data.cache`, else `$XDG_CACHE_HOME/oxtrain`, `$HOME/.cache/oxtrain`, or the temp folder.
pub fn cache_root(config: &Config) -> PathBuf {
    if !config.data.cache.is_empty() {
        return PathBuf::from(&config.data.cache);
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Path::new(&x).join("oxtrain");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Path::new(&h).join(".cache").join("oxtrain");
    }
    std::env::temp_dir().join("oxtrain-cache")
}

/// Pictures per class in the evaluation split.
pub fn val_per_class(per_class: usize) -> usize {
    (per_class / 4).clamp(1, 100)
}

/// The folder of the config's shapes, written on first use. It is made under a temporary name
/// and renamed into place, so a run stopped half-way or a second process writing at the same
/// time never leaves a partial folder behind.
pub fn ensure_shapes_folder(config: &Config) -> Result<PathBuf, TrainError> {
    let d = &config.data;
    let root = cache_root(config);
    let name = format!("shapes-v2-{}classes-{}per-class-{}px", d.classes, d.per_class, d.image_size);
    let dir = root.join(&name);
    if dir.join("train").is_dir() && dir.join("val").is_dir() {
        return Ok(dir);
    }
    let tmp = root.join(format!(".{name}.partial-{}", std::process::id()));
    let write = || -> Result<(), oxtrain_datasets::Error> {
        write_shapes_image_folder(tmp.join("train"), d.classes, d.per_class, d.image_size, TRAIN_SEED)?;
        write_shapes_image_folder(
            tmp.join("val"),
            d.classes,
            val_per_class(d.per_class),
            d.image_size,
            VAL_SEED,
        )?;
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(TrainError::data(format!("writing the built-in shapes into {}", root.display()), e));
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process finished first: use its folder.
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join("train").is_dir() {
            return Err(TrainError::output(
                &dir,
                crate::Error::other("could not move the written shapes into place"),
            ));
        }
    }
    Ok(dir)
}
