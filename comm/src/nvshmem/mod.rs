//! The `nvshmem` backend: collectives of our own on NVSHMEM's symmetric heap, one process per
//! GPU; NVLink loads and stores inside a node, NVSHMEM puts between nodes.
//!
//! - Start-up: rank 0 makes NVSHMEM's unique id and publishes it in the bootstrap
//!   [`TcpStore`](crate::bootstrap::TcpStore); every rank initialises the host library with it
//!   (`nvshmemx_hostlib_init_attr`), builds the kernels (NVRTC + nvJitLink with
//!   `libnvshmem_device.a`, see [`device_code`]), loads them and registers the module with
//!   NVSHMEM (`nvshmemx_cumodule_init`), then allocates its staging buffers and signals on the
//!   symmetric heap and looks up the peers' addresses (`nvshmem_ptr`).
//! - Collectives (one kernel per dtype serving every op; `collectives.cu`, `ll.cu`):
//!   all-reduce is low-latency (flags in the data, `ll.cu`) up to `ll_max_bytes`, one-shot
//!   (push every input to every peer, reduce locally) up to `oneshot_max_bytes`, then two-shot
//!   (reduce-scatter then all-gather by pushes); see `options.rs`. Kernels use `max_blocks`
//!   blocks at most (default 32) so that compute keeps most SMs. Messages larger than a staging slot run in windows, a launch each; a two-shot
//!   window leaves its local copy-out to the next launch (`windows.rs`). On sm_90 launches are
//!   programmatic dependent launches, hiding the gap between back-to-back collectives.
//! - Across nodes (`ranks_per_node` < world, see `team.rs`): every op runs in stages on the
//!   node's PEs (NVLink stores) and on the rail of PEs with the same local rank (NVSHMEM
//!   put-with-signal between nodes), up to 8 nodes of 8 GPUs (`hier.rs`).
//! - Streams as the nccl backend: calls run on the communicator's stream after the caller's
//!   current stream; `Work::wait` orders the caller back (see `crate::gpu`).
//! - dtypes: reductions in f32, bf16, f16 (accumulating in f32, as the CPU backends);
//!   broadcast and all_gather move f32, bf16, f16, u32.
//!
//! Environment: the backend's variables are read by [`NvshmemOptions`] and [`NvshmemPaths`]
//! (comm's README has the table); NVSHMEM's own
//! (`NVSHMEM_SYMMETRIC_SIZE`, `NVSHMEM_REMOTE_TRANSPORT=none` without InfiniBand,
//! `NVSHMEM_DISABLE_NVLS=1`).
//!
//! [`NvshmemCommunicator::symmetric_heap`] gives a [`crate::SymmetricMemory`] on NVSHMEM's
//! heap (host-initiated, stream-ordered puts, gets and signals; atomics through a one-thread
//! device kernel; see `heap.rs`), and [`NvshmemHeap::all_reduce`]: the in-place all-reduce of
//! a heap buffer with no staging copy (two-shot pushes into the peers' copies, or one pass
//! loading them, `symmetric.cu`), the backend's fastest for large messages.
//! `Communicator::symmetric_tensor` makes tensors on the heap whose `all_reduce` takes that path
//! (`symmetric.rs`).

mod connect;
pub mod device_code;
mod fault;
mod heap;
mod hier;
mod host;
mod kernels;
pub mod nvjitlink;
mod ops;
mod options;
mod symmetric;
mod team;
#[cfg(test)]
mod tests;
mod windows;

use crate::error::{CommError, Result};
use crate::gpu::{cuda_err, cuda_view, CommStream, CudaView};
use crate::work::Work;
use cudarc::driver::{result as drv, sys as cu};
pub use heap::NvshmemHeap;
use kernels::{CollArgs, Function, Kernels};
pub use options::{Algorithm, NvshmemOptions, NvshmemPaths};
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::{DType, Tensor};
use std::ffi::c_void;
use std::sync::Mutex;
use team::{Kind, Team};

/// One step of a collective: launches of the collective kernel on a team (`Kind`), one per
/// window of the team's staging slots, padded with empty launches to at least `launches`
/// (see `windows::padded`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stage {
    pub args: CollArgs,
    pub kind: Kind,
    pub launches: usize,
}

impl Stage {
    /// A stage of as many launches as its windows.
    pub fn on(kind: Kind, args: CollArgs) -> Self {
        Stage { args, kind, launches: 0 }
    }
}

