//! Errors of the datasets crate: everything here touches files, so failures are values that
//! name the file and say what to do, never panics.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    /// A file that is not a usable image: empty, truncated, of an unknown format, or too large.
    #[error("bad image file {}: {reason}", path.display())]
    BadImage { path: PathBuf, reason: String },

    /// An image folder without the expected layout.
    #[error("{}: {reason}", path.display())]
    Layout { path: PathBuf, reason: String },

    /// A text dataset line that cannot be used.
    #[error("{}:{line}: {reason}", path.display())]
    BadRecord { path: PathBuf, line: usize, reason: String },

    /// A file that is not a usable token shard (llm.c's format): what is wrong with it.
    #[error(
        "token shard {}: {problem}; write it again with `oxtrain tokenize` (or llm.c's write_datafile)",
        path.display()
    )]
    TokenShard {
        path: PathBuf,
        #[source]
        problem: crate::token_shards::ShardProblem,
    },

    /// Every file an epoch tried was bad: nothing to train on.
    #[error(
        "every image of the epoch failed to load ({bad} bad-file loads, {total} files in the dataset), \
         the first: {first}; check the data folder (wrong path, files still downloading, or a format other \
         than JPEG, PNG, BMP, PPM and PGM)"
    )]
    NoGoodFiles { bad: usize, total: usize, first: String },

    /// A setting that cannot work (a batch size of 0, ...): what it was and what to use.
    #[error("invalid setting: {0}")]
    Config(String),

    /// A saved sampler or loader state that does not fit.
    #[error("cannot restore state: {0}")]
    State(String),

    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),

    /// The GPU JPEG decoder could not be opened or run (nvJPEG missing, no GPU, a CUDA error);
    /// files it merely refuses are decoded on the CPU instead and never reach this.
    #[error("the GPU JPEG decoder (nvJPEG): {0}; set data.decode = \"cpu\" to decode on the CPU")]
    GpuDecoder(String),

    /// A worker thread failed (a panic inside a transform or a user-supplied dataset).
    #[error("data loader worker failed: {0}")]
    Worker(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn bad_image(path: impl Into<PathBuf>, reason: impl Into<String>) -> Error {
        Error::BadImage { path: path.into(), reason: reason.into() }
    }
}
