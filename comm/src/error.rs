//! Errors of communication: everything here touches other processes, so it is a `Result`.

use std::time::Duration;

/// What went wrong between ranks, and what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    /// A wait ran past its timeout; `ranks` are the ones that never arrived.
    #[error("{op}: rank {me} timed out after {timeout:?} waiting for rank(s) {ranks:?}; {hint}")]
    Timeout { op: String, me: usize, ranks: Vec<usize>, timeout: Duration, hint: String },
    /// A peer process exited or left the communicator while this rank waited for it.
    #[error("{op}: rank {me} waited for rank {rank}, which {detail}")]
    PeerFailed { op: String, me: usize, rank: usize, detail: String },
    /// In checking mode: ranks called collectives that do not match.
    #[error("{op}: ranks called mismatched collectives: {detail}")]
    Mismatch { op: String, detail: String },
    /// A system call, a file or a socket failed.
    #[error("{what}: {message}")]
    Io { what: String, message: String },
    /// The launcher's environment or the rendezvous is wrong.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The call cannot be served by this backend (a CUDA tensor on a CPU backend, ...).
    #[error("{0}")]
    Unsupported(String),
    /// An earlier error left this communicator unusable (peers may be out of step).
    #[error("communicator unusable after an earlier error: {0}; create a new communicator (the mpi backend initialises MPI once per process: restart the job)")]
    Aborted(String),
    /// The MPI library reported an error.
    #[error("mpi: {0}")]
    Mpi(String),
}

impl CommError {
    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> CommError {
        CommError::Io { what: what.into(), message: err.to_string() }
    }
}

pub type Result<T> = std::result::Result<T, CommError>;