/// Driver handles of the loaded module.
struct Module {
    module: cu::CUmodule,
    f32: Kernels,
    bf16: Kernels,
    f16: Kernels,
    atomic: Function,
    /// Empty kernels for [`NvshmemCommunicator::launch_probe`].
    nop: Function,
    nop8: Function,
}
// SAFETY: module and function handles are process-wide; only used under the state mutex or
// read-only.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

struct State {
    algorithm: Algorithm,
}

/// A process group whose collectives are oxtrain's NVSHMEM kernels.
pub struct NvshmemCommunicator {
    rank: usize,
    world: usize,
    stream: CommStream,
    opts: NvshmemOptions,
    module: Module,
    /// GPUs per node; less than `world` when the PEs span nodes.
    per_node: usize,
    /// The teams by `Kind`: `All` and `Ll` on one node, `Node` and `Rail` across nodes.
    teams: [Option<Team>; 4],
    /// Three arrays of [MAX_BLOCKS][world] u64: the signals ready and done, then the
    /// symmetric all-reduce's buffer descriptors.
    signals: u64,
    /// Bytes of one signal array.
    signal_array: u64,
    /// The launch counters in device memory (`kernels::COUNTER_BYTES`, zeroed at connect):
    /// the kernels count their launches themselves, so each launch finds its epoch and
    /// staging set on the device and a CUDA graph can replay collectives (see entry.cu).
    counters: u64,
    /// Launch with programmatic dependent launch (sm_90 and newer, `OXTRAIN_NVSHMEM_PDL` not 0).
    dependent_launch: bool,
    /// Where a kernel that gave up waiting says so (device-side timeouts).
    fault: std::sync::Arc<fault::Fault>,
    state: Mutex<State>,
    /// Tensors on the symmetric heap (`symmetric_tensor`), and the teardown they may defer.
    tensors: symmetric::Registry,
    /// Partial results of reduce and reduce_scatter across nodes (`hier.rs`).
    scratch: Mutex<Scratch>,
}

/// Device memory used only on the communication stream, so one buffer serves every call in
/// turn; it grows when a call needs more.
#[derive(Default)]
struct Scratch {
    ptr: u64,
    bytes: usize,
}

fn nv_err(what: impl Into<String>) -> CommError {
    CommError::Unsupported(format!("nvshmem: {}", what.into()))
}

impl NvshmemCommunicator {
    /// The stream collectives run on (see the nccl backend's `comm_stream`).
    pub fn comm_stream(&self) -> &Stream {
        &self.stream.stream
    }

    pub fn options(&self) -> &NvshmemOptions {
        &self.opts
    }

