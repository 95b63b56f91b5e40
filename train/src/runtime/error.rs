//! Why a run stopped.

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data: {0}")]
    Data(String),
    #[error("model: {0}")]
    Model(String),
    #[error("device: {0}")]
    Device(String),
    #[error("communication: {0}")]
    Comm(String),
    /// `what` went bad ("the loss is NaN", "a gradient is inf"); `advice` names the first bad
    /// tensor and what to do.
    #[error("{what} at step {step} (epoch {epoch}); {advice}")]
    NonFinite { what: String, step: usize, epoch: usize, advice: String },
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A fresh start in a folder that holds a run: what is there and the three ways on.
    #[error(
        "{} holds an earlier run ({}{}); continue it with `oxtrain train --resume`, start a new run \
         in another folder with log.dir=..., or delete it and start afresh with `oxtrain train --overwrite`",
        dir.display(),
        found.iter().take(3).map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        if found.len() > 3 { format!(" and {} more", found.len() - 3) } else { String::new() }
    )]
    RunExists { dir: std::path::PathBuf, found: Vec<std::path::PathBuf> },
    #[error("cannot write {path}: {reason}")]
    Output { path: String, reason: String },
}

impl TrainError {
    pub(crate) fn output(path: &std::path::Path, e: impl std::fmt::Display) -> TrainError {
        TrainError::Output { path: path.display().to_string(), reason: e.to_string() }
    }
}
