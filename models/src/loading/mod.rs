//! Reading Hugging Face style checkpoints and loading them into a model.
//!
//! [`read_checkpoint`] takes a folder (`model.safetensors`, else
//! `model.safetensors.index.json` with its shards), a `.safetensors` file or an index file,
//! and returns every tensor by name. [`load_pretrained`] then fits the names to the model the
//! way `from_pretrained` does: a checkpoint saved from the bare model (`h.0.attn...`) loads
//! into the model with a head (`transformer.h.0.attn...`) and the other way round, names the
//! architecture never uses (GPT-2's causal-mask buffers, BERT's `position_ids`) are dropped,
//! and anything missing or mis-shaped fails with an [`oxtrain_nn::LoadError`] listing every
//! name, before anything is written.

#[cfg(test)]
mod tests;

use crate::error::{read_json, ModelError, Result};
use oxtrain_nn::{LoadError, LoadReport, Module, ShapeMismatch};
use oxtrain_tensor::{safetensors, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The single-file checkpoint name Hugging Face writes.
pub const SAFETENSORS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint: `{"metadata": {..}, "weight_map": {name: shard file}}`.
pub const SAFETENSORS_INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// Every tensor of a checkpoint, on the CPU. `path` is a folder holding `model.safetensors` or
/// `model.safetensors.index.json` (the single file wins, as in `from_pretrained`), a
/// `.safetensors` file, or an index file whose shards lie beside it.
pub fn read_checkpoint(path: impl AsRef<Path>) -> Result<HashMap<String, Tensor>> {
    let path = path.as_ref();
    if path.is_dir() {
        let single = path.join(SAFETENSORS_FILE);
        let index = path.join(SAFETENSORS_INDEX_FILE);
        if single.is_file() {
            return read_single(&single);
        }
        if index.is_file() {
            return read_sharded(&index);
        }
        return Err(ModelError::BadFile {
            path: path.to_path_buf(),
            reason: format!(
                "the folder has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX_FILE}; oxtrain reads \
                 safetensors checkpoints only (convert a pytorch_model.bin with \
                 `safetensors.torch.save_file(torch.load(...), ...)`)"
            ),
        });
    }
    if path.to_string_lossy().ends_with(".json") {
        read_sharded(path)
    } else {
        read_single(path)
    }
}

fn read_single(path: &Path) -> Result<HashMap<String, Tensor>> {
    Ok(safetensors::load_all(path)?.into_iter().collect())
}

/// Reads each shard the index names once and checks that it holds the names mapped to it.
fn read_sharded(index_path: &Path) -> Result<HashMap<String, Tensor>> {
    let index: ShardIndex = read_json(index_path)?;
    let folder = index_path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, shard) in &index.weight_map {
        by_shard.entry(shard.as_str()).or_default().push(name.as_str());
    }
    let mut out = HashMap::new();
    for (shard, names) in by_shard {
        let shard_path = folder.join(shard_inside_folder(index_path, shard)?);
        let file = safetensors::load(&shard_path)?;
        for name in names {
            if !file.contains(name) {
                return Err(ModelError::BadFile {
                    path: index_path.to_path_buf(),
                    reason: format!(
                        "the weight map puts `{name}` in {shard}, but that shard has no such tensor; \
                         the index and the shards are from different saves"
                    ),
                });
            }
            out.insert(name.to_string(), file.get(name)?);
        }
    }
    Ok(out)
}

/// `shard` as a path below the index's folder. Shards are file names beside the index (Hugging
/// Face writes `model-00001-of-00002.safetensors`); an absolute path or a `..` would let a
/// downloaded index read any file of the machine, so only plain names and sub-folders pass.
fn shard_inside_folder<'a>(index_path: &Path, shard: &'a str) -> Result<&'a Path> {
    use std::path::Component;
    let path = Path::new(shard);
    let plain = !shard.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        return Ok(path);
    }
    Err(ModelError::BadFile {
        path: index_path.to_path_buf(),
        reason: format!(
            "the weight map names the shard {shard:?}, which is not a file inside the checkpoint's \
             folder (absolute paths and `..` are refused, so an index cannot read files elsewhere); \
             the index is corrupt or hostile - use the shards' plain file names"
        ),
    })
}

