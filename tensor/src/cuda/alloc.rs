//! A caching allocator for device memory, in the spirit of PyTorch's.
//!
//! `cuMemAlloc`/`cuMemFree` synchronise the device and cost tens of microseconds, so a training
//! step must not call them. Freed blocks go back to a per-stream cache and are handed out again
//! to the next request of a fitting size on the same stream: work queued on one stream runs in
//! order, so a block freed there can be reused there at once. A block that another stream also
//! used (see [`CudaBuffer::record_stream`]) waits until an event recorded on that stream has
//! completed. When the driver runs out of memory, the cache is emptied and the request retried
//! before an error reports how much was asked, allocated and reserved.

use crate::{Error, Result};
use cudarc::driver::{result as drv, sys, CudaContext};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Small requests round up to 512 B; others to 2 MiB, so similar sizes share cache entries.
const SMALL: usize = 1 << 20;
const SMALL_ROUND: usize = 512;
const LARGE_ROUND: usize = 2 << 20;

fn round_size(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    let r = if bytes < SMALL { SMALL_ROUND } else { LARGE_ROUND };
    bytes.div_ceil(r) * r
}

/// Byte counts, as `torch.cuda.memory_stats()` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks handed out to tensors now.
    pub allocated: usize,
    /// Bytes obtained from the driver now (allocated plus cached).
    pub reserved: usize,
    pub peak_allocated: usize,
    pub peak_reserved: usize,
    /// How many times the driver was asked for memory (`cuMemAlloc`); flat in a steady loop.
    pub driver_allocs: usize,
    pub driver_frees: usize,
}

/// A stream's identity for cache bookkeeping (its `CUstream` handle).
pub type StreamId = usize;

#[derive(Debug)]
struct PendingBlock {
    ptr: sys::CUdeviceptr,
    size: usize,
    stream: StreamId,
    events: Vec<sys::CUevent>,
}

#[derive(Default)]
struct Pool {
    /// (stream, size, ptr): best fit is the first key at or after (stream, size, 0).
    free: BTreeMap<(StreamId, usize, sys::CUdeviceptr), ()>,
    /// Blocks freed while other streams may still use them.
    pending: Vec<PendingBlock>,
    stats: MemoryStats,
}

pub struct CachingAllocator {
    ctx: Arc<CudaContext>,
    pool: Mutex<Pool>,
}

// SAFETY: device pointers and events are plain handles; all mutation is behind the mutex.
unsafe impl Send for CachingAllocator {}
unsafe impl Sync for CachingAllocator {}

impl CachingAllocator {
    pub fn new(ctx: Arc<CudaContext>) -> Arc<CachingAllocator> {
        Arc::new(CachingAllocator { ctx, pool: Mutex::new(Pool::default()) })
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> MemoryStats {
        self.pool().stats
    }

    /// Forgets the peaks, as `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&self) {
        let mut p = self.pool();
        p.stats.peak_allocated = p.stats.allocated;
        p.stats.peak_reserved = p.stats.reserved;
    }

    /// A block of at least `bytes` for use on `stream`.
    pub fn alloc(self: &Arc<Self>, bytes: usize, stream: StreamId) -> Result<CudaBuffer> {
        let size = round_size(bytes);
        let mut pool = self.pool();
        pool.collect_completed();
        // Best fit on this stream; a large request takes a block at most twice its size.
        let limit = if size < SMALL { size } else { size * 2 };
        let hit = pool
            .free
            .range((stream, size, 0)..=(stream, limit, sys::CUdeviceptr::MAX))
            .next()
            .map(|(k, _)| *k);
        let (ptr, size) = match hit {
            Some(key) => {
                pool.free.remove(&key);
                (key.2, key.1)
            }
            None => {
                let ptr = match self.driver_alloc(size) {
                    Ok(p) => p,
                    Err(_) => {
                        // Give the cache back to the driver and try once more.
                        self.release_cached(&mut pool)?;
                        self.driver_alloc(size).map_err(|e| Error::CudaOutOfMemory {
                            ordinal: self.ctx.ordinal(),
                            requested: bytes,
                            allocated: pool.stats.allocated,
                            reserved: pool.stats.reserved,
                            reason: format!("{e:?}"),
                        })?
                    }
                };
                pool.stats.driver_allocs += 1;
                pool.stats.reserved += size;
                pool.stats.peak_reserved = pool.stats.peak_reserved.max(pool.stats.reserved);
                (ptr, size)
            }
        };
        pool.stats.allocated += size;
        pool.stats.peak_allocated = pool.stats.peak_allocated.max(pool.stats.allocated);
        Ok(CudaBuffer {
            ptr,
            size,
            len_bytes: bytes,
            stream,
            other_streams: Vec::new(),
            owner: Owner::Cache(self.clone()),
        })
    }

