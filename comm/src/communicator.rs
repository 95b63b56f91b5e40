//! The `Communicator` trait and its CPU implementation over any [`CpuEngine`].

use crate::check;
use crate::element::ReduceElement;
use crate::engine::CpuEngine;
use crate::error::{CommError, Result};
use crate::op::{shard_range, ReduceOp};
use crate::options::CommOptions;
use crate::request::Request;
use crate::work::Work;
use oxtrain_tensor::{CpuStorage, DType, Device, Shape, Storage, Tensor};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

/// Collectives over a group of ranks, on tensors, in place like `torch.distributed`.
///
/// Every rank must call the same collectives in the same order with matching sizes and
/// dtypes. Calls return a [`Work`] at once; `work.wait()` gives the result. Reductions take
/// f32, f64, f16 and bf16 (half types accumulate in f32); data movement takes any dtype.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// "local", "shm", "mpi", "nccl", "nvshmem".
    fn backend(&self) -> &str;
    /// Every rank's `tensor` becomes the reduction over all ranks.
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work>;
    /// Rank `dst`'s `tensor` becomes the reduction; the others keep theirs.
    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> Result<Work>;
    /// `output` becomes this rank's [`shard_range`] of the reduction of `input` (torch's
    /// `reduce_scatter_tensor` when the world size divides `input`'s length).
    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work>;
    /// `output` becomes the concatenation of every rank's `input`, where rank r's `input` is
    /// its [`shard_range`] of `output` (torch's `all_gather_into_tensor` when divisible).
    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work>;
    /// Every rank's `tensor` becomes rank `src`'s.
    fn broadcast(&self, tensor: &Tensor, src: usize) -> Result<Work>;
    fn barrier(&self) -> Result<Work>;

    /// A zeroed tensor for a buffer this communicator reduces again and again, such as a
    /// gradient bucket (PyTorch's `symm_mem.empty`): on the nvshmem backend it lives on the
    /// symmetric heap, where `all_reduce` needs no staging copy, and allocating it is
    /// collective (every rank, same shape and dtype, same order; `device` must be the
    /// communicator's GPU). Other backends give an ordinary tensor on `device`.
    fn symmetric_tensor(&self, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::zeros(shape, dtype, device).map_err(|e| {
            CommError::tensor(format!("allocating a {dtype} buffer for {} collectives", self.backend()), e)
        })
    }
}

type Job = (Request, Sender<Result<()>>);

/// A [`Communicator`] whose collectives run on a worker thread, in call order, on CPU
/// tensors. The `local`, `shm` and `mpi` backends are this type around their engine.
pub struct CpuCommunicator {
    rank: usize,
    world: usize,
    backend: &'static str,
    tx: Mutex<Option<Sender<Job>>>,
    worker: Option<JoinHandle<()>>,
    timeout: Duration,
}

impl CpuCommunicator {
    /// Starts the worker; `make` builds the engine on it (MPI wants its calls from the
    /// thread that set it up).
    pub(crate) fn spawn<E: CpuEngine, F>(
        rank: usize,
        world: usize,
        backend: &'static str,
        opts: &CommOptions,
        make: F,
    ) -> Result<CpuCommunicator>
    where
        F: FnOnce() -> Result<E> + Send + 'static,
    {
        CpuCommunicator::spawn_with_ids(backend, opts, make, move || Ok((rank, world)))
    }