/// The `config.json` of a Hugging Face checkpoint at `path`: inside it when `path` is a
/// folder, beside it when it is a file (`model.safetensors`, an index).
pub fn config_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("config.json")
    } else {
        path.parent().unwrap_or(Path::new(".")).join("config.json")
    }
}

/// `config` when given, else `read` of the `config.json` in or beside `path`
/// ([`config_path`]): what `from_pretrained` builds.
pub(crate) fn given_or_read<C>(
    config: Option<C>,
    path: &Path,
    read: impl FnOnce(&Path) -> Result<C>,
) -> Result<C> {
    match config {
        Some(config) => Ok(config),
        None => read(&config_path(path)),
    }
}

/// How a model family fits checkpoint names to its own, as Hugging Face models do.
#[derive(Debug, Clone, Copy, Default)]
pub struct NameRules<'a> {
    /// The base model's attribute in models with a head (`transformer` for GPT-2, `bert` for
    /// BERT): added to or stripped from the checkpoint's names when only one side has it.
    pub base_prefix: &'a str,
    /// Checkpoint names ending with one of these are dropped silently (buffers that older
    /// versions saved and the model recomputes).
    pub ignore_suffixes: &'a [&'a str],
    /// Model names that may be absent from the checkpoint (weights tied to another one).
    pub may_be_missing: &'a [&'a str],
}

/// Renames `state` to the model's names under `rules` and drops what `rules` ignores.
pub fn fit_names(
    model_names: &[String],
    state: HashMap<String, Tensor>,
    rules: &NameRules<'_>,
) -> HashMap<String, Tensor> {
    let mut state: HashMap<String, Tensor> = state
        .into_iter()
        .filter(|(name, _)| !rules.ignore_suffixes.iter().any(|s| name.ends_with(s)))
        .collect();
    let prefix = rules.base_prefix;
    if prefix.is_empty() {
        return state;
    }
    let dotted = format!("{prefix}.");
    let model_has = model_names.iter().any(|n| n.starts_with(&dotted));
    let state_has = state.keys().any(|n| n.starts_with(&dotted));
    if model_has && !state_has {
        // A bare-model checkpoint into a model with a head: every name goes under the prefix
        // except those the head model has at its top level (GPT-2's `lm_head.weight`).
        state = state
            .into_iter()
            .map(|(n, t)| if model_names.contains(&n) { (n, t) } else { (format!("{dotted}{n}"), t) })
            .collect();
    } else if !model_has && state_has {
        // A checkpoint of a model with a head into the bare model: the head's names stay as
        // they are and end up unexpected.
        state = state
            .into_iter()
            .map(|(n, t)| match n.strip_prefix(&dotted) {
                Some(rest) => (rest.to_string(), t),
                None => (n, t),
            })
            .collect();
    }
    state
}

/// Loads `state` into `model` after [`fit_names`]. Fails, writing nothing, when a name of the
/// model is missing (other than `rules.may_be_missing`) or a shape differs. Names the model
/// does not have are skipped and returned in the report's `unexpected`, as `from_pretrained`
/// warns about them (a pre-training head in a checkpoint loaded for fine-tuning); absent
/// `may_be_missing` names keep their initial values and are listed in `missing`.
pub fn load_pretrained(
    model: &dyn Module,
    state: HashMap<String, Tensor>,
    rules: &NameRules<'_>,
) -> Result<LoadReport> {
    let own: Vec<(String, Tensor)> = model.state_dict();
    let names: Vec<String> = own.iter().map(|(n, _)| n.clone()).collect();
    let state = fit_names(&names, state, rules);
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !state.contains_key(*n) && !rules.may_be_missing.contains(&n.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let mut unexpected: Vec<String> = state.keys().filter(|k| !names.contains(k)).cloned().collect();
        unexpected.sort();
        let mismatched = own
            .iter()
            .filter_map(|(n, t)| {
                let got = state.get(n)?;
                (got.dims() != t.dims()).then(|| ShapeMismatch {
                    name: n.clone(),
                    expected: t.dims().to_vec(),
                    got: got.dims().to_vec(),
                })
            })
            .collect();
        return Err(LoadError::Mismatch { missing, unexpected, mismatched }.into());
    }
    // Only `may_be_missing` names can be missing here; they keep their values and are
    // reported, as `from_pretrained` reports newly initialised weights.
    Ok(model.load_state_dict(&state, false)?)
}
