//! Bytes held by CPU tensors, as `torch.cuda.memory_allocated` / `max_memory_allocated` count
//! them on a GPU: every CPU storage adds its elements' bytes while it lives. The peak is what
//! a step needed at its worst (the activations kept for backward, mostly), measured from the
//! tensors themselves, independent of the allocator's reuse and of what else the process
//! holds; resident memory (RSS) is the other, coarser measure.

use std::sync::atomic::{AtomicUsize, Ordering};

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes of the CPU tensors alive now, and the most alive at once since the last
/// [`reset_cpu_peak`] (or since the start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuMemoryStats {
    pub allocated: usize,
    pub peak_allocated: usize,
}

/// The byte counts of CPU tensor storage, process-wide.
pub fn cpu_memory_stats() -> CpuMemoryStats {
    CpuMemoryStats {
        allocated: ALLOCATED.load(Ordering::Relaxed),
        peak_allocated: PEAK.load(Ordering::Relaxed),
    }
}

/// Starts a new peak from what is alive now (`torch.cuda.reset_peak_memory_stats()`).
pub fn reset_cpu_peak() {
    PEAK.store(ALLOCATED.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A storage of `bytes` came to life.
pub(crate) fn add(bytes: usize) {
    let now = ALLOCATED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// A storage of `bytes` was freed.
pub(crate) fn sub(bytes: usize) {
    ALLOCATED.fetch_sub(bytes, Ordering::Relaxed);
}
