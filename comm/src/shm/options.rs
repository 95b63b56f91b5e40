//! [`ShmOptions`]: the shm backend's sizes and naming; `Default` reads `OXTRAIN_SHM_*`.

use crate::options::CommOptions;

/// Sizes and naming of the shared segment.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    pub comm: CommOptions,
    /// Bytes of each staging buffer per rank (two per rank). Larger tensors go through in
    /// chunks. `OXTRAIN_SHM_CHUNK_BYTES`, default 1 MiB.
    pub chunk_bytes: usize,
    /// Bytes of symmetric heap per rank. `OXTRAIN_SHM_HEAP_BYTES`, default 16 MiB.
    pub heap_bytes: usize,
    /// Segment name (under /dev/shm). `OXTRAIN_SHM_NAME`, default `oxtrain-comm-p<store port>`.
    pub name: Option<String>,
}

fn env_bytes(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            comm: CommOptions::default(),
            chunk_bytes: env_bytes("OXTRAIN_SHM_CHUNK_BYTES", 1 << 20),
            heap_bytes: env_bytes("OXTRAIN_SHM_HEAP_BYTES", 16 << 20),
            name: std::env::var("OXTRAIN_SHM_NAME").ok(),
        }
    }
}
