//! What can go wrong saving, finding and loading checkpoints, each with what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file or folder operation failed (permissions, a missing folder, an I/O error).
    #[error("{path}: {what}: {source}")]
    Io { path: PathBuf, what: String, source: std::io::Error },

    /// The disk filled up, or would have: nothing at `path` was committed, and the previous
    /// checkpoint is untouched.
    #[error(
        "{path}: not enough disk space for the checkpoint: it needs {needed} bytes ({needed_mb:.1} MB), \
         {available} bytes are free{previous}; free space, write checkpoints elsewhere, or keep fewer \
         (keep_last)",
        needed_mb = *needed as f64 / 1e6,
        available = available.map_or("an unknown number of".to_string(), |a| a.to_string()),
        previous = previous.as_ref().map_or(String::new(), |p| format!("; the previous checkpoint {} is intact", p.display()))
    )]
    DiskFull { path: PathBuf, needed: u64, available: Option<u64>, previous: Option<PathBuf> },

    /// A checkpoint whose files do not match its manifest (or that has none): never used.
    #[error("{path}: not a valid checkpoint: {problem}")]
    Invalid { path: PathBuf, problem: super::manifest::Problem },

    /// No valid checkpoint where one was asked for: `why` lists what was skipped, `hint` says
    /// what to do (it depends on who asked: a resume, an export).
    #[error("no valid checkpoint in {dir}{why}; {hint}")]
    NotFound { dir: PathBuf, why: String, hint: String },

    /// The saved state does not fit the objects it is restored into (another model, other
    /// optimizer groups, a config change).
    #[error("{path}: cannot restore {what}: {message}")]
    Restore { path: PathBuf, what: &'static str, message: String },

    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),

    /// Taking or restoring a ZeRO-1 optimizer shard.
    #[error("the optimizer's ZeRO-1 shards: {0}")]
    Shard(#[from] oxtrain_ddp::DdpError),

    /// The writer thread panicked or vanished: a bug, reported instead of losing the save silently.
    #[error("the checkpoint writer thread ended unexpectedly ({0}); the last save may be missing")]
    WriterGone(String),

    /// `snapshot` was called while the previous snapshot was neither saved nor dropped.
    #[error(
        "a checkpoint snapshot was taken while the previous one is still being built: save it \
         (Checkpointer::save) or drop it first"
    )]
    SnapshotOpen,
}

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

pub(crate) fn io(
    path: impl Into<PathBuf>,
    what: impl Into<String>,
) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let (path, what) = (path.into(), what.into());
    move |source| CheckpointError::Io { path, what, source }
}
