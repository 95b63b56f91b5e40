//! The `nccl` backend: NCCL through cudarc (loaded at run time, found in pip's `nvidia/nccl`
//! like the other CUDA libraries), one process per GPU.
//!
//! Rank 0 makes NCCL's unique id and publishes it in the bootstrap [`TcpStore`]; every rank
//! reads it and joins with `ncclCommInitRank`. Collectives run on the communicator's own
//! stream, ordered after the caller's current stream (see `crate::gpu`).
//!
//! Lengths that the world size does not divide (rank r owns [`shard_range`]): `reduce_scatter`
//! becomes one grouped `ncclReduce` per rank (rank r is the root of its shard) and `all_gather`
//! one grouped `ncclBroadcast` per rank, inside `ncclGroupStart/End`, so there is no padding
//! and no staging copy. Divisible lengths use `ncclReduceScatter` / `ncclAllGather`.

use crate::bootstrap::TcpStore;
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::gpu::{check_root, check_shards, cuda_err, cuda_view, CommStream, CudaView};
use crate::op::{shard_range, ReduceOp};
use crate::work::Work;
use cudarc::nccl::{result as nccl, sys};
use oxtrain_tensor::cuda::libs::{self, CudaLib};
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::{DType, Device, Tensor};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> CommError {
    CommError::Io { what: format!("nccl: {what}"), message: format!("{e:?}") }
}

struct RawComm(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are
// serialised, which the mutex around it does.
unsafe impl Send for RawComm {}

/// A process group over NCCL: CUDA tensors on `cuda:{ordinal}`, one process per GPU.
pub struct NcclCommunicator {
    comm: Mutex<RawComm>,
    rank: usize,
    world: usize,
    stream: CommStream,
    /// One element to all-reduce for `barrier` (NCCL has no barrier; torch does the same).
    barrier_buf: Tensor,
}

/// NCCL's version as (major, minor, patch), loading the library first.
pub fn version() -> Result<(i32, i32, i32)> {
    load()?;
    let v = nccl::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))?;
    Ok((v / 10000, (v % 10000) / 100, v % 100))
}

fn load() -> Result<()> {
    if libs::loadable(CudaLib::Nccl) {
        Ok(())
    } else {
        Err(CommError::Unsupported(format!(
            "nccl: libnccl.so.2 cannot be loaded (`pip install nvidia-nccl-cu13`): {}",
            libs::describe_search(CudaLib::Nccl)
        )))
    }
}

/// Process-local count of communicators made, so that several share one store.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

fn nccl_dtype(op: &str, d: DType) -> Result<sys::ncclDataType_t> {
    use sys::ncclDataType_t::*;
    Ok(match d {
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        other => {
            return Err(CommError::Unsupported(format!(
                "{op}: reductions take f32, f64, f16 and bf16, not {other}"
            )))
        }
    })
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

impl NcclCommunicator {
    /// Joins the NCCL communicator of `world` ranks; every rank calls it with the same store.
    /// `ordinal` is this process's GPU (usually its local rank).
    pub fn connect(rank: usize, world: usize, ordinal: usize, store: &TcpStore) -> Result<NcclCommunicator> {
        load()?;
        let device = oxtrain_tensor::cuda::device(ordinal)
            .map_err(|e| cuda_err(format!("opening cuda:{ordinal}"), e))?;
        let generation = GENERATION.fetch_add(1, Ordering::SeqCst);
        let key = format!("oxtrain/nccl/{generation}/unique_id");
        let id = if rank == 0 {
            let id = nccl::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(&key, &bytes)?;
            id
        } else {
            let bytes = store.get(&key)?;
            if bytes.len() != 128 {
                return Err(CommError::Bootstrap(format!(
                    "nccl: the unique id in the store has {} bytes, not 128",
                    bytes.len()
                )));
            }
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as _;
            }
            id
        };
        device.context().bind_to_thread().map_err(|e| nccl_err("binding the CUDA context", e))?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is an out-parameter; the context of `ordinal` is current.
        unsafe { nccl::comm_init_rank(&mut comm, world as i32, id, rank as i32) }.map_err(|e| {
            nccl_err(
                &format!(
                    "ncclCommInitRank (rank {rank} of {world} on cuda:{ordinal}; are all ranks started?)"
                ),
                e,
            )
        })?;
        let stream = CommStream::new(ordinal)?;
        let barrier_buf = Tensor::from_vec(vec![0f32], 1, Device::Cuda(ordinal))
            .map_err(|e| cuda_err("allocating the barrier buffer", e))?;
        Ok(NcclCommunicator { comm: Mutex::new(RawComm(comm)), rank, world, stream, barrier_buf })
    }

    /// The stream collectives run on. Make it current (`comm_stream().make_current()`) to
    /// queue compute there too and skip the cross-stream events.
    pub fn comm_stream(&self) -> &Stream {
        &self.stream.stream
    }

    pub fn ordinal(&self) -> usize {
        self.stream.ordinal
    }

    fn view(&self, op: &str, t: &Tensor) -> Result<CudaView> {
        cuda_view(op, t, self.stream.ordinal, &self.stream.stream)
    }

    /// Runs `f(comm, stream)` between `begin` and `finish` with the context bound.
    fn run(
        &self,
        what: &str,
        blocking: bool,
        f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> std::result::Result<(), nccl::NcclError>,
    ) -> Result<Work> {
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let device =
            oxtrain_tensor::cuda::device(self.stream.ordinal).map_err(|e| cuda_err("the device", e))?;
        device.context().bind_to_thread().map_err(|e| nccl_err("binding the CUDA context", e))?;
        self.stream.begin()?;
        let s = self.stream.stream.raw().cu_stream() as sys::cudaStream_t;
        f(comm.0, s).map_err(|e| nccl_err(what, e))?;
        self.stream.finish(blocking)
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(|e| e.into_inner());
        // Queued work must finish before the communicator goes.
        let _ = self.stream.stream.synchronize();
        // SAFETY: made in `connect`, destroyed once.
        unsafe {
            let _ = nccl::comm_destroy(comm.0);
        }
    }
}

