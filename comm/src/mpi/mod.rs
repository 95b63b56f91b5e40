//! Backend `mpi` (feature `mpi`): CPU tensors across processes and nodes through MPI.
//!
//! Reductions run in the accumulation type (f32 for f32/f16/bf16, f64 for f64) so half
//! types are rounded once, as on the other backends.
//!
//! Timeouts: MPI has none of its own, so every collective starts as an immediate
//! (non-blocking) MPI operation that is polled until it completes or until
//! [`CommOptions::timeout`] passes. The timeout error names the collective, this rank, and the
//! ranks missing: MPI cannot tell which ranks entered a collective, so after a timeout the
//! ranks that timed out tell each other on a side communicator which call they are stuck in
//! (see [`wait`]); the peers that say nothing, or that are stuck in another call, are named.
//!
//! MPI cannot cancel a collective, so after a timeout the operation stays pending inside MPI
//! and the communicator is unusable, as NCCL's after a timeout: later calls fail at once, the
//! buffers MPI may still touch are leaked, and when the communicator is dropped MPI is not
//! finalised (`MPI_Finalize` would wait for the ranks that never came); mpirun then reports
//! that the process exited without finalising and ends the job. A rank that dies makes the
//! MPI runtime (mpirun, srun) end the job.

mod wait;

use crate::communicator::CpuCommunicator;
use crate::element::{Accumulator, ReduceElement};
use crate::engine::CpuEngine;
use crate::error::{CommError, Result};
use crate::op::{shard_range, ReduceOp};
use crate::options::CommOptions;
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::*;
use oxtrain_tensor::DType;
use std::mem::ManuallyDrop;
use std::time::Duration;
use wait::{Op, Stuck};

pub(crate) struct MpiEngine {
    world: ManuallyDrop<SimpleCommunicator>,
    /// A duplicate of the world, only for the reports exchanged after a timeout (so they
    /// never match anything of the collectives).
    side: ManuallyDrop<SimpleCommunicator>,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Collectives started so far; a timeout report says which call a rank is stuck in.
    calls: u64,
    /// Set when a collective timed out: it is still pending inside MPI.
    stuck: Option<String>,
    /// Where all_gather and broadcast receive, kept between calls so large ones do not
    /// fault in fresh pages each time.
    staging: Vec<u8>,
    /// Finalises MPI when the engine (the worker thread) ends, unless a collective is stuck.
    universe: ManuallyDrop<mpi::environment::Universe>,
}

/// Initialises MPI on the communicator's worker thread (all MPI calls come from it) and
/// returns a communicator over `MPI_COMM_WORLD` whose collectives give up after
/// `opts.timeout`.
pub fn connect(opts: &CommOptions) -> Result<CpuCommunicator> {
    let (tx, rx) = std::sync::mpsc::channel();
    let timeout = opts.timeout;
    let make = move || -> Result<MpiEngine> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or(CommError::MpiAlreadyInitialised)?;
        let world = universe.world();
        let side = world.duplicate();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let _ = tx.send((rank, size));
        Ok(MpiEngine {
            world: ManuallyDrop::new(world),
            side: ManuallyDrop::new(side),
            rank,
            size,
            timeout,
            calls: 0,
            stuck: None,
            staging: Vec::new(),
            universe: ManuallyDrop::new(universe),
        })
    };
    // The rank and size are known once the worker has initialised MPI.
    let (send_make, recv_ids) = (make, rx);
    let comm = CpuCommunicator::spawn_with_ids("mpi", opts, send_make, move || {
        recv_ids.recv().map_err(|_| CommError::MpiInitFailed)
    })?;
    Ok(comm)
}

impl Drop for MpiEngine {
    fn drop(&mut self) {
        if self.stuck.is_some() {
            // Freeing the communicators and MPI_Finalize could wait for the ranks that never
            // came; leave everything to the process exit.
            eprintln!(
                "oxtrain-comm mpi: rank {} exits without MPI_Finalize because a collective timed out \
                 and is still pending in MPI; mpirun will report an abnormal exit and end the job",
                self.rank
            );
            return;
        }
        // SAFETY: each field is dropped once, here; the communicators go before MPI_Finalize.
        unsafe {
            ManuallyDrop::drop(&mut self.side);
            ManuallyDrop::drop(&mut self.world);
            ManuallyDrop::drop(&mut self.universe);
        }
    }
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
    /// Counts call `op`; fails at once when an earlier collective timed out.
    fn begin(&mut self, op: Op) -> Result<Stuck> {
        if let Some(why) = &self.stuck {
            return Err(CommError::Aborted(why.clone()));
        }
        self.calls += 1;
        Ok(Stuck { seq: self.calls, op: Some(op) })
    }

    /// The error of `call`, which did not finish within the timeout. MPI may still read or
    /// write `buffers` whenever the missing ranks arrive, so they are leaked, never freed.
    fn timed_out<B>(&mut self, call: Stuck, buffers: B) -> CommError {
        std::mem::forget(buffers);
        let grace = wait::grace(self.timeout);
        let reports = wait::exchange_stuck(&self.side, self.rank, call, grace);
        let (ranks, hint) = wait::describe(self.rank, call, &reports, self.timeout, grace);
        let op = call.op.map_or("collective", Op::name);
        self.stuck = Some(format!(
            "mpi: {op} (call #{}) timed out after {:?} and is still pending in MPI, which cannot cancel it",
            call.seq, self.timeout
        ));
        CommError::Timeout { op: op.to_string(), me: self.rank, ranks, timeout: self.timeout, hint }
    }