    /// As `spawn`, for backends that learn their rank and world size only once the engine
    /// exists (`ids` is called after the engine is made).
    pub(crate) fn spawn_with_ids<E: CpuEngine, F>(
        backend: &'static str,
        opts: &CommOptions,
        make: F,
        ids: impl FnOnce() -> Result<(usize, usize)>,
    ) -> Result<CpuCommunicator>
    where
        F: FnOnce() -> Result<E> + Send + 'static,
    {
        let (ids_tx, ids_rx) = channel::<(usize, usize)>();
        let (tx, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        let check = opts.check;
        let worker = std::thread::Builder::new()
            .name(format!("oxtrain-comm-{backend}"))
            .spawn(move || {
                let mut engine = match make() {
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let Ok((rank, world)) = ids_rx.recv() else { return };
                let mut broken: Option<String> = None;
                for (req, reply) in rx {
                    let result = match &broken {
                        Some(why) => Err(CommError::Aborted(why.clone())),
                        None => {
                            let r = run(&mut engine, &req, rank, world, check);
                            if let Err(e) = &r {
                                engine.abort();
                                broken = Some(e.to_string());
                            }
                            r
                        }
                    };
                    let _ = reply.send(result);
                }
                if broken.is_none() {
                    engine.leave();
                }
            })
            .map_err(|e| CommError::io("spawning the communicator's worker thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(CommError::Aborted("the communicator's worker thread died while starting".into()))
            }
        }
        let (rank, world) = ids()?;
        let _ = ids_tx.send((rank, world));
        let timeout = opts.timeout;
        Ok(CpuCommunicator { rank, world, backend, tx: Mutex::new(Some(tx)), worker: Some(worker), timeout })
    }

    fn submit(&self, req: Request) -> Result<Work> {
        let name = req.name();
        let (reply_tx, reply_rx) = channel();
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else { return Err(CommError::Aborted("communicator shut down".into())) };
        tx.send((req, reply_tx))
            .map_err(|_| CommError::Aborted(format!("{name}: the worker thread is gone")))?;
        // The engine's own waits time out first; this bound only catches a wedged worker,
        // with room for calls queued ahead of this one.
        Ok(Work::pending(reply_rx, name, self.timeout * 4 + Duration::from_secs(5)))
    }

    fn require_cpu(&self, op: &str, t: &Tensor) -> Result<()> {
        match t.device() {
            Device::Cpu => Ok(()),
            d => Err(CommError::Unsupported(format!(
                "{op}: the {} backend takes CPU tensors, got one on {d:?}; use the nccl or nvshmem backend for GPU tensors",
                self.backend
            ))),
        }
    }

    fn check_root(&self, op: &str, root: usize) {
        assert!(root < self.world, "{op}: root rank {root} is out of range for world size {}", self.world);
    }
}

impl Drop for CpuCommunicator {
    fn drop(&mut self) {
        // Closing the channel ends the worker after the queued calls.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Communicator for CpuCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &str {
        self.backend
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work> {
        self.require_cpu("all_reduce", tensor)?;
        with_reduce_element!(tensor.dtype(), "all_reduce", T => { let _ = std::marker::PhantomData::<T>; });
        self.submit(Request::AllReduce { tensor: tensor.clone(), op })
    }

    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> Result<Work> {
        self.require_cpu("reduce", tensor)?;
        self.check_root("reduce", dst);
        with_reduce_element!(tensor.dtype(), "reduce", T => { let _ = std::marker::PhantomData::<T>; });
        self.submit(Request::Reduce { tensor: tensor.clone(), op, root: dst })
    }

    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        self.require_cpu("reduce_scatter", output)?;
        self.require_cpu("reduce_scatter", input)?;
        with_reduce_element!(input.dtype(), "reduce_scatter", T => { let _ = std::marker::PhantomData::<T>; });
        assert_eq!(
            output.dtype(),
            input.dtype(),
            "reduce_scatter: output dtype {} differs from input dtype {}",
            output.dtype(),
            input.dtype()
        );
        let want = shard_range(input.elem_count(), self.world, self.rank).len();
        assert_eq!(
            output.elem_count(),
            want,
            "reduce_scatter: rank {}'s output has shape {:?} ({} elements) but its shard of the input of shape {:?} has {want}",
            self.rank,
            output.dims(),
            output.elem_count(),
            input.dims()
        );
        self.submit(Request::ReduceScatter { output: output.clone(), input: input.clone(), op })
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        self.require_cpu("all_gather", output)?;
        self.require_cpu("all_gather", input)?;
        assert_eq!(
            output.dtype(),
            input.dtype(),
            "all_gather: output dtype {} differs from input dtype {}",
            output.dtype(),
            input.dtype()
        );
        let want = shard_range(output.elem_count(), self.world, self.rank).len();
        assert_eq!(
            input.elem_count(),
            want,
            "all_gather: rank {}'s input has shape {:?} ({} elements) but its shard of the output of shape {:?} has {want}",
            self.rank,
            input.dims(),
            input.elem_count(),
            output.dims()
        );
        self.submit(Request::AllGather { output: output.clone(), input: input.clone() })
    }

    fn broadcast(&self, tensor: &Tensor, src: usize) -> Result<Work> {
        self.require_cpu("broadcast", tensor)?;
        self.check_root("broadcast", src);
        self.submit(Request::Broadcast { tensor: tensor.clone(), root: src })
    }

    fn barrier(&self) -> Result<Work> {
        self.submit(Request::Barrier)
    }
}

/// Runs `f` on the tensor's elements as one contiguous range of its CPU storage, going
/// through a contiguous copy (and writing it back) for strided views.
fn with_elements(
    t: &Tensor,
    write_back: bool,
    f: impl FnOnce(&mut CpuStorage, std::ops::Range<usize>) -> Result<()>,
) -> Result<()> {
    if t.is_contiguous() {
        let start = t.layout().offset();
        let mut guard = t.storage_mut();
        match &mut *guard {
            Storage::Cpu(s) => f(s, start..start + t.elem_count()),
            Storage::Cuda(_) => unreachable!("checked for a CPU tensor when the call was made"),
        }
    } else {
        let tmp = t.contiguous();
        with_elements(&tmp, false, f)?;
        if write_back {
            t.copy_(&tmp);
        }
        Ok(())
    }
}

fn bytes_mut(s: &mut CpuStorage, r: std::ops::Range<usize>) -> (&mut [u8], usize) {
    match s {
        CpuStorage::F32(v) => (bytemuck::cast_slice_mut(&mut v[r]), 4),
        CpuStorage::F64(v) => (bytemuck::cast_slice_mut(&mut v[r]), 8),
        CpuStorage::F16(v) => (bytemuck::cast_slice_mut(&mut v[r]), 2),
        CpuStorage::BF16(v) => (bytemuck::cast_slice_mut(&mut v[r]), 2),
        CpuStorage::I64(v) => (bytemuck::cast_slice_mut(&mut v[r]), 8),
        CpuStorage::U32(v) => (bytemuck::cast_slice_mut(&mut v[r]), 4),
        CpuStorage::U8(v) => (&mut v[r], 1),
        // SAFETY: bool is one byte; peers only ever write bytes that were bools (0 or 1).
        CpuStorage::Bool(v) => {
            let v = &mut v[r];
            (unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len()) }, 1)
        }
    }
}

