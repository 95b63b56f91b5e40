//! The `nccl` backend: NCCL loaded at run time (found in pip's `nvidia/nccl`, CUDA_HOME or
//! the system like the other CUDA libraries), one process per GPU.
//!
//! The library is opened here with libloading rather than through cudarc's NCCL module,
//! whose loader looks for `libnccl.so` / `libnccl.so.<CUDA major>` and so misses pip's
//! `libnccl.so.2`; the dozen functions used are declared in `ffi` below (NCCL 2.x ABI).
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
use ffi::{Comm, DataType, Nccl, RedOp, UniqueId};
use oxtrain_tensor::cuda::libs::{self, CudaLib, LibStatus};
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::{DType, Device, Tensor};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// NCCL's C API, as much as oxtrain uses (types and values from nccl.h, stable across 2.x).
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    pub type Comm = *mut c_void;
    pub type Stream = *mut c_void;
    pub type Status = c_int;

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct UniqueId {
        pub internal: [u8; 128],
    }

    /// `ncclDataType_t`.
    #[derive(Clone, Copy, Debug)]
    #[repr(C)]
    pub enum DataType {
        Uint8 = 1,
        Float16 = 6,
        Float32 = 7,
        Float64 = 8,
        Bfloat16 = 9,
    }

    /// `ncclRedOp_t`.
    #[derive(Clone, Copy, Debug)]
    #[repr(C)]
    pub enum RedOp {
        Sum = 0,
        Max = 2,
        Min = 3,
        Avg = 4,
    }

    pub struct Nccl {
        pub get_version: unsafe extern "C" fn(*mut c_int) -> Status,
        pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
        pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
        pub comm_destroy: unsafe extern "C" fn(Comm) -> Status,
        pub comm_finalize: unsafe extern "C" fn(Comm) -> Status,
        pub get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
        pub all_reduce:
            unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, RedOp, Comm, Stream) -> Status,
        pub reduce: unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            DataType,
            RedOp,
            c_int,
            Comm,
            Stream,
        ) -> Status,
        pub broadcast:
            unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, c_int, Comm, Stream) -> Status,
        pub reduce_scatter:
            unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, RedOp, Comm, Stream) -> Status,
        pub all_gather:
            unsafe extern "C" fn(*const c_void, *mut c_void, usize, DataType, Comm, Stream) -> Status,
        pub group_start: unsafe extern "C" fn() -> Status,
        pub group_end: unsafe extern "C" fn() -> Status,
        pub _lib: libloading::Library,
    }
}

/// An NCCL call that failed: its name and NCCL's message.
struct NcclError(String);

fn nccl_err(what: &str, e: NcclError) -> CommError {
    CommError::Library { library: "nccl", what: what.to_string(), message: e.0 }
}

/// The loaded library (once per process).
fn api() -> Result<&'static Nccl> {
    static API: std::sync::OnceLock<std::result::Result<Nccl, String>> = std::sync::OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| CommError::Unsupported(format!("nccl: {e}")))
}

fn load() -> std::result::Result<Nccl, String> {
    let path = match libs::preload(CudaLib::Nccl) {
        LibStatus::Loaded(p) => p.clone(),
        _ => "libnccl.so.2".into(),
    };
    // SAFETY: loading runs the library's initialisers only.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        format!(
            "libnccl.so.2 cannot be loaded ({e}); `pip install nvidia-nccl-cu13` or set OXTRAIN_CUDA_LIB_DIRS: {}",
            libs::describe_search(CudaLib::Nccl)
        )
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the signature is nccl.h's.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{} has no {}: {e}", path.display(), $name))?
        };
    }
    Ok(Nccl {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_finalize: sym!("ncclCommFinalize"),
        get_error_string: sym!("ncclGetErrorString"),
        all_reduce: sym!("ncclAllReduce"),
        reduce: sym!("ncclReduce"),
        broadcast: sym!("ncclBroadcast"),
        reduce_scatter: sym!("ncclReduceScatter"),
        all_gather: sym!("ncclAllGather"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        _lib: lib,
    })
}

/// Turns a status into a Result with NCCL's message.
fn check(api: &Nccl, call: &str, st: ffi::Status) -> std::result::Result<(), NcclError> {
    if st == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for any status.
    let msg = unsafe {
        let p = (api.get_error_string)(st);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(NcclError(format!("{call} returned {st} ({msg}); NCCL_DEBUG=WARN says more")))
}

struct RawComm(Comm);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are
// serialised, which the mutex around it does.
unsafe impl Send for RawComm {}

/// A process group over NCCL: CUDA tensors on `cuda:{ordinal}`, one process per GPU.
pub struct NcclCommunicator {
    api: &'static Nccl,
    comm: Mutex<RawComm>,
    rank: usize,
    world: usize,
    stream: CommStream,
    /// One element to all-reduce for `barrier` (NCCL has no barrier; torch does the same).
    barrier_buf: Tensor,
}

/// NCCL's version as (major, minor, patch), loading the library first.
pub fn version() -> Result<(i32, i32, i32)> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: an out-parameter.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) }).map_err(|e| nccl_err("version", e))?;
    Ok((v / 10000, (v % 10000) / 100, v % 100))
}

