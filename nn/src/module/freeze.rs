//! Freezing parameters by name pattern (`optim.freeze = ["layer1.*", "conv1.*"]`): PyTorch's
//! `for n, p in model.named_parameters(): p.requires_grad = not matches(n)`.

use super::{same_tensor, walk, Item, Module};
use crate::Parameter;
use oxtrain_tensor::Tensor;

/// Why a list of freeze patterns was refused. Nothing was frozen.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("freeze pattern {pattern:?} is not a valid glob ({source}); use `*` for any run of characters, e.g. \"layer1.*\"")]
    BadPattern {
        pattern: String,
        #[source]
        source: glob::PatternError,
    },
    #[error(
        "freeze pattern {pattern:?} matches no parameter of the model; patterns are globs on \
         state_dict names, which here look like {examples}"
    )]
    NoMatch { pattern: String, examples: String },
}

/// Every parameter of `module` with its state-dict name, frozen ones included.
fn all_parameters(module: &dyn Module, on: &mut dyn FnMut(&str, &Parameter)) {
    walk(&|v| module.visit(v), "", &mut |name, item| {
        if let Item::Param(p) = item {
            on(name, p)
        }
    });
}

/// Freezes every parameter whose state-dict name matches one of `patterns` (globs: `*` is any
/// run of characters, dots included) and returns their names. A parameter tied to a frozen one
/// (the same tensor under another name) is frozen too, as freezing a shared `nn.Parameter`
/// freezes it everywhere. A pattern that matches nothing is an error naming it: a typo would
/// otherwise train what the user meant to freeze.
pub fn freeze_matching<S: AsRef<str>>(
    module: &dyn Module,
    patterns: &[S],
) -> Result<Vec<String>, FreezeError> {
    let globs = patterns
        .iter()
        .map(|p| {
            glob::Pattern::new(p.as_ref())
                .map_err(|source| FreezeError::BadPattern { pattern: p.as_ref().to_string(), source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut names = Vec::new();
    let mut matched = vec![false; globs.len()];
    let mut tensors: Vec<Tensor> = Vec::new();
    all_parameters(module, &mut |name, p| {
        let mut hit = false;
        for (glob, m) in globs.iter().zip(matched.iter_mut()) {
            if glob.matches(name) {
                (*m, hit) = (true, true);
            }
        }
        if hit {
            tensors.push(p.tensor());
        }
        names.push(name.to_string());
    });
    if let Some(i) = matched.iter().position(|m| !m) {
        let examples: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
        return Err(FreezeError::NoMatch {
            pattern: patterns[i].as_ref().to_string(),
            examples: format!("{}, ...", examples.join(", ")),
        });
    }
    let mut frozen = Vec::new();
    all_parameters(module, &mut |name, p| {
        if tensors.iter().any(|t| same_tensor(t, &p.tensor())) {
            p.set_requires_grad(false);
            frozen.push(name.to_string());
        }
    });
    Ok(frozen)
}

/// Freezes (`false`) or unfreezes every parameter of `module` (`module.requires_grad_(flag)`).
pub fn set_requires_grad(module: &dyn Module, requires_grad: bool) {
    all_parameters(module, &mut |_, p| p.set_requires_grad(requires_grad));
}
