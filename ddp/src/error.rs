//! The one error type of oxtrain-ddp: what a wrapper or a step can refuse, each with the
//! fields a caller may match on, and the collective's own error as a source.

use oxtrain_comm::CommError;
use oxtrain_tensor::DType;

/// Why DDP could not wrap a model or reduce a step's gradients.
#[derive(Debug, thiserror::Error)]
pub enum DdpError {
    /// A collective failed (a peer died, a timeout, a backend error).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A bucket capacity in [`crate::DdpConfig`] is zero, negative or not a number.
    #[error("DdpConfig: {field} must be a positive number of MiB, got {value}")]
    BadBucketCap { field: &'static str, value: f64 },
    /// Only floating-point parameters can be averaged across ranks.
    #[error("DDP: parameter `{name}` has dtype {dtype}; only floating-point parameters can be reduced")]
    NotReducible { name: String, dtype: DType },
    /// Rank `rank` wraps another architecture or configuration than rank 0.
    #[error(
        "DDP: rank {rank} wraps a different model than rank 0 ({how}); every rank must build the same \
         model (same architecture and configuration) before wrapping it"
    )]
    DifferentModel { rank: usize, how: String },
    /// One backward pass produced a parameter's gradient twice.
    #[error(
        "DDP: parameter `{0}` got its gradient twice in one backward pass (a second backward through the \
         same graph with retain_graph, or the parameter reached twice by autograd); DDP reduces each \
         gradient once per backward: accumulate over several backward passes inside ddp.no_sync(..) instead"
    )]
    GradientTwice(String),
    /// A [`crate::ZeroOptimizer`] over a wrapper made without `shard_optimizer`.
    #[error(
        "ZeroOptimizer: the DDP wrapper reduces whole gradients; wrap the model with \
         DdpConfig {{ shard_optimizer: true, .. }} so its buckets are reduce-scattered into shards"
    )]
    NotSharded,
    /// A backward under `shard_optimizer` with no [`crate::ZeroOptimizer`] built.
    #[error(
        "DDP: shard_optimizer is on but no ZeroOptimizer was built over this wrapper; each rank now \
         holds only its shard of the averaged gradients, which a plain optimizer cannot step: build \
         the optimizer with ZeroOptimizer::new(&ddp, groups, build)"
    )]
    NoZeroOptimizer,
    /// Sharding and bf16 compression together.
    #[error(
        "DDP: shard_optimizer does not combine with bf16 gradient compression yet; turn one of them off"
    )]
    ShardedCompression,
    /// A parameter whose memory is not one contiguous block cannot be sliced into shards.
    #[error(
        "ZeroOptimizer: parameter `{0}` is not contiguous, so its shard cannot be a view of it; make \
         the module's parameters contiguous (`.contiguous()` before wrapping) or leave shard_optimizer off"
    )]
    NotContiguous(String),
    /// A parameter group names a parameter the wrapped module does not have.
    #[error(
        "ZeroOptimizer: a parameter of shape {shape:?} in the groups is not one of the wrapped module's \
         parameters; build the groups from ddp.module().parameters() or named_parameters()"
    )]
    NotInModel { shape: Vec<usize> },
    /// A file that is not a part written by [`crate::ShardState::save`].
    #[error(
        "ZeRO resume: {path} is not a ZeRO optimizer shard (no `zero_shard` metadata, or it is damaged)"
    )]
    NotAShard { path: std::path::PathBuf },
    /// The parts given are not every rank's part of one save.
    #[error(
        "ZeRO resume: expected the parts of all {world} ranks of one save, got (rank, world) {found:?}; pass \
         every rank's shard file of the checkpoint"
    )]
    IncompleteShards { world: usize, found: Vec<(usize, usize)> },
    /// The saved buckets differ from this model's: another model or other bucket caps.
    #[error(
        "ZeRO resume: the saved state is of another model or bucket layout (bucket lengths {saved:?}, this \
         model's {now:?}); resume with the same model and the same ddp.bucket_cap_mb / first_bucket_cap_mb"
    )]
    OtherModel { saved: Vec<usize>, now: Vec<usize> },
    /// The saved state is of another optimizer (other hyper-parameters) or other groups.
    #[error(
        "ZeRO resume: the saved state is of another optimizer (hyper-parameters {saved:?}, this one's \
         {now:?}; groups {groups:?} saved/now); resume with the optimizer and groups it was saved with"
    )]
    OtherOptimizer { saved: Vec<String>, now: Vec<String>, groups: (usize, usize) },
    /// Moving or packing a tensor the reducer needs failed (device memory, a dead device).
    #[error("DDP: {what}: {source}")]
    Tensor {
        what: &'static str,
        #[source]
        source: oxtrain_tensor::Error,
    },
}

/// Results of this crate.
pub type Result<T, E = DdpError> = std::result::Result<T, E>;

/// The [`DdpError::Tensor`] for a failure while handling `what`.
pub(crate) fn tensor_error(what: &'static str) -> impl Fn(oxtrain_tensor::Error) -> DdpError {
    move |source| DdpError::Tensor { what, source }
}
