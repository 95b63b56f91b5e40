//! Buffers on the symmetric heap and their zero-copy all-reduce.
//!
//! `Communicator::symmetric_tensor` on this backend allocates a tensor on NVSHMEM's heap
//! (PyTorch's `symm_mem.empty`). `all_reduce` on such a tensor, and [`NvshmemHeap::all_reduce`] on a heap
//! buffer, need no staging copy: every PE's copy is reachable by load/store, so each PE
//! reduces its shard and stores the result straight into every copy (two-shot pushes,
//! `collectives.cu`, or one pass loading the peers' copies, `symmetric.cu`). The kernels check
//! that every PE passed the same buffer (a PE that passed another would have a different buffer
//! of its peers overwritten) and fail the call otherwise.
//!
//! Heap memory is allocated collectively and cannot be freed by one PE alone, so a symmetric
//! tensor's memory is not reused when it is dropped: it returns when the communicator is
//! dropped (allocate long-lived buffers, such as gradient buckets, once). A tensor that
//! outlives its communicator keeps the heap alive: NVSHMEM is finalised when the last of them
//! is dropped.
//!
//! [`NvshmemHeap::all_reduce`]: super::NvshmemHeap::all_reduce

use super::host;
use super::kernels::{self, CollArgs, Kernels};
use super::team::Kind;
use super::{nv_err, NvshmemCommunicator, Stage};
use crate::error::{CommError, Result};
use crate::gpu::cuda_err;
use crate::op::ReduceOp;
use crate::work::Work;
use cudarc::driver::{result as drv, sys as cu};
use oxtrain_tensor::{DType, Device, Shape, Tensor};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The heap regions symmetric tensors occupy, how many tensors are alive, and the
/// communicator's teardown when it was dropped before them.
#[derive(Default)]
pub(crate) struct Regions {
    list: Vec<(u64, usize)>,
    alive: usize,
    deferred: Option<Box<dyn FnOnce() + Send>>,
}
pub(crate) type Registry = Arc<Mutex<Regions>>;

fn lock(r: &Registry) -> std::sync::MutexGuard<'_, Regions> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loaded module handle, moved into a deferred teardown.
pub(crate) struct SendModule(pub cu::CUmodule);
// SAFETY: a module handle is process-wide; the teardown is its last user.
unsafe impl Send for SendModule {}

/// Runs `teardown` now, or when the last symmetric tensor is dropped.
pub(crate) fn teardown_when_unused(r: &Registry, teardown: Box<dyn FnOnce() + Send>) {
    let mut regions = lock(r);
    if regions.alive > 0 {
        regions.deferred = Some(teardown);
        return;
    }
    drop(regions);
    teardown();
}

/// What a symmetric tensor's storage holds on to.
struct Owner {
    registry: Registry,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let deferred = {
            let mut r = lock(&self.registry);
            r.alive -= 1;
            if r.alive == 0 {
                r.deferred.take()
            } else {
                None
            }
        };
        if let Some(teardown) = deferred {
            teardown();
        }
    }
}

/// All-reduces of symmetric tensors smaller than this take the ordinary algorithms: on 2xH200
/// the zero-copy kernel ties them at 4 MiB (20.9 against 21.2 us) and leads from 8 MiB (34.2
/// against 35.8), while low-latency and one-shot win below.
pub(crate) const SYMMETRIC_MIN_BYTES: usize = 4 << 20;

