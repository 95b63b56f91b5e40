//! [`init_from_env`]: the process group of a launched job. Above the backends: it picks one
//! and connects it through the store of [`bootstrap`](crate::bootstrap).

use crate::bootstrap::{store_from_env, LaunchEnv, TcpStore};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::options::InitOptions;
use crate::shm::{ShmOptions, ShmWorld};

/// A process group made from the environment: the communicator, the store it was made
/// with (for exchanging ids), and where this process sits.
pub struct ProcessGroup {
    pub comm: Box<dyn Communicator>,
    pub store: TcpStore,
    pub env: LaunchEnv,
    /// The symmetric heap, when the backend has one (shm).
    pub heap: Option<crate::shm::ShmHeap>,
}

/// The GPU of this process: its local rank (one process per GPU, as torchrun starts them).
fn gpu_ordinal(env: &LaunchEnv) -> Result<usize> {
    let count = oxtrain_tensor::cuda::device_count();
    if env.local_rank >= count {
        return Err(CommError::Placement { reason: format!(
            "local rank {} needs cuda:{}, but this process sees {count} CUDA device(s) (one process per GPU; check \
             CUDA_VISIBLE_DEVICES and LOCAL_RANK)",
            env.local_rank, env.local_rank
        ) });
    }
    Ok(env.local_rank)
}

/// The process group of a job started by torchrun, mpirun or srun (see [`LaunchEnv`]).
///
/// The backend is `OXTRAIN_COMM_BACKEND` (`shm`, `mpi`, `nccl`, `nvshmem`; the GPU backends
/// use GPU `LOCAL_RANK` and CUDA tensors), else `shm` when every rank is on
/// this host, else `mpi` when built with the `mpi` feature. Timeouts and checking mode come
/// from `OXTRAIN_COMM_TIMEOUT` (seconds) and `OXTRAIN_COMM_CHECK=1`.
pub fn init_from_env() -> Result<ProcessGroup> {
    let env = LaunchEnv::from_env()?;
    let opts = ShmOptions::default();
    let backend = match InitOptions::from_env().backend {
        Some(b) => b,
        None if env.single_node() => "shm".into(),
        None if cfg!(feature = "mpi") => "mpi".into(),
        None => {
            return Err(CommError::Placement { reason: format!(
                "{} ranks over several hosts need a network backend: build with `--features mpi` and launch with \
                 mpirun or srun, or use the nccl backend for GPUs",
                env.world_size
            ) })
        }
    };
    let store = store_from_env(&env, opts.comm.timeout)?;
    match backend.as_str() {
        "shm" => {
            if !env.single_node() {
                return Err(CommError::Placement { reason: format!(
                    "backend shm needs every rank on one host, but LOCAL_WORLD_SIZE={} < WORLD_SIZE={}",
                    env.local_world_size, env.world_size
                ) });
            }
            let ShmWorld { comm, heap } = crate::shm::connect(env.rank, env.world_size, &store, &opts)?;
            Ok(ProcessGroup { comm: Box::new(comm), store, env, heap: Some(heap) })
        }
        "nccl" | "nvshmem" => {
            let ordinal = gpu_ordinal(&env)?;
            let comm: Box<dyn Communicator> = if backend == "nccl" {
                Box::new(crate::nccl::NcclCommunicator::connect(env.rank, env.world_size, ordinal, &store)?)
            } else {
                Box::new(crate::nvshmem::NvshmemCommunicator::connect(
                    env.rank,
                    env.world_size,
                    ordinal,
                    &store,
                    Default::default(),
                )?)
            };
            Ok(ProcessGroup { comm, store, env, heap: None })
        }
        #[cfg(feature = "mpi")]
        "mpi" => {
            let comm = crate::mpi::connect(&opts.comm)?;
            Ok(ProcessGroup { comm: Box::new(comm), store, env, heap: None })
        }
        other => Err(CommError::Placement { reason: format!(
            "OXTRAIN_COMM_BACKEND={other:?} is not available in this build (CPU backends: shm{}; GPU backends: nccl, \
             nvshmem)",
            if cfg!(feature = "mpi") { ", mpi" } else { "; mpi needs --features mpi" }
        ) }),
    }
}
