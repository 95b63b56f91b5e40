//! oxtrain-comm: collectives and one-sided communication between ranks.
//!
//! - [`Communicator`]: all_reduce, reduce, reduce_scatter, all_gather, broadcast, barrier on
//!   tensors, in place, returning a [`Work`] to wait on.
//! - [`SymmetricMemory`]: a symmetric heap with put / get / put_with_signal / wait_until /
//!   fence / quiet / atomics, generic over element types.
//! - Backends: `shm` (processes of one host through POSIX shared memory), `local` (threads,
//!   for tests), `mpi` (feature `mpi`). GPU backends plug into the same traits.
//! - Bootstrap: [`LaunchEnv`] reads torchrun / mpirun / srun variables, [`TcpStore`] exchanges
//!   ids, [`init_from_env`] makes a process group.
//! - DistributedDataParallel lives in its own crate, `oxtrain-ddp`, built on this one.
#![doc = include_str!("../README.md")]

#[macro_use]
mod element;
pub mod bootstrap;
mod check;
mod communicator;
mod engine;
mod error;
mod gpu;
mod init;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl;
pub mod nvshmem;
mod op;
mod options;
mod request;
pub mod shm;
pub mod symmetric;
mod work;

#[doc(hidden)]
pub use half as __half;
#[doc(hidden)]
pub use oxtrain_tensor::DType as __DType;

pub use bootstrap::{store_from_env, LaunchEnv, Launcher, TcpStore};
pub use communicator::{Communicator, CpuCommunicator};
pub use element::{CommElement, ReduceElement};
pub use error::{CommError, Result};
pub use init::{init_from_env, ProcessGroup};
pub use op::{shard_range, ReduceOp};
pub use options::{CommOptions, InitOptions};
pub use shm::{ShmHeap, ShmOptions, ShmWorld};
pub use symmetric::{AtomicElement, Cmp, Signal, SignalOp, SymBuffer, SymmetricMemory};
pub use work::{Work, WorkWaiter};

/// A group of `world` ranks as threads of this process (backend `local`): one
/// [`ShmWorld`] per rank, to move onto its own thread.
pub fn local_group(world: usize) -> Result<Vec<ShmWorld>> {
    shm::local_group(world, &ShmOptions::default())
}
