//! Errors of communication: everything here touches other processes, so it is a `Result`.
//! Each variant carries what a caller can act on (the ranks, the variable, the segment); the
//! causes from the system and from tensors are kept as sources.

use std::sync::Arc;
use std::time::Duration;

/// What went wrong between ranks, and what to do about it. Clone (a failure is reported to
/// every waiter of a collective), so the sources are shared.
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
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A tensor a collective needs could not be made or moved (device memory, a dead device).
    #[error("{what}: {source}")]
    Tensor {
        what: String,
        #[source]
        source: Arc<oxtrain_tensor::Error>,
    },
    /// A GPU library (the CUDA driver, NCCL) returned an error; `message` is its own.
    #[error("{library}: {what}: {message}")]
    Library { library: &'static str, what: String, message: String },
    /// A launcher variable that is set but malformed (`RANK=x`, `MASTER_PORT=http`).
    #[error("bootstrap: environment variable {var}={value:?} is not {expected}")]
    BadVariable { var: String, value: String, expected: &'static str },
    /// A variable the launcher in use must set.
    #[error("bootstrap: {launcher} launch: {var} is not set")]
    MissingVariable { var: &'static str, launcher: &'static str },
    /// A rank (or local rank) at or above its world size.
    #[error("bootstrap: {what} {rank} is not below the {what_world} {world}{detail}")]
    RankOutOfRange { what: &'static str, rank: usize, what_world: &'static str, world: usize, detail: String },
    /// Rank 0's store did not answer within the timeout.
    #[error(
        "bootstrap: could not reach the store of rank 0 at {addr} within {timeout:?}{}: is rank 0 running, and are \
         MASTER_ADDR/MASTER_PORT the same on every rank?",
        last.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    StoreUnreachable { addr: String, timeout: Duration, last: Option<Arc<std::io::Error>> },
    /// A store key that no rank set in time (a rank that never got this far).
    #[error("bootstrap: store: key '{key}' was not set within {timeout:?}")]
    StoreKeyMissing { key: String, timeout: Duration },
    /// A backend's unique id in the store has the wrong size (ranks of different builds, or a
    /// stale store).
    #[error("bootstrap: {backend}: the unique id in the store has {bytes} bytes, not {expected}")]
    BadUniqueId { backend: &'static str, bytes: usize, expected: usize },
    /// The job's shape does not fit the chosen backend or devices (`reason` says what to change).
    #[error("bootstrap: {reason}")]
    Placement { reason: String },
    /// A shared-memory segment that belongs to another job or disagrees with this rank.
    #[error("bootstrap: shm: segment {segment}: {problem}")]
    Segment { segment: String, problem: String },
    /// The call cannot be served by this backend (a CUDA tensor on a CPU backend, ...).
    #[error("{0}")]
    Unsupported(String),
    /// An earlier error left this communicator unusable (peers may be out of step).
    #[error("communicator unusable after an earlier error: {0}; create a new communicator (the mpi backend initialises MPI once per process: restart the job)")]
    Aborted(String),
    /// MPI was initialised before this communicator (once per process).
    #[error("mpi: MPI was already initialised in this process")]
    MpiAlreadyInitialised,
    /// MPI's initialisation thread failed.
    #[error("mpi: MPI initialisation failed")]
    MpiInitFailed,
    /// A message larger than MPI's 32-bit counts.
    #[error("mpi: {op} of {bytes} bytes exceeds MPI's 32-bit counts")]
    MpiTooLarge { op: &'static str, bytes: usize },
}

impl CommError {
    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> CommError {
        CommError::Io { what: what.into(), source: Arc::new(err) }
    }

    pub(crate) fn tensor(what: impl Into<String>, err: oxtrain_tensor::Error) -> CommError {
        CommError::Tensor { what: what.into(), source: Arc::new(err) }
    }
}

pub type Result<T> = std::result::Result<T, CommError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LaunchEnv;
    use std::collections::HashMap;

    fn env_of(vars: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_vars(|k| map.get(k).cloned())
    }

    /// A caller can tell a malformed variable from a missing one and read which, and the
    /// system's error stays reachable as the source.
    #[test]
    fn launch_errors_name_the_variable_and_keep_their_source() {
        match env_of(&[("RANK", "one"), ("WORLD_SIZE", "2")]) {
            Err(CommError::BadVariable { var, value, .. }) => {
                assert_eq!((var.as_str(), value.as_str()), ("RANK", "one"))
            }
            other => panic!("expected BadVariable, got {other:?}"),
        }
        match env_of(&[("RANK", "0")]) {
            Err(CommError::MissingVariable { var, .. }) => assert_eq!(var, "WORLD_SIZE"),
            other => panic!("expected MissingVariable, got {other:?}"),
        }
        match env_of(&[("RANK", "2"), ("WORLD_SIZE", "2")]) {
            Err(CommError::RankOutOfRange { rank: 2, world: 2, .. }) => {}
            other => panic!("expected RankOutOfRange, got {other:?}"),
        }
        let io = CommError::io("opening", std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        let source = std::error::Error::source(&io).expect("an io error keeps its source");
        assert!(source.to_string().contains("permission denied"), "{source}");
    }
}
