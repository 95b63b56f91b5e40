//! Backend `mpi` (feature `mpi`): CPU tensors across processes and nodes through MPI.
//!
//! Reductions run in the accumulation type (f32 for f32/f16/bf16, f64 for f64) so half
//! types are rounded once, as on the other backends. MPI has no timeouts of its own: a rank
//! that dies makes the MPI runtime (mpirun, srun) end the job.

use crate::communicator::{CommOptions, CpuCommunicator};
use crate::element::{Accumulator, ReduceElement};
use crate::engine::CpuEngine;
use crate::error::{CommError, Result};
use crate::op::{shard_range, ReduceOp};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::*;
use oxtrain_tensor::DType;

pub(crate) struct MpiEngine {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    // Finalises MPI when the engine (the worker thread) ends; declared last, dropped last.
    _universe: mpi::environment::Universe,
}

/// Initialises MPI on the communicator's worker thread (all MPI calls come from it) and
/// returns a communicator over `MPI_COMM_WORLD`.
pub fn connect(opts: &CommOptions) -> Result<CpuCommunicator> {
    let (tx, rx) = std::sync::mpsc::channel();
    let make = move || -> Result<MpiEngine> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| CommError::Mpi("MPI was already initialised in this process".into()))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let _ = tx.send((rank, size));
        Ok(MpiEngine { world, rank, size, _universe: universe })
    };
    // The rank and size are known once the worker has initialised MPI.
    let (send_make, recv_ids) = (make, rx);
    let comm = CpuCommunicator::spawn_with_ids("mpi", opts, send_make, move || {
        recv_ids.recv().map_err(|_| CommError::Mpi("MPI initialisation failed".into()))
    })?;
    Ok(comm)
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    }
}

/// The data in the accumulation type MPI reduces in.
enum Acc {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

fn widen<T: ReduceElement>(data: &[T]) -> Acc {
    if T::DTYPE == DType::F64 {
        Acc::F64(data.iter().map(|x| x.to_acc().to_f64()).collect())
    } else {
        Acc::F32(data.iter().map(|x| x.to_acc().to_f64() as f32).collect())
    }
}

fn narrow_into<T: ReduceElement>(acc: &Acc, out: &mut [T], op: ReduceOp, n: usize) {
    let div = if op == ReduceOp::Avg { n as f64 } else { 1.0 };
    match acc {
        Acc::F32(v) => {
            for (o, x) in out.iter_mut().zip(v) {
                let a = if op == ReduceOp::Avg { *x / div as f32 } else { *x };
                *o = T::from_acc(T::Acc::from_f64(a as f64));
            }
        }
        Acc::F64(v) => {
            for (o, x) in out.iter_mut().zip(v) {
                *o = T::from_acc(T::Acc::from_f64(*x / div));
            }
        }
    }
}

impl MpiEngine {
    fn all_reduce_acc(&self, send: &Acc, op: ReduceOp) -> Acc {
        match send {
            Acc::F32(v) => {
                let mut out = vec![0f32; v.len()];
                self.world.all_reduce_into(&v[..], &mut out[..], system_op(op));
                Acc::F32(out)
            }
            Acc::F64(v) => {
                let mut out = vec![0f64; v.len()];
                self.world.all_reduce_into(&v[..], &mut out[..], system_op(op));
                Acc::F64(out)
            }
        }
    }
}

impl CpuEngine for MpiEngine {
    fn all_reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let acc = self.all_reduce_acc(&widen(data), op);
        narrow_into(&acc, data, op, self.size);
        Ok(())
    }

    fn reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let send = widen(data);
        let root_proc = self.world.process_at_rank(root as i32);
        match &send {
            Acc::F32(v) if self.rank == root => {
                let mut out = vec![0f32; v.len()];
                root_proc.reduce_into_root(&v[..], &mut out[..], system_op(op));
                narrow_into(&Acc::F32(out), data, op, self.size);
            }
            Acc::F64(v) if self.rank == root => {
                let mut out = vec![0f64; v.len()];
                root_proc.reduce_into_root(&v[..], &mut out[..], system_op(op));
                narrow_into(&Acc::F64(out), data, op, self.size);
            }
            Acc::F32(v) => root_proc.reduce_into(&v[..], system_op(op)),
            Acc::F64(v) => root_proc.reduce_into(&v[..], system_op(op)),
        }
        Ok(())
    }

    fn reduce_scatter<T: ReduceElement>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        // MPI_Reduce_scatter_block needs equal parts; an all-reduce covers uneven ones.
        let acc = self.all_reduce_acc(&widen(input), op);
        let shard = shard_range(input.len(), self.size, self.rank);
        let part = match acc {
            Acc::F32(v) => Acc::F32(v[shard].to_vec()),
            Acc::F64(v) => Acc::F64(v[shard].to_vec()),
        };
        narrow_into(&part, output, op, self.size);
        Ok(())
    }

    fn all_gather(&mut self, input: &[u8], output: &mut [u8], elem_size: usize) -> Result<()> {
        let total = output.len() / elem_size;
        let mut counts = Vec::with_capacity(self.size);
        let mut displs = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let s = shard_range(total, self.size, r);
            let (c, d) = (s.len() * elem_size, s.start * elem_size);
            if c > i32::MAX as usize || d > i32::MAX as usize {
                return Err(CommError::Mpi(format!(
                    "all_gather of {} bytes exceeds MPI's 32-bit counts",
                    output.len()
                )));
            }
            counts.push(c as i32);
            displs.push(d as i32);
        }
        let mut part = PartitionMut::new(output, counts, displs);
        self.world.all_gather_varcount_into(input, &mut part);
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()> {
        self.world.process_at_rank(root as i32).broadcast_into(data);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    fn abort(&mut self) {}

    fn leave(&mut self) {}
}
