//! The vocabulary below the tasks and the loop: where a process sits (rank, world, device),
//! how its work is spread ([`Strategy`]), the autocast dtype, and the trainer's error. The
//! tasks, the metrics and the loop all use it; it uses none of them.

mod error;
mod strategy;

pub use error::TrainError;
pub use strategy::{as_zero, as_zero_mut, Strategy, Zero};

use crate::config::{parse_device, Config, DdpBackend, GradCompression, PrecisionDtype};
use oxtrain_ddp::{Compression, DdpConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{DType, Device};

/// Where a process sits in the job (from the launcher's variables; 0 of 1 alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub rank: usize,
    pub world_size: usize,
    pub device: Device,
}

/// The autocast dtype of the config's precision (None for f32).
pub fn autocast_dtype(config: &Config) -> Option<DType> {
    match config.precision.dtype {
        PrecisionDtype::F32 => None,
        PrecisionDtype::Bf16 => Some(DType::BF16),
        PrecisionDtype::F16 => Some(DType::F16),
    }
}

/// Rank, world size and device, from the launcher's variables (torchrun's, mpirun's or srun's,
/// as comm reads them) and `train.device`.
pub fn placement(config: &Config) -> Result<Placement, TrainError> {
    let env = oxtrain_comm::bootstrap::LaunchEnv::from_env().map_err(|e| TrainError::comm("", e))?;
    let device = match parse_device(&config.train.device).expect("checked with the config") {
        Some(d) => d,
        None => Device::cuda_if_available(env.local_rank),
    };
    device
        .check_available()
        .map_err(|e| TrainError::device(format!("train.device = {:?}", config.train.device), e))?;
    Ok(Placement { rank: env.rank, world_size: env.world_size, device })
}

/// One process alone, or DDP over the process group the launcher's variables describe
/// (`ddp.backend` picks the communicator; auto: nccl on GPUs, comm's choice on CPUs).
pub fn make_strategy<M: Module>(
    model: M,
    config: &Config,
    place: Placement,
) -> Result<Strategy<M>, TrainError> {
    if place.world_size == 1 {
        return Ok(Strategy::single(model));
    }
    let backend = match (config.ddp.backend, place.device) {
        (DdpBackend::Auto, Device::Cuda(_)) => Some("nccl".to_string()),
        (DdpBackend::Auto, Device::Cpu) => None,
        (b, _) => Some(crate::config::enum_name(&b)),
    };
    if let Some(b) = backend {
        if std::env::var_os("OXTRAIN_COMM_BACKEND").is_none() {
            // Read by comm's init_from_env just below, on this thread, before any other starts.
            std::env::set_var("OXTRAIN_COMM_BACKEND", b);
        }
    }
    let group = oxtrain_comm::init_from_env().map_err(|e| TrainError::comm("", e))?;
    let ddp = DdpConfig {
        bucket_cap_mb: config.ddp.bucket_cap_mb,
        first_bucket_cap_mb: config.ddp.first_bucket_cap_mb,
        find_unused_parameters: config.ddp.find_unused_parameters,
        shard_optimizer: config.ddp.shard_optimizer,
        compression: match config.ddp.compression {
            GradCompression::None => Compression::None,
            GradCompression::Bf16 => Compression::Bf16,
        },
        ..DdpConfig::default()
    };
    Strategy::ddp(model, group, ddp, config.ddp.sync_batchnorm).map_err(|e| TrainError::comm("", e))
}
