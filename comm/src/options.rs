//! The options every backend shares ([`CommOptions`]) and the choice of backend
//! ([`InitOptions`]). Each backend's own tuning lives beside it (`shm::ShmOptions`,
//! `nvshmem::NvshmemOptions`); `Default` of each reads its `OXTRAIN_*` variables, and only
//! these types read them. The table of every variable is in comm's README.

use std::time::Duration;

/// Options of every backend: how long a wait lasts, and checking mode.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// Every wait gives up after this long with an error naming the missing ranks.
    /// `OXTRAIN_COMM_TIMEOUT` (seconds), default 300.
    pub timeout: Duration,
    /// Compare each call's kind, dtype, size, op and root across ranks first (costs one
    /// small exchange per call). `OXTRAIN_COMM_CHECK=1` (or `true`), default off.
    pub check: bool,
}

impl Default for CommOptions {
    fn default() -> Self {
        let timeout = std::env::var("OXTRAIN_COMM_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(300));
        let check = std::env::var("OXTRAIN_COMM_CHECK").is_ok_and(|v| v == "1" || v == "true");
        CommOptions { timeout, check }
    }
}

/// What [`init_from_env`](crate::init_from_env) starts.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// `shm`, `mpi`, `nccl` or `nvshmem`; `None` picks `shm` when every rank is on this host,
    /// else `mpi` when built with it. `OXTRAIN_COMM_BACKEND`.
    pub backend: Option<String>,
}

impl InitOptions {
    pub fn from_env() -> InitOptions {
        InitOptions { backend: std::env::var("OXTRAIN_COMM_BACKEND").ok().filter(|b| !b.trim().is_empty()) }
    }
}