    fn driver_alloc(&self, size: usize) -> std::result::Result<sys::CUdeviceptr, drv::DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: a plain allocation in the bound context.
        unsafe { drv::malloc_sync(size) }
    }

    /// Frees every cached block (after the device is idle, since pending work may use them).
    fn release_cached(&self, pool: &mut Pool) -> Result<()> {
        self.ctx.synchronize().map_err(|e| Error::Msg(format!("cuCtxSynchronize failed: {e:?}")))?;
        pool.collect_completed();
        let free = std::mem::take(&mut pool.free);
        for (_, size, ptr) in free.into_keys() {
            // SAFETY: the block is cached, so no tensor refers to it, and the device is idle.
            unsafe {
                let _ = drv::free_sync(ptr);
            }
            pool.stats.reserved -= size;
            pool.stats.driver_frees += 1;
        }
        Ok(())
    }

    /// Returns every cached block to the driver, as `torch.cuda.empty_cache()`.
    pub fn empty_cache(&self) -> Result<()> {
        let mut pool = self.pool();
        self.release_cached(&mut pool)
    }

    fn free(&self, buf: &mut CudaBuffer) {
        let mut pool = self.pool();
        pool.stats.allocated -= buf.size;
        if buf.other_streams.is_empty() {
            pool.free.insert((buf.stream, buf.size, buf.ptr), ());
            return;
        }
        // Record an event on each other stream that used the block; reuse waits for them.
        let _ = self.ctx.bind_to_thread();
        let events = buf
            .other_streams
            .iter()
            .filter_map(|&s| {
                // SAFETY: the streams outlive the buffers they touched (they belong to the device).
                unsafe {
                    let ev = drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).ok()?;
                    drv::event::record(ev, s as sys::CUstream).ok()?;
                    Some(ev)
                }
            })
            .collect();
        pool.pending.push(PendingBlock { ptr: buf.ptr, size: buf.size, stream: buf.stream, events });
    }
}

impl Pool {
    fn collect_completed(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            // SAFETY: events were created by `free` and are destroyed once, here.
            let done = self.pending[i].events.iter().all(|&e| unsafe { drv::event::query(e) }.is_ok());
            if done {
                let b = self.pending.swap_remove(i);
                for e in b.events {
                    unsafe {
                        let _ = drv::event::destroy(e);
                    }
                }
                self.free.insert((b.stream, b.size, b.ptr), ());
            } else {
                i += 1;
            }
        }
    }
}

/// A block of device memory owned by one tensor's storage; returns to the cache on drop.
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    size: usize,
    len_bytes: usize,
    stream: StreamId,
    other_streams: Vec<StreamId>,
    owner: Owner,
}

/// Who takes a block back when its buffer drops.
enum Owner {
    /// The caching allocator (the block returns to its cache).
    Cache(Arc<CachingAllocator>),
    /// Memory oxtrain did not allocate; dropping this reference is all the buffer does.
    External(#[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>),
}

// SAFETY: a device pointer is a plain handle; the allocator is thread-safe.
unsafe impl Send for CudaBuffer {}
unsafe impl Sync for CudaBuffer {}

impl CudaBuffer {
    /// Device memory that the caching allocator did not hand out, such as a communication
    /// library's symmetric heap (as `torch.from_blob` wraps foreign memory): `owner` is kept
    /// alive while the buffer lives and dropped with it; nothing is freed otherwise.
    ///
    /// # Safety
    /// `ptr..ptr + len_bytes` is device memory of the device the buffer is used on, valid for
    /// reads and writes as long as `owner` lives, and not used otherwise meanwhile.
    pub unsafe fn external(
        ptr: sys::CUdeviceptr,
        len_bytes: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> CudaBuffer {
        CudaBuffer {
            ptr,
            size: len_bytes,
            len_bytes,
            stream: 0,
            other_streams: Vec::new(),
            owner: Owner::External(owner),
        }
    }

    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The bytes asked for (the block may be larger).
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The stream the block was allocated on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Marks the block as used by another stream, so it is not reused until that stream's
    /// work queued so far has finished (`Tensor.record_stream` in PyTorch).
    pub fn record_stream(&mut self, stream: StreamId) {
        if stream != self.stream && !self.other_streams.contains(&stream) {
            self.other_streams.push(stream);
        }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // External memory: the owner reference drops with the buffer; its holder decides when
        // the memory may go (after the streams that used it are done, as it must ensure).
        if let Owner::Cache(allocator) = &self.owner {
            let allocator = allocator.clone();
            allocator.free(self);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{round_size, CudaBuffer};
    use std::sync::Arc;

    #[test]
    fn an_external_buffer_keeps_its_owner_alive_and_frees_nothing() {
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(7u32);
        // SAFETY: the pointer is never dereferenced (no device here): only ownership is checked.
        let buf = unsafe { CudaBuffer::external(0x1000, 256, owner.clone()) };
        assert_eq!((buf.device_ptr(), buf.len_bytes()), (0x1000, 256));
        assert_eq!(Arc::strong_count(&owner), 2);
        drop(buf);
        assert_eq!(Arc::strong_count(&owner), 1);
    }

    #[test]
    fn sizes_round_to_their_class() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size((1 << 20) - 1), 1 << 20);
        assert_eq!(round_size((1 << 20) + 1), 2 << 20);
        assert_eq!(round_size(5 << 20), 6 << 20);
    }
}