impl NvshmemCommunicator {
    /// `Communicator::symmetric_tensor` here: a zeroed tensor on NVSHMEM's symmetric heap, as
    /// PyTorch's `symm_mem.empty`; `all_reduce` of it (from 4 MiB, `Algorithm::Auto`) runs with
    /// no staging copy, the backend's fastest. Collective: every rank calls it with the same
    /// shape and dtype in the same order. Its memory returns when the communicator is dropped,
    /// not with the tensor (see the module notes); the heap must be large enough
    /// (`NVSHMEM_SYMMETRIC_SIZE`).
    pub(crate) fn alloc_symmetric(&self, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
        if device != Device::Cuda(self.stream.ordinal) {
            return Err(CommError::Unsupported(format!(
                "symmetric_tensor on {device:?}: this nvshmem communicator's heap is on cuda:{}",
                self.stream.ordinal
            )));
        }
        let bytes = (shape.elem_count() * dtype.size_in_bytes()).max(1).next_multiple_of(512);
        let api = host::api()?;
        self.bind()?;
        // SAFETY: collective allocation, called alike on every PE.
        let base = unsafe { (api.malloc)(bytes) } as u64;
        if base == 0 {
            return Err(nv_err(format!(
                "nvshmem_malloc({bytes}) for a symmetric tensor failed: raise NVSHMEM_SYMMETRIC_SIZE (the heap \
                 also holds the backend's staging)"
            )));
        }
        // SAFETY: the fresh allocation holds `bytes`.
        unsafe { drv::memset_d8_sync(base, 0, bytes) }
            .map_err(|e| cuda_err("zeroing a symmetric tensor", format!("{e:?}")))?;
        // Zeroed everywhere before any PE can write into it.
        // SAFETY: collective, called alike on every PE.
        unsafe { (api.barrier_all)() };
        {
            let mut r = lock(&self.tensors);
            r.list.push((base, bytes));
            r.alive += 1;
        }
        let owner = Arc::new(Owner { registry: self.tensors.clone() });
        // SAFETY: `base` holds the tensor's bytes on this GPU; the owner keeps the heap (and so
        // the memory) alive, see teardown_when_unused.
        unsafe { Tensor::from_cuda_blob(base, dtype, shape, self.stream.ordinal, owner) }
            .map_err(|e| cuda_err("wrapping a symmetric tensor", e))
    }

    /// Whether `[ptr, ptr + bytes)` lies in one symmetric tensor's memory.
    pub(crate) fn is_symmetric(&self, ptr: u64, bytes: usize) -> bool {
        lock(&self.tensors)
            .list
            .iter()
            .any(|&(base, len)| ptr >= base && ptr + bytes as u64 <= base + len as u64)
    }

    /// The zero-copy all-reduce of `len` elements of `esz` bytes at `addr` on the symmetric
    /// heap, in place, over every PE (all on this node).
    pub(crate) fn symmetric_all_reduce(
        &self,
        f: Kernels,
        addr: u64,
        len: usize,
        esz: usize,
        op: ReduceOp,
    ) -> Result<Work> {
        if self.is_hierarchical() {
            return Err(CommError::Unsupported(
                "nvshmem symmetric all_reduce: the PEs span nodes, and it needs every PE's heap reachable by \
                 load/store; use NvshmemCommunicator::all_reduce on an ordinary tensor"
                    .into(),
            ));
        }
        let team = self.team(Kind::All)?;
        let api = host::api()?;
        let mut a = CollArgs::in_place(addr, len, op);
        a.mode = kernels::SYMM;
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_ALL;
        for (m, &pe) in team.members.iter().enumerate() {
            // SAFETY: addr is a symmetric address on the heap.
            let peer = unsafe { (api.ptr)(addr as *const c_void, pe as i32) } as u64;
            if peer == 0 {
                return Err(nv_err(format!(
                    "symmetric all_reduce: PE {pe}'s heap is not reachable by load/store from PE {} (nvshmem_ptr is \
                     null)",
                    self.rank
                )));
            }
            a.bufs[m] = peer;
        }
        // Pushes (two-shot into the peers' copies) need whole 16-byte packs, and the peers'
        // copies where the kernel computes them: at our offset from their staging sets.
        let linear = team.sets.iter().all(|set| {
            (0..team.members.len()).all(|m| set[m].wrapping_sub(set[team.me]) == a.bufs[m].wrapping_sub(addr))
        });
        let packs = linear && addr.is_multiple_of(16) && (len * esz).is_multiple_of(16);
        if super::options::symmetric_pushes(&self.opts, len * esz, packs) {
            a.mode = kernels::SYMM_PUSH;
        }
        self.launch("nvshmem symmetric all_reduce", f, esz, &[Stage::on(Kind::All, a)], false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counter() -> (Arc<AtomicUsize>, Box<dyn FnOnce() + Send>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        (
            n,
            Box::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }

    #[test]
    fn teardown_runs_at_once_without_symmetric_tensors() {
        let r = Registry::default();
        let (ran, f) = counter();
        teardown_when_unused(&r, f);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn teardown_waits_for_the_last_symmetric_tensor() {
        let r = Registry::default();
        lock(&r).alive = 2;
        let (a, b) = (Owner { registry: r.clone() }, Owner { registry: r.clone() });
        let (ran, f) = counter();
        teardown_when_unused(&r, f);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a tensor still lives on the heap");
        drop(a);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        drop(b);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the last tensor runs the teardown, once");
        assert!(lock(&r).deferred.is_none());
    }
}