    /// Switches the all-reduce algorithm for later calls (every rank must switch alike,
    /// between the same two calls).
    pub fn set_algorithm(&self, algorithm: Algorithm) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).algorithm = algorithm;
    }

    fn algorithm(&self) -> Algorithm {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).algorithm
    }

    fn view(&self, op: &str, t: &Tensor) -> Result<CudaView> {
        cuda_view(op, t, self.stream.ordinal, &self.stream.stream)
    }

    /// Makes this GPU's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        self.stream.bind()
    }

    fn function(&self, op: &str, dtype: DType, reduce: bool) -> Result<Kernels> {
        Ok(match dtype {
            DType::F32 => self.module.f32,
            DType::BF16 => self.module.bf16,
            DType::F16 => self.module.f16,
            // Bits move unchanged through the f32 kernel's copies.
            DType::U32 if !reduce => self.module.f32,
            other => {
                return Err(CommError::Unsupported(format!(
                "{op}: the nvshmem backend {} f32, bf16 and f16, not {other}; use the nccl backend for it",
                if reduce { "reduces" } else { "moves" }
            )))
            }
        })
    }

    /// Runs collective `op` as `stages` in turn, each on its team (`Kind`) as kernel launches
    /// over windows of that team's staging slots, all ordered after the caller's stream. Each
    /// stage's `CollArgs` carries everything but the window, buffers and team (the kernels take
    /// the epoch from their launch counters).
    fn launch(
        &self,
        op: &'static str,
        f: Kernels,
        esz: usize,
        stages: &[Stage],
        blocking: bool,
    ) -> Result<Work> {
        // A kernel that gave up earlier left the ranks out of step: nothing more is queued.
        self.fault.check(op)?;
        // Held while enqueuing: threads sharing the communicator queue whole collectives, so
        // every PE's launches keep the same order.
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.stream.bind()?;
        let caller = self.stream.begin()?;
        for stage in stages {
            self.enqueue(f, esz, stage)?;
        }
        drop(state);
        Ok(self.fault.checked(op, self.stream.finish(caller, blocking)?))
    }

    fn team(&self, kind: Kind) -> Result<&Team> {
        self.teams[kind as usize].as_ref().ok_or_else(|| {
            nv_err(format!(
                "no {kind:?} team for {} PEs with {} per node (a bug in oxtrain-comm; please report it)",
                self.world, self.per_node
            ))
        })
    }

    /// Queues the launches of one collective (the caller holds the state lock and has ordered the
    /// stream).
    fn enqueue(&self, f: Kernels, esz: usize, stage: &Stage) -> Result<()> {
        let (base, kind) = (stage.args, stage.kind);
        let team = self.team(kind)?;
        let raw = self.stream.stream.raw().cu_stream();
        let count = base.count as usize;
        let window = match base.mode {
            // A symmetric buffer needs no staging: one launch.
            kernels::SYMM => count.max(1),
            kernels::LL => team.slot_bytes / 2 / esz,
            _ => team.slot_bytes / esz,
        };
        // Two-shot windows leave their copy-out to the next launch when every window takes the
        // kernel's whole-pack path (windows.rs).
        let defer = base.mode == kernels::TWOSHOT
            && base.in_base.is_multiple_of(16)
            && base.out_base.is_multiple_of(16)
            && (window * esz).is_multiple_of(16);
        let mut prev_blocks = 0u32;
        for w in windows::padded(count, window, defer, stage.launches) {
            let (lo, hi) = (w.lo, w.hi);
            let mut a = base;
            a.win_lo = lo as i64;
            a.win_hi = hi as i64;
            a.defer_out = i32::from(w.defer_out);
            if let Some((plo, phi)) = w.prev {
                a.prev_lo = plo as i64;
                a.prev_hi = phi as i64;
                // The grid the previous window ran on: its sub-shards follow it.
                a.prev_blocks = prev_blocks as i32;
            }
            // The epoch and the staging set's parity come from the device counters.
            a.counters = self.counters;
            a.kind = kind as i32;
            if base.mode != kernels::SYMM {
                a.bufs = team.sets[0];
            }
            a.slot_bytes = team.slot_bytes as u64;
            a.ready = self.signals;
            a.done = self.signals + self.signal_array;
            a.npes = team.members.len() as i32;
            a.me = team.me as i32;
            a.pes = team.pes;
            a.sig_stride = self.world as i32;
            a.put_mask = team.put_mask;
            a.fault = self.fault.device_ptr();
            a.timeout_ns = self.fault.timeout_ns();
            if team.source != 0 {
                let (in_lo, in_hi) = (base.in_lo.max(0) as usize, base.in_hi.max(0) as usize);
                let (copy, staged) = windows::through_heap(base.in_base, in_lo, in_hi, &w, esz, team.source);
                if let Some(c) = copy {
                    // SAFETY: the source lies in the caller's tensor, the destination in the
                    // team's heap slot (window <= slot); stream order puts it after the previous
                    // launch, whose puts completed (nvshmem_quiet) before it ended.
                    unsafe { drv::memcpy_dtod_async(c.dst, c.src, c.bytes, raw as cu::CUstream) }
                        .map_err(|e| cuda_err("staging a put's source on the heap", format!("{e:?}")))?;
                }
                a.in_base = staged;
            }
            let in_w = a.in_base.wrapping_add((lo * esz) as u64);
            let out_w = base.out_base.wrapping_add((lo * esz) as u64);
            a.aligned = i32::from(in_w.is_multiple_of(16) && out_w.is_multiple_of(16));
            let blocks = match base.mode {
                kernels::LL => kernels::ll_blocks(hi - lo, esz, self.opts.max_blocks),
                _ => kernels::blocks_for(hi - lo, esz, self.opts.max_blocks),
            };
            // Dependent launch hides the gap between back-to-back collectives.
            let dependent = self.dependent_launch;
            // SAFETY: the window lies inside the caller's tensors (checked by the callers'
            // sizes) and inside every member's staging slots (window <= slot); the context is
            // bound.
            unsafe { kernels::launch(f.for_mode(a.mode), blocks, &a, raw as cu::CUstream, dependent)? };
            prev_blocks = blocks;
        }
        Ok(())
    }

    /// The algorithm an all-reduce of `v` runs.
    fn all_reduce_mode(&self, v: &CudaView) -> i32 {
        options::all_reduce_mode(&self.opts, self.algorithm(), v.bytes())
    }

    /// The driver's floor under a collective's enqueue time: host microseconds per launch of an
    /// empty kernel on the communication stream, with the collectives' argument block and with
    /// one 8-byte argument (averaged over `iters` launches each). Diagnostics for comm-bench.
    pub fn launch_probe(&self, iters: usize) -> Result<(f64, f64)> {
        self.bind()?;
        let raw = self.stream.stream.raw().cu_stream() as cu::CUstream;
        let iters = iters.max(1);
        let a = CollArgs::default();
        let t = std::time::Instant::now();
        for _ in 0..iters {
            // SAFETY: the empty kernel reads nothing.
            unsafe { kernels::launch(self.module.nop, 1, &a, raw, false)? };
        }
        let full = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        self.stream.stream.synchronize().map_err(|e| cuda_err("the launch probe", e))?;
        let mut x = 0u64;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            let mut params = [&mut x as *mut u64 as *mut c_void];
            // SAFETY: as above.
            unsafe { drv::launch_kernel(self.module.nop8.0, (1, 1, 1), (1, 1, 1), 0, raw, &mut params) }
                .map_err(|e| cuda_err("the launch probe", format!("{e:?}")))?;
        }
        let small = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        self.stream.stream.synchronize().map_err(|e| cuda_err("the launch probe", e))?;
        Ok((full, small))
    }

    /// Whether the collectives run hierarchically (the PEs span nodes; see `hier.rs`).
    pub fn is_hierarchical(&self) -> bool {
        self.per_node < self.world
    }

    fn span(&self) -> hier::Span {
        // The node and rail teams have slots of one size (connect.rs).
        let slot_bytes = self.teams[Kind::Node as usize].as_ref().map_or(0, |t| t.slot_bytes);
        hier::Span { rank: self.rank, world: self.world, per_node: self.per_node, slot_bytes }
    }

    /// The scratch buffer with at least `bytes`, held until the caller has queued its launches.
    fn scratch(&self, bytes: usize) -> Result<std::sync::MutexGuard<'_, Scratch>> {
        let mut s = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if s.bytes < bytes {
            self.bind()?;
            if s.ptr != 0 {
                // Launches queued earlier may still use the old buffer.
                self.stream.stream.synchronize().map_err(|e| cuda_err("growing the scratch buffer", e))?;
                // SAFETY: allocated below by an earlier call; no queued work uses it any more.
                unsafe { drv::free_sync(s.ptr) }
                    .map_err(|e| cuda_err("growing the scratch buffer", format!("{e:?}")))?;
                *s = Scratch::default();
            }
            // SAFETY: the context is current.
            let ptr = unsafe { drv::malloc_sync(bytes) }
                .map_err(|e| cuda_err(format!("allocating {bytes} bytes of scratch"), format!("{e:?}")))?;
            *s = Scratch { ptr, bytes };
        }
        Ok(s)
    }
}