/// Process-local count of communicators made, so that several share one store.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

fn nccl_dtype(op: &str, d: DType) -> Result<DataType> {
    Ok(match d {
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        other => {
            return Err(CommError::Unsupported(format!(
                "{op}: reductions take f32, f64, f16 and bf16, not {other}"
            )))
        }
    })
}

fn nccl_op(op: ReduceOp) -> RedOp {
    match op {
        ReduceOp::Sum => RedOp::Sum,
        ReduceOp::Avg => RedOp::Avg,
        ReduceOp::Max => RedOp::Max,
        ReduceOp::Min => RedOp::Min,
    }
}

impl NcclCommunicator {
    /// Joins the NCCL communicator of `world` ranks; every rank calls it with the same store.
    /// `ordinal` is this process's GPU (usually its local rank).
    pub fn connect(rank: usize, world: usize, ordinal: usize, store: &TcpStore) -> Result<NcclCommunicator> {
        let api = api()?;
        let device = oxtrain_tensor::cuda::device(ordinal)
            .map_err(|e| cuda_err(format!("opening cuda:{ordinal}"), e))?;
        let generation = GENERATION.fetch_add(1, Ordering::SeqCst);
        let key = format!("oxtrain/nccl/{generation}/unique_id");
        let mut id = UniqueId { internal: [0; 128] };
        if rank == 0 {
            // SAFETY: an out-parameter of 128 bytes.
            check(api, "ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })
                .map_err(|e| nccl_err("unique id", e))?;
            store.set(&key, &id.internal)?;
        } else {
            let bytes = store.get(&key)?;
            if bytes.len() != 128 {
                return Err(CommError::BadUniqueId { backend: "nccl", bytes: bytes.len(), expected: 128 });
            }
            id.internal.copy_from_slice(&bytes);
        }
        device
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the CUDA context", format!("{e:?}")))?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` is an out-parameter; the context of `ordinal` is current.
        check(api, "ncclCommInitRank", unsafe {
            (api.comm_init_rank)(&mut comm, world as i32, id, rank as i32)
        })
        .map_err(|e| {
            nccl_err(
                &format!("joining as rank {rank} of {world} on cuda:{ordinal} (are all ranks started?)"),
                e,
            )
        })?;
        let stream = CommStream::new(ordinal)?;
        let barrier_buf = Tensor::from_vec(vec![0f32], 1, Device::Cuda(ordinal))
            .map_err(|e| cuda_err("allocating the barrier buffer", e))?;
        Ok(NcclCommunicator { api, comm: Mutex::new(RawComm(comm)), rank, world, stream, barrier_buf })
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

    /// Runs `f(api, comm, stream)` between `begin` and `finish` with the context bound.
    fn run(
        &self,
        what: &str,
        blocking: bool,
        f: impl FnOnce(&Nccl, Comm, ffi::Stream) -> std::result::Result<(), NcclError>,
    ) -> Result<Work> {
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        self.stream.bind()?;
        let caller = self.stream.begin()?;
        let s = self.stream.stream.raw().cu_stream() as ffi::Stream;
        f(self.api, comm.0, s).map_err(|e| nccl_err(what, e))?;
        self.stream.finish(caller, blocking)
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(|e| e.into_inner());
        // Queued work must finish before the communicator goes, with this GPU's context
        // current (the dropping thread may not have used it).
        if let Ok(device) = oxtrain_tensor::cuda::device(self.stream.ordinal) {
            let _ = device.context().bind_to_thread();
        }
        let _ = self.stream.stream.synchronize();
        // SAFETY: made in `connect`, finalised and destroyed once. Finalize first flushes
        // NCCL's outstanding operations (torch's destroy_process_group does the same).
        unsafe {
            let _ = (self.api.comm_finalize)(comm.0);
            let _ = (self.api.comm_destroy)(comm.0);
        }
    }
}

fn ptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

/// A grouped sequence of calls (`ncclGroupStart` .. `ncclGroupEnd`), ending the group even
/// when a call fails.
fn grouped(
    api: &Nccl,
    calls: impl FnOnce() -> std::result::Result<(), NcclError>,
) -> std::result::Result<(), NcclError> {
    // SAFETY: group calls take no arguments.
    check(api, "ncclGroupStart", unsafe { (api.group_start)() })?;
    let r = calls();
    let end = check(api, "ncclGroupEnd", unsafe { (api.group_end)() });
    r.and(end)
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
        self.run("ncclAllReduce", false, |api, c, s| {
            // SAFETY: in place on a live, contiguous device buffer of v.len elements.
            check(api, "ncclAllReduce", unsafe {
                (api.all_reduce)(ptr(v.ptr), ptr(v.ptr), v.len, dt, nccl_op(op), c, s)
            })
        })
    }

    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> Result<Work> {
        check_root("reduce", dst, self.world);
        let v = self.view("reduce", tensor)?;
        let dt = nccl_dtype("reduce", v.dtype)?;
        self.run("ncclReduce", false, |api, c, s| {
            // SAFETY: as all_reduce.
            check(api, "ncclReduce", unsafe {
                (api.reduce)(ptr(v.ptr), ptr(v.ptr), v.len, dt, nccl_op(op), dst as i32, c, s)
            })
        })
    }

    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        check_shards("reduce_scatter", input, output, self.world, self.rank);
        let i = self.view("reduce_scatter", input)?;
        let o = self.view("reduce_scatter", output)?;
        let dt = nccl_dtype("reduce_scatter", i.dtype)?;
        let (n, esz) = (self.world, i.dtype.size_in_bytes());
        if i.len % n == 0 {
            return self.run("ncclReduceScatter", false, |api, c, s| {
                // SAFETY: input holds n * o.len elements, output o.len.
                check(api, "ncclReduceScatter", unsafe {
                    (api.reduce_scatter)(ptr(i.ptr), ptr(o.ptr), o.len, dt, nccl_op(op), c, s)
                })
            });
        }
        self.run("grouped ncclReduce (reduce_scatter)", false, |api, c, s| {
            grouped(api, || {
                for r in 0..n {
                    let sh = shard_range(i.len, n, r);
                    if sh.is_empty() {
                        continue;
                    }
                    let send = ptr(i.ptr + (sh.start * esz) as u64);
                    // SAFETY: the shard lies inside the input; only rank r, whose output has
                    // exactly sh.len() elements, receives.
                    check(api, "ncclReduce", unsafe {
                        (api.reduce)(send, ptr(o.ptr), sh.len(), dt, nccl_op(op), r as i32, c, s)
                    })?;
                }
                Ok(())
            })
        })
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        check_shards("all_gather", output, input, self.world, self.rank);
        let i = self.view("all_gather", input)?;
        let o = self.view("all_gather", output)?;
        let n = self.world;
        let esz = i.dtype.size_in_bytes();
        // Data movement: bytes, so every dtype goes through.
        let u8t = DataType::Uint8;
        if o.len % n == 0 {
            return self.run("ncclAllGather", false, |api, c, s| {
                // SAFETY: output holds n * i.len elements.
                check(api, "ncclAllGather", unsafe {
                    (api.all_gather)(ptr(i.ptr), ptr(o.ptr), i.bytes(), u8t, c, s)
                })
            });
        }
        self.run("grouped ncclBroadcast (all_gather)", false, |api, c, s| {
            grouped(api, || {
                for r in 0..n {
                    let sh = shard_range(o.len, n, r);
                    if sh.is_empty() {
                        continue;
                    }
                    let recv = ptr(o.ptr + (sh.start * esz) as u64);
                    // SAFETY: rank r sends its input (sh.len() elements) into every rank's
                    // output at the shard's place, its own included.
                    check(api, "ncclBroadcast", unsafe {
                        (api.broadcast)(ptr(i.ptr), recv, sh.len() * esz, u8t, r as i32, c, s)
                    })?;
                }
                Ok(())
            })
        })
    }

