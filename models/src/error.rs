//! Errors of everything that reads files: configs, checkpoints, tokenizers.

use oxtrain_nn::LoadError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    /// A `config.json` or `model.safetensors.index.json` that is not what it should be.
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },

    /// A state dict without a tensor every torchvision ResNet has (`fc.weight`,
    /// `layer1.0.conv1.weight`, ...), so its architecture cannot be read from it.
    #[error(
        "{}no `{missing}`: not a torchvision ResNet state dict (pass the ResNetConfig it was saved from)",
        path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default()
    )]
    NotResNet { path: Option<PathBuf>, missing: String },

    /// A configuration that cannot build a model (`n_embd` not divisible by `n_head`, ...),
    /// made in code; read from a file it is a [`ModelError::BadFile`] naming the file.
    #[error("{model} config: {reason}")]
    BadConfig { model: &'static str, reason: String },

    /// The weights do not fit the model (names and shapes listed).
    #[error(transparent)]
    Load(#[from] LoadError),

    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),

    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    /// The same error, named after the file the configuration came from.
    pub(crate) fn in_file(self, path: &std::path::Path) -> ModelError {
        match self {
            ModelError::BadConfig { model, reason } => {
                ModelError::BadFile { path: path.to_path_buf(), reason: format!("{model} config: {reason}") }
            }
            other => other,
        }
    }
}

pub(crate) fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

/// Parses a JSON file into `T`, naming the file and serde's reason on failure.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| ModelError::BadFile {
        path: path.to_path_buf(),
        reason: format!("not the expected JSON ({e})"),
    })
}