fn typed_mut<T: ReduceElement + oxtrain_tensor::Element>(
    s: &mut CpuStorage,
    r: std::ops::Range<usize>,
) -> &mut [T] {
    &mut s.as_mut_slice::<T>()[r]
}

/// A tensor whose storage is not shared with `other` (a copy if it is), so both can be
/// locked at once.
fn unaliased(t: &Tensor, other: &Tensor) -> Tensor {
    if t.same_storage(other) {
        t.copy()
    } else {
        t.clone()
    }
}

fn run<E: CpuEngine>(e: &mut E, req: &Request, rank: usize, world: usize, check: bool) -> Result<()> {
    if check {
        check::compare(e, req, rank, world)?;
    }
    match req {
        Request::AllReduce { tensor, op } => with_elements(
            tensor,
            true,
            |s, r| with_reduce_element!(s.dtype(), "all_reduce", T => e.all_reduce(typed_mut::<T>(s, r), *op)),
        ),
        Request::Reduce { tensor, op, root } => with_elements(
            tensor,
            rank == *root,
            |s, r| with_reduce_element!(s.dtype(), "reduce", T => e.reduce(typed_mut::<T>(s, r), *op, *root)),
        ),
        Request::ReduceScatter { output, input, op } => {
            let input = unaliased(input, output);
            let src = input.contiguous();
            let start = src.layout().offset();
            let guard = src.storage();
            let Storage::Cpu(si) = &*guard else { unreachable!("checked for a CPU tensor") };
            with_elements(output, true, |so, ro| {
                with_reduce_element!(si.dtype(), "reduce_scatter", T => {
                    let inp = &si.as_slice::<T>()[start..start + src.elem_count()];
                    e.reduce_scatter(inp, typed_mut::<T>(so, ro), *op)
                })
            })
        }
        Request::AllGather { output, input } => {
            let input = unaliased(input, output).contiguous();
            let start = input.layout().offset();
            let guard = input.storage();
            let Storage::Cpu(si) = &*guard else { unreachable!("checked for a CPU tensor") };
            let esz = si.dtype().size_in_bytes();
            let inp = &si.as_bytes()[start * esz..(start + input.elem_count()) * esz];
            with_elements(output, true, |so, ro| {
                let (out, esz) = bytes_mut(so, ro);
                e.all_gather(inp, out, esz)
            })
        }
        Request::Broadcast { tensor, root } => {
            with_elements(tensor, rank != *root, |s, r| e.broadcast(bytes_mut(s, r).0, *root))
        }
        Request::Barrier => e.barrier(),
    }
}