    /// The staging buffer, at least `n` bytes long, taken out of the engine (put back after
    /// a call that completes, leaked after one that times out).
    fn staging_of(&mut self, n: usize) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.staging);
        if buf.len() < n {
            buf.resize(n, 0);
        }
        buf
    }

    fn all_reduce_acc(&mut self, kind: Op, send: Acc, op: ReduceOp) -> Result<Acc> {
        let call = self.begin(kind)?;
        Ok(match send {
            Acc::F32(v) => Acc::F32(self.all_reduce_vec(call, v, op)?),
            Acc::F64(v) => Acc::F64(self.all_reduce_vec(call, v, op)?),
        })
    }

    fn all_reduce_vec<T: Equivalence + Default + Clone>(
        &mut self,
        call: Stuck,
        send: Vec<T>,
        op: ReduceOp,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); send.len()];
        let done = mpi::request::scope(|s| {
            wait::poll(
                self.world.immediate_all_reduce_into(s, &send[..], &mut out[..], system_op(op)),
                self.timeout,
            )
        });
        if done {
            Ok(out)
        } else {
            Err(self.timed_out(call, (send, out)))
        }
    }

    /// `Some(result)` on the root, `None` elsewhere.
    fn reduce_vec<T: Equivalence + Default + Clone>(
        &mut self,
        call: Stuck,
        send: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Option<Vec<T>>> {
        let root_proc = self.world.process_at_rank(root as i32);
        if self.rank == root {
            let mut out = vec![T::default(); send.len()];
            let done = mpi::request::scope(|s| {
                wait::poll(
                    root_proc.immediate_reduce_into_root(s, &send[..], &mut out[..], system_op(op)),
                    self.timeout,
                )
            });
            if done {
                return Ok(Some(out));
            }
            Err(self.timed_out(call, (send, out)))
        } else {
            let done = mpi::request::scope(|s| {
                wait::poll(root_proc.immediate_reduce_into(s, &send[..], system_op(op)), self.timeout)
            });
            if done {
                return Ok(None);
            }
            Err(self.timed_out(call, send))
        }
    }
}

impl CpuEngine for MpiEngine {
    fn all_reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let acc = self.all_reduce_acc(Op::AllReduce, widen(data), op)?;
        narrow_into(&acc, data, op, self.size);
        Ok(())
    }

    fn reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let call = self.begin(Op::Reduce)?;
        let reduced = match widen(data) {
            Acc::F32(v) => self.reduce_vec(call, v, op, root)?.map(Acc::F32),
            Acc::F64(v) => self.reduce_vec(call, v, op, root)?.map(Acc::F64),
        };
        if let Some(acc) = reduced {
            narrow_into(&acc, data, op, self.size);
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
        let acc = self.all_reduce_acc(Op::ReduceScatter, widen(input), op)?;
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
                return Err(CommError::MpiTooLarge { op: "all_gather", bytes: output.len() });
            }
            counts.push(c as i32);
            displs.push(d as i32);
        }
        let call = self.begin(Op::AllGather)?;
        // MPI works on buffers of its own (not the tensor's) so that they can be leaked if
        // the call times out: MPI may still write them when the missing ranks arrive.
        let send = input.to_vec();
        let mut recv = self.staging_of(output.len());
        let mut part = PartitionMut::new(&mut recv[..output.len()], counts, displs);
        let done = mpi::request::scope(|s| {
            wait::poll(self.world.immediate_all_gather_varcount_into(s, &send[..], &mut part), self.timeout)
        });
        if !done {
            // The counts and displacements inside `part` must stay valid too.
            std::mem::forget(part);
            return Err(self.timed_out(call, (send, recv)));
        }
        drop(part);
        output.copy_from_slice(&recv[..output.len()]);
        self.staging = recv;
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()> {
        let call = self.begin(Op::Broadcast)?;
        // A buffer of its own, as in all_gather.
        let n = data.len();
        let mut buf = self.staging_of(n);
        if self.rank == root {
            buf[..n].copy_from_slice(data);
        }
        let root_proc = self.world.process_at_rank(root as i32);
        let done = mpi::request::scope(|s| {
            wait::poll(root_proc.immediate_broadcast_into(s, &mut buf[..n]), self.timeout)
        });
        if !done {
            return Err(self.timed_out(call, buf));
        }
        if self.rank != root {
            data.copy_from_slice(&buf[..n]);
        }
        self.staging = buf;
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let call = self.begin(Op::Barrier)?;
        if wait::poll(self.world.immediate_barrier(), self.timeout) {
            Ok(())
        } else {
            Err(self.timed_out(call, ()))
        }
    }

    // MPI has no way to tell peers this rank gives up short of MPI_Abort (which would end
    // the whole job from inside a library); they fail at their own timeout.
    fn abort(&mut self) {}

    fn leave(&mut self) {}
}