impl Drop for NvshmemCommunicator {
    fn drop(&mut self) {
        let Ok(api) = host::api() else { return };
        let _ = self.stream.stream.synchronize();
        let scratch = std::mem::take(&mut *self.scratch.lock().unwrap_or_else(|e| e.into_inner()));
        if scratch.ptr != 0 && self.bind().is_ok() {
            // SAFETY: allocated by `scratch`; the stream that used it has finished.
            let _ = unsafe { drv::free_sync(scratch.ptr) };
        }
        let signals = self.signals;
        let counters = self.counters;
        let teams = std::mem::take(&mut self.teams);
        let module = symmetric::SendModule(self.module.module);
        let ordinal = self.stream.ordinal;
        // Runs now, or when the last symmetric tensor is dropped: they live on the heap that
        // finalising NVSHMEM releases.
        let teardown = move || {
            let module = module;
            if let Ok(d) = oxtrain_tensor::cuda::device(ordinal) {
                let _ = d.context().bind_to_thread();
            }
            // SAFETY: every PE tears down in the same order (collective frees); the module was
            // registered in `connect`; no kernel of this communicator is queued any more.
            unsafe {
                (api.barrier_all)();
                // In the order of allocation, as every PE does.
                (api.free)(signals as *mut c_void);
                let _ = drv::free_sync(counters);
                for t in teams.iter().flatten() {
                    t.free(api);
                }
                let _ = (api.cumodule_finalize)(module.0 as *mut c_void);
                let _ = drv::module::unload(module.0);
                (api.hostlib_finalize)();
            }
        };
        symmetric::teardown_when_unused(&self.tensors, Box::new(teardown));
    }
}
