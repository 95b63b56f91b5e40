//! What every tensor over one storage shares: the elements, a count of the writes into them
//! (PyTorch's `tensor._version`), and, for parameters, casts of them kept for reuse.
//!
//! Every write into an existing storage goes through [`Tensor::storage_mut`] (in-place ops,
//! optimizer steps, collectives, `load_state_dict`'s copies), which bumps the version. A kept
//! cast remembers the version it was made at and is used only while the storage still has
//! it, so a parameter changed in any way is cast afresh at its next use. A fused optimizer
//! step writes the kept cast together with the parameter and marks it current, so under
//! autocast the forward pass does no weight casts at all.
//!
//! Memory written behind the tensor API (another library writing into a `from_cuda_blob`
//! tensor, a peer's one-sided put) does not bump the version: whoever writes that way calls
//! [`Tensor::mark_modified`]. `OXTRAIN_DISABLE_CAST_CACHE=1` turns kept casts off.

use crate::storage::Storage;
use crate::{DType, Layout, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) struct StorageCell {
    data: RwLock<Storage>,
    version: AtomicU64,
    keep_casts: AtomicBool,
    casts: Mutex<Vec<KeptCast>>,
    /// Bytes this storage adds to the CPU tensor count (0 on other devices).
    cpu_bytes: usize,
}

impl Drop for StorageCell {
    fn drop(&mut self) {
        crate::cpu_memory::sub(self.cpu_bytes);
    }
}

/// The whole storage cast to another dtype, flat, and the versions it is valid for.
struct KeptCast {
    copy: Tensor,
    /// The storage's version the copy was made from.
    source_version: u64,
    /// The copy's own version then: a write into the copy (through a view handed out) voids it.
    copy_version: u64,
}

impl KeptCast {
    fn is_current(&self, source_version: u64) -> bool {
        self.source_version == source_version && self.copy.version() == self.copy_version
    }
}

impl StorageCell {
    pub(crate) fn new(data: Storage) -> StorageCell {
        let cpu_bytes = match &data {
            Storage::Cpu(s) => s.len() * s.dtype().size_in_bytes(),
            Storage::Cuda(_) => 0,
        };
        crate::cpu_memory::add(cpu_bytes);
        StorageCell {
            cpu_bytes,
            data: RwLock::new(data),
            version: AtomicU64::new(0),
            keep_casts: AtomicBool::new(false),
            casts: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Write access and the version it gives the storage, bumped once the lock is held: a
    /// reader that saw the old version finished before this write began.
    pub(crate) fn write(&self) -> (RwLockWriteGuard<'_, Storage>, u64) {
        let guard = self.data.write().unwrap_or_else(|e| e.into_inner());
        let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
        (guard, version)
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn casts(&self) -> MutexGuard<'_, Vec<KeptCast>> {
        self.casts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether casts are kept at all (`OXTRAIN_DISABLE_CAST_CACHE=1` says no).
fn cast_cache_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("OXTRAIN_DISABLE_CAST_CACHE").map_or(true, |v| v != "1"))
}

impl Tensor {
    /// How many writes this tensor's storage has seen (`tensor._version`): every in-place op
    /// on it or on any view of it counts.
    pub fn version(&self) -> u64 {
        self.cell().version()
    }

    /// Counts a write made behind the tensor API (see the module docs), so that casts kept of
    /// this storage are made afresh.
    pub fn mark_modified(&self) {
        drop(self.storage_mut());
    }

    /// Keeps the casts [`to_dtype_cached`](Tensor::to_dtype_cached) makes of this tensor's
    /// storage, for reuse while the storage is unchanged: what parameters want (autograd marks
    /// every `Var::parameter`), whose low-precision copies would otherwise be made at every use.
    pub fn keep_casts(&self) {
        self.cell().keep_casts.store(true, Ordering::Release);
    }

    /// This tensor as `dtype`, like [`to_dtype`](Tensor::to_dtype) and with the same values,
    /// but for a storage marked with [`keep_casts`](Tensor::keep_casts) the whole storage is cast
    /// once and kept: later calls, on this tensor or any view of its storage, return a view of
    /// that copy (with this tensor's layout) until the storage is written. The view may be
    /// strided where `to_dtype` returns a packed tensor.
    pub fn to_dtype_cached(&self, dtype: DType) -> Tensor {
        let cell = self.cell();
        let eligible = dtype != self.dtype() && self.dtype().is_float() && dtype.is_float();
        if !eligible || !cell.keep_casts.load(Ordering::Acquire) || !cast_cache_enabled() {
            return self.to_dtype(dtype);
        }
        let mut casts = cell.casts();
        let current = cell.version();
        casts.retain(|c| c.is_current(current));
        let copy = match casts.iter().find(|c| c.copy.dtype() == dtype) {
            Some(c) => c.copy.clone(),
            None => {
                let len = self.storage().len();
                let copy = self.with_layout(Layout::contiguous(len)).to_dtype(dtype);
                // A write that slipped in while the cast was queued leaves it unkept.
                if cell.version() == current {
                    casts.push(KeptCast {
                        copy_version: copy.version(),
                        copy: copy.clone(),
                        source_version: current,
                    });
                }
                copy
            }
        };
        copy.with_layout(self.layout().clone())
    }

    /// The kept cast a fused optimizer step should write along with this parameter (the first
    /// kept one; others are dropped, to be made again when used), when the parameter is an
    /// f32 tensor over the whole of its storage. A copy that someone still holds a view of is
    /// replaced by a fresh one, so that a value handed out never changes under its holder.
    pub(crate) fn kept_cast_to_refresh(&self) -> Option<Tensor> {
        let cell = self.cell();
        if !cell.keep_casts.load(Ordering::Acquire) || !cast_cache_enabled() || self.dtype() != DType::F32 {
            return None;
        }
        let whole =
            self.is_contiguous() && self.layout().offset() == 0 && self.storage().len() == self.elem_count();
        let mut casts = cell.casts();
        if !whole {
            casts.clear();
            return None;
        }
        casts.truncate(1);
        let kept = casts.first_mut()?;
        if kept.copy.storage_ref_count() > 1 {
            match Tensor::zeros(kept.copy.dims(), kept.copy.dtype(), kept.copy.device()) {
                Ok(fresh) => kept.copy = fresh,
                Err(_) => {
                    casts.clear();
                    return None;
                }
            }
        }
        Some(kept.copy.clone())
    }

    /// Records that `copy` (from [`kept_cast_to_refresh`](Tensor::kept_cast_to_refresh)) now
    /// holds this storage at `source_version`, the copy itself being at `copy_version`.
    pub(crate) fn kept_cast_refreshed(&self, copy: &Tensor, source_version: u64, copy_version: u64) {
        let mut casts = self.cell().casts();
        if let Some(kept) = casts.iter_mut().find(|c| c.copy.same_storage(copy)) {
            kept.source_version = source_version;
            kept.copy_version = copy_version;
        }
    }

    /// How many casts of this storage are kept now (for tests).
    #[doc(hidden)]
    pub fn kept_cast_count(&self) -> usize {
        self.cell().casts().len()
    }
}
