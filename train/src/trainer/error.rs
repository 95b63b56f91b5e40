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
    #[error("cannot write {path}: {reason}")]
    Output { path: String, reason: String },
}

impl TrainError {
    pub(crate) fn output(path: &std::path::Path, e: impl std::fmt::Display) -> TrainError {
        TrainError::Output { path: path.display().to_string(), reason: e.to_string() }
    }
}
