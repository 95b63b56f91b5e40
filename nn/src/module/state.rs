//! Loading a state dict into a module: every name checked before anything is written, every
//! problem reported at once, values copied into the existing tensors in place.

use super::{walk, Item, Visitor};
use oxtrain_tensor::Tensor;
use std::collections::HashMap;

/// A name whose tensor has the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeMismatch {
    pub name: String,
    /// The module's shape.
    pub expected: Vec<usize>,
    /// The shape in the state dict.
    pub got: Vec<usize>,
}

/// What a successful non-strict load skipped (`_IncompatibleKeys` in PyTorch); both empty
/// after a strict load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The module's names the state dict lacks (they keep their values).
    pub missing: Vec<String>,
    /// Names of the state dict the module does not have (ignored).
    pub unexpected: Vec<String>,
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn mismatches(m: &[ShapeMismatch]) -> String {
    if m.is_empty() {
        return "none".to_string();
    }
    let each: Vec<String> =
        m.iter().map(|s| format!("{} (module {:?}, state dict {:?})", s.name, s.expected, s.got)).collect();
    each.join(", ")
}

/// Why a state dict could not be loaded. Nothing was written to the module.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "load_state_dict: the state dict does not fit the module, nothing was loaded.\n  \
         missing: {}\n  unexpected: {}\n  shape mismatch: {}\n\
         Check that the checkpoint is for this architecture; names are PyTorch's state_dict names \
         (print module.state_dict() to compare); pass strict = false to load a partial checkpoint.",
        list(missing),
        list(unexpected),
        mismatches(mismatched)
    )]
    Mismatch { missing: Vec<String>, unexpected: Vec<String>, mismatched: Vec<ShapeMismatch> },

    /// Reading the file, or moving a value to the module's device, failed.
    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),
}

/// Batch norm's batch counter buffer.
const BATCH_COUNTER: &str = "num_batches_tracked";

pub(super) fn load(
    visit: &dyn Fn(&mut dyn Visitor),
    state: &HashMap<String, Tensor>,
    strict: bool,
) -> Result<LoadReport, LoadError> {
    // The module's tensors share storage with its parameters and buffers: copying into them
    // writes into the module.
    let mut targets: Vec<(String, Tensor)> = Vec::new();
    walk(visit, "", &mut |name, item| match item {
        Item::Param(p) => targets.push((name.to_string(), p.tensor())),
        Item::Buffer(b) => targets.push((name.to_string(), b.tensor())),
        Item::Module(_) => {}
    });
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut pairs = Vec::new();
    for (name, target) in &targets {
        match state.get(name) {
            // PyTorch's batch norm fills a missing counter with its own value before a strict
            // load checks the keys (`_load_from_state_dict`): files saved before the counter
            // existed, or by tools that drop it, still load.
            None if name == BATCH_COUNTER || name.ends_with(&format!(".{BATCH_COUNTER}")) => {}
            None => missing.push(name.clone()),
            Some(src) if src.dims() != target.dims() => mismatched.push(ShapeMismatch {
                name: name.clone(),
                expected: target.dims().to_vec(),
                got: src.dims().to_vec(),
            }),
            Some(src) => pairs.push((target, src)),
        }
    }
    let mut unexpected: Vec<String> =
        state.keys().filter(|k| !targets.iter().any(|(n, _)| n == *k)).cloned().collect();
    unexpected.sort();
    if !mismatched.is_empty() || (strict && (!missing.is_empty() || !unexpected.is_empty())) {
        return Err(LoadError::Mismatch { missing, unexpected, mismatched });
    }
    // Move everything first, so a failed transfer leaves the module untouched.
    let moved: Vec<Tensor> = pairs
        .iter()
        .map(|(target, src)| {
            if src.device() == target.device() {
                Ok((*src).clone())
            } else {
                src.to_device(target.device())
            }
        })
        .collect::<Result<_, _>>()?;
    for ((target, _), src) in pairs.iter().zip(&moved) {
        target.copy_(src);
    }
    Ok(LoadReport { missing, unexpected })
}