    fn broadcast(&self, tensor: &Tensor, src: usize) -> Result<Work> {
        check_root("broadcast", src, self.world);
        let v = self.view("broadcast", tensor)?;
        self.run("ncclBroadcast", false, |api, c, s| {
            // SAFETY: in place on a live device buffer of v.bytes() bytes.
            check(api, "ncclBroadcast", unsafe {
                (api.broadcast)(ptr(v.ptr), ptr(v.ptr), v.bytes(), DataType::Uint8, src as i32, c, s)
            })
        })
    }

    fn barrier(&self) -> Result<Work> {
        let v = self.view("barrier", &self.barrier_buf)?;
        self.run("ncclAllReduce (barrier)", true, |api, c, s| {
            // SAFETY: one f32 on the device, owned by self.
            check(api, "ncclAllReduce", unsafe {
                (api.all_reduce)(ptr(v.ptr), ptr(v.ptr), 1, DataType::Float32, RedOp::Sum, c, s)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads NCCL through our own bindings (no GPU needed for these two calls; pip's
    /// nvidia-nccl-cu13 is enough). Ignored unless asked for, as CI installs no NCCL.
    #[test]
    #[ignore = "needs NCCL (pip's nvidia-nccl-cu13 works without a GPU)"]
    fn nccl_loads_and_reports_its_version_and_a_unique_id() {
        let api = api().unwrap_or_else(|e| panic!("{e}"));
        let (major, minor, _) = version().unwrap();
        assert_eq!(major, 2, "NCCL {major}.{minor}");
        let mut id = UniqueId { internal: [0; 128] };
        check(api, "ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })
            .unwrap_or_else(|e| panic!("{}", e.0));
        assert!(id.internal.iter().any(|&b| b != 0), "an all-zero unique id");
        let msg = check(api, "test", 4).expect_err("status 4 is an error").0;
        assert!(msg.contains("test returned 4"), "{msg}");
    }
}
