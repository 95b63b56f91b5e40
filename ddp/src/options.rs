//! The options of DDP ([`DdpConfig`]): the one place its environment variable is read.

use std::path::PathBuf;

/// How the reduced gradient combines the ranks' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// The average over ranks (PyTorch's default: each rank's loss is a mean over its batch,
    /// so the average is the gradient of the mean over the global batch).
    Mean,
    /// The sum over ranks.
    Sum,
}

/// What is sent over the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Gradients in their own dtype.
    None,
    /// bf16 on the wire, f32 accumulation, written back in the parameter's dtype (PyTorch's
    /// `bf16_compress_hook`): half the bytes, about 3 significant digits per reduced value.
    Bf16,
}

/// Options of [`DistributedDataParallel`]; `Default` is PyTorch's.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpConfig {
    /// Size of every bucket but the first, in MiB (`bucket_cap_mb`, 25 as PyTorch).
    pub bucket_cap_mb: f64,
    /// Size of the first bucket (the last layers' gradients, ready first), in MiB: small, so
    /// the first all-reduce starts early in backward.
    pub first_bucket_cap_mb: f64,
    /// Re-broadcast rank 0's buffers (batch-norm running statistics) at each forward.
    pub broadcast_buffers: bool,
    /// Allow parameters that get no gradient in a backward pass (they count as zero; one
    /// unused everywhere keeps no gradient). Off: such a parameter is an error naming it.
    pub find_unused_parameters: bool,
    pub reduction: Reduction,
    pub compression: Compression,
    /// Write the Chrome trace of every step here when the wrapper is dropped (per rank:
    /// `trace.rank3.json`); `Default` takes it from `OXTRAIN_TRACE`.
    pub trace: Option<PathBuf>,
    /// ZeRO-1: each bucket's gradients are reduce-scattered instead of all-reduced, and a
    /// [`crate::ZeroOptimizer`] steps only this rank's shard of each bucket, then all-gathers
    /// the parameters (`ddp.shard_optimizer` in a run's config).
    pub shard_optimizer: bool,
    /// ZeRO-1: the step launches the parameters' all-gathers and returns; each bucket's
    /// gather is waited for when the next forward first reads one of its parameters (on by
    /// default). Off: the step waits for every gather before it returns.
    pub overlap_param_gather: bool,
}

impl Default for DdpConfig {
    fn default() -> DdpConfig {
        DdpConfig {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            broadcast_buffers: true,
            find_unused_parameters: false,
            reduction: Reduction::Mean,
            compression: Compression::None,
            trace: std::env::var_os("OXTRAIN_TRACE").filter(|v| !v.is_empty()).map(PathBuf::from),
            shard_optimizer: false,
            overlap_param_gather: true,
        }
    }
}
