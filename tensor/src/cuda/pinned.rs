//! Page-locked ("pinned") host memory, for host-to-device copies that run at full bus speed and
//! asynchronously, overlapping with compute.
//!
//! Design: a CPU tensor keeps its `Vec` storage (making `CpuStorage` pinned would touch every
//! CPU kernel, and pinned memory is a scarce resource the OS cannot page out). Pinned memory
//! lives instead in [`PinnedBuffer`]s, which are used two ways:
//! - the data loader fills a buffer of its own (`as_mut_slice`) and hands it to
//!   `Tensor::from_pinned`, which queues the copy and returns at once;
//! - `Tensor::to_device_non_blocking` copies a CPU tensor into a staging buffer from a small
//!   process-wide pool and queues the copy from there.
//!
//! Either way the buffer remembers an event recorded after each copy it feeds; writing to it
//! again (`as_mut_slice`), reusing it from the pool, or freeing it first waits for those copies,
//! so the host never overwrites bytes the device is still reading.

use super::device::device;
use super::stream::current_raw;
use super::CudaStorage;
use crate::{Error, Result};
use cudarc::driver::{result as drv, sys, CudaContext, CudaEvent};
use std::sync::{Arc, Mutex};

fn drv_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Msg(format!("{what}: {e:?}"))
}

/// Page-locked host memory, usable with every device (`CU_MEMHOSTALLOC_PORTABLE`).
pub struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
    /// Events recorded after the queued copies that read this buffer.
    in_flight: Vec<CudaEvent>,
}

// SAFETY: the buffer owns its memory; mutable access goes through `&mut self`.
unsafe impl Send for PinnedBuffer {}
unsafe impl Sync for PinnedBuffer {}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer({} bytes, {} copies in flight)", self.bytes, self.in_flight.len())
    }
}

impl PinnedBuffer {
    /// `bytes` of zeroed page-locked memory, allocated through device `ordinal`'s context.
    pub fn new(ordinal: usize, bytes: usize) -> Result<PinnedBuffer> {
        let ctx = device(ordinal)?.context().clone();
        ctx.bind_to_thread().map_err(|e| drv_err("binding the CUDA context", e))?;
        // SAFETY: a plain allocation in the bound context; at least one byte so the pointer is real.
        let ptr = unsafe { drv::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| drv_err(&format!("allocating {bytes} bytes of pinned host memory"), e))?
            as *mut u8;
        // SAFETY: `ptr` holds at least `bytes` bytes; zeroing makes every later view initialised.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(PinnedBuffer { ptr, bytes, ctx, in_flight: Vec::new() })
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a queued copy may still be reading the buffer.
    pub fn is_busy(&mut self) -> bool {
        self.in_flight.retain(|e| !e.is_complete());
        !self.in_flight.is_empty()
    }

    /// Blocks until every queued copy from this buffer has finished.
    pub fn wait(&mut self) -> Result<()> {
        for e in self.in_flight.drain(..) {
            e.synchronize().map_err(|e| drv_err("waiting for a copy from pinned memory", e))?;
        }
        Ok(())
    }

    /// The bytes as `T`s (as many whole `T`s as fit). Reading is safe while copies run.
    pub fn as_slice<T: bytemuck::Pod>(&self) -> &[T] {
        // SAFETY: the memory is initialised (zeroed at allocation), page-aligned, and not
        // mutated while `&self` is borrowed (the device only reads it).
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.bytes / std::mem::size_of::<T>()) }
    }

    /// The bytes as `T`s for writing, after waiting for queued copies that read them. Panics
    /// if the device fails while waiting (a broken device, not a recoverable condition).
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        self.wait().unwrap_or_else(|e| panic!("PinnedBuffer::as_mut_slice: {e}"));
        // SAFETY: as in `as_slice`, and no copy reads the memory any more.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.bytes / std::mem::size_of::<T>()) }
    }

    /// Queues a copy of the first `dst.bytes()` bytes into `dst` on the current stream of its
    /// device, and remembers it, so the buffer is not written or freed before it finishes.
    pub(crate) fn upload_to(&mut self, dst: &CudaStorage) -> Result<()> {
        let bytes = dst.bytes();
        assert!(bytes <= self.bytes, "upload of {bytes} bytes from a pinned buffer of {}", self.bytes);
        if bytes == 0 {
            return Ok(());
        }
        let stream = current_raw(dst.device());
        dst.device().context().bind_to_thread().map_err(|e| drv_err("binding the CUDA context", e))?;
        // SAFETY: the source is pinned memory we own, kept alive (and unwritten) until the event
        // recorded below completes; `dst` holds `bytes`.
        unsafe {
            let src = std::slice::from_raw_parts(self.ptr as *const u8, bytes);
            drv::memcpy_htod_async(dst.ptr(), src, stream.cu_stream())
                .map_err(|e| drv_err("copying pinned memory to the device", e))?;
        }
        let event = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| drv_err("recording a copy's event", e))?;
        self.in_flight.retain(|e| !e.is_complete());
        self.in_flight.push(event);
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // Freeing memory a queued copy still reads would hand it garbage.
        let _ = self.wait();
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_host`, freed once, after every copy from it finished.
        unsafe {
            let _ = drv::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}

/// How many idle staging buffers the pool keeps; busier programs allocate more and drop the
/// smallest extras when they come back.
const MAX_STAGING: usize = 8;

/// Staging buffers round up to a power of two of at least 1 MiB, so similar sizes share them.
pub(crate) fn staging_size(bytes: usize) -> usize {
    bytes.max(1 << 20).next_power_of_two()
}

static STAGING: Mutex<Vec<PinnedBuffer>> = Mutex::new(Vec::new());

/// Copies `data` to `dst` through a pinned staging buffer: the host copy into the staging
/// buffer happens now, the device copy is queued on the current stream, and the buffer returns
/// to the pool to be reused once that copy has finished.
pub(crate) fn upload_staged(data: &[u8], dst: &CudaStorage) -> Result<()> {
    assert_eq!(data.len(), dst.bytes(), "staged upload: host and device sizes differ");
    let mut buf = {
        let mut pool = STAGING.lock().unwrap_or_else(|e| e.into_inner());
        let idle = pool.iter_mut().position(|b| b.len_bytes() >= data.len() && !b.is_busy());
        match idle {
            Some(i) => pool.swap_remove(i),
            None => {
                drop(pool);
                PinnedBuffer::new(dst.device().ordinal(), staging_size(data.len()))?
            }
        }
    };
    buf.as_mut_slice::<u8>()[..data.len()].copy_from_slice(data);
    let queued = buf.upload_to(dst);
    let mut pool = STAGING.lock().unwrap_or_else(|e| e.into_inner());
    pool.push(buf);
    if pool.len() > MAX_STAGING {
        let smallest = (0..pool.len()).min_by_key(|&i| pool[i].len_bytes()).expect("a non-empty pool");
        // Dropping waits for its copies; that is rare and keeps pinned memory bounded.
        drop(pool.swap_remove(smallest));
    }
    queued
}