fn ptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &str {
        "nccl"
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work> {
        let v = self.view("all_reduce", tensor)?;
        let dt = nccl_dtype("all_reduce", v.dtype)?;
        // SAFETY: in place on a live, contiguous device buffer of v.len elements.
        self.run("ncclAllReduce", false, |c, s| unsafe {
            nccl::all_reduce(ptr(v.ptr), ptr(v.ptr), v.len, dt, nccl_op(op), c, s).map(|_| ())
        })
    }

    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> Result<Work> {
        check_root("reduce", dst, self.world);
        let v = self.view("reduce", tensor)?;
        let dt = nccl_dtype("reduce", v.dtype)?;
        // SAFETY: as all_reduce.
        self.run("ncclReduce", false, |c, s| unsafe {
            nccl::reduce(ptr(v.ptr), ptr(v.ptr), v.len, dt, nccl_op(op), dst as i32, c, s).map(|_| ())
        })
    }

    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        check_shards("reduce_scatter", input, output, self.world, self.rank);
        let i = self.view("reduce_scatter", input)?;
        let o = self.view("reduce_scatter", output)?;
        let dt = nccl_dtype("reduce_scatter", i.dtype)?;
        let (n, esz) = (self.world, i.dtype.size_in_bytes());
        if i.len % n == 0 {
            // SAFETY: input holds n * o.len elements, output o.len.
            return self.run("ncclReduceScatter", false, |c, s| unsafe {
                nccl::reduce_scatter(ptr(i.ptr), ptr(o.ptr), o.len, dt, nccl_op(op), c, s).map(|_| ())
            });
        }
        self.run("grouped ncclReduce (reduce_scatter)", false, |c, s| {
            nccl::group_start()?;
            for r in 0..n {
                let sh = shard_range(i.len, n, r);
                if sh.is_empty() {
                    continue;
                }
                // SAFETY: the shard lies inside the input; only rank r (whose output has
                // exactly sh.len() elements) receives.
                unsafe {
                    nccl::reduce(
                        ptr(i.ptr + (sh.start * esz) as u64),
                        ptr(o.ptr),
                        sh.len(),
                        dt,
                        nccl_op(op),
                        r as i32,
                        c,
                        s,
                    )?;
                }
            }
            nccl::group_end().map(|_| ())
        })
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        check_shards("all_gather", output, input, self.world, self.rank);
        let i = self.view("all_gather", input)?;
        let o = self.view("all_gather", output)?;
        let n = self.world;
        let esz = i.dtype.size_in_bytes();
        // Data movement: bytes, so every dtype goes through.
        let u8t = sys::ncclDataType_t::ncclUint8;
        if o.len % n == 0 {
            // SAFETY: output holds n * i.len elements.
            return self.run("ncclAllGather", false, |c, s| unsafe {
                nccl::all_gather(ptr(i.ptr), ptr(o.ptr), i.bytes(), u8t, c, s).map(|_| ())
            });
        }
        self.run("grouped ncclBroadcast (all_gather)", false, |c, s| {
            nccl::group_start()?;
            for r in 0..n {
                let sh = shard_range(o.len, n, r);
                if sh.is_empty() {
                    continue;
                }
                // SAFETY: rank r sends its input (sh.len() elements) into every rank's output
                // at the shard's place, its own included.
                unsafe {
                    nccl::broadcast(
                        ptr(i.ptr),
                        ptr(o.ptr + (sh.start * esz) as u64),
                        sh.len() * esz,
                        u8t,
                        r as i32,
                        c,
                        s,
                    )?;
                }
            }
            nccl::group_end().map(|_| ())
        })
    }

    fn broadcast(&self, tensor: &Tensor, src: usize) -> Result<Work> {
        check_root("broadcast", src, self.world);
        let v = self.view("broadcast", tensor)?;
        let u8t = sys::ncclDataType_t::ncclUint8;
        // SAFETY: in place on a live device buffer of v.bytes() bytes.
        self.run("ncclBroadcast", false, |c, s| unsafe {
            nccl::broadcast(ptr(v.ptr), ptr(v.ptr), v.bytes(), u8t, src as i32, c, s).map(|_| ())
        })
    }

    fn barrier(&self) -> Result<Work> {
        let v = self.view("barrier", &self.barrier_buf)?;
        // SAFETY: one f32 on the device, owned by self.
        self.run("ncclAllReduce (barrier)", true, |c, s| unsafe {
            nccl::all_reduce(
                ptr(v.ptr),
                ptr(v.ptr),
                1,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                c,
                s,
            )
            .map(|_| ())
        })
    }
}
