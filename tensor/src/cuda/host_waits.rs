//! What makes the host wait for a device, counted; and errors that kernels find, reported at
//! the next wait of the thread that launched them instead of by a wait of their own.
//!
//! A training step that never waits for the GPU lets the host queue the next step's kernels
//! while the current ones run, and can be captured into a CUDA graph. Two things used to make
//! oxtrain wait inside a step: reading a tensor to the host (`to_cpu`, `item`), and checks of
//! index values on the host before a gather. The counters here show the first (a steady step
//! should add nothing to them); the deferred errors remove the second: an index kernel checks
//! its own indices and records the first bad one in mapped host memory, and the host looks at
//! that record whenever it waits for the device anyway, as PyTorch reports a device-side assert
//! at the next synchronising call.

use crate::{Error, Result};
use cudarc::driver::{result as drv, sys, CudaContext};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How often the host has waited for a device since the process started (per device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostWaits {
    /// Device-to-host copies (`to_cpu`, `to_vec`, `item`), each waiting for the stream.
    pub copies_to_host: u64,
    /// Host-to-device copies that waited for their stream (`Tensor::to_device` from the CPU).
    pub synchronous_uploads: u64,
    /// Explicit waits: device, stream and event synchronisations, including the timing runs of
    /// algorithm tuning (cuBLASLt, cuDNN), which happen once per shape.
    pub synchronizations: u64,
}

impl HostWaits {
    /// All waits together.
    pub fn total(&self) -> u64 {
        self.copies_to_host + self.synchronous_uploads + self.synchronizations
    }

    /// The waits since `earlier` (a reading of the same device).
    pub fn since(&self, earlier: &HostWaits) -> HostWaits {
        HostWaits {
            copies_to_host: self.copies_to_host - earlier.copies_to_host,
            synchronous_uploads: self.synchronous_uploads - earlier.synchronous_uploads,
            synchronizations: self.synchronizations - earlier.synchronizations,
        }
    }
}

/// The kinds of wait, as counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    CopyToHost,
    SynchronousUpload,
    Synchronization,
}

#[derive(Default)]
pub(crate) struct WaitCounters {
    copies_to_host: AtomicU64,
    synchronous_uploads: AtomicU64,
    synchronizations: AtomicU64,
}

impl WaitCounters {
    pub(crate) fn count(&self, wait: Wait) {
        let c = match wait {
            Wait::CopyToHost => &self.copies_to_host,
            Wait::SynchronousUpload => &self.synchronous_uploads,
            Wait::Synchronization => &self.synchronizations,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> HostWaits {
        HostWaits {
            copies_to_host: self.copies_to_host.load(Ordering::Relaxed),
            synchronous_uploads: self.synchronous_uploads.load(Ordering::Relaxed),
            synchronizations: self.synchronizations.load(Ordering::Relaxed),
        }
    }
}

/// Counts a wait on an event of `stream` made outside oxtrain's own stream and event types
/// (the timing runs of algorithm tuning), and reports what kernels found meanwhile.
pub(crate) fn waited_on_stream(stream: &cudarc::driver::CudaStream) {
    if let Ok(dev) = super::device(stream.context().ordinal()) {
        dev.waited(Wait::Synchronization);
    }
}

/// Ops whose kernels check their indices on the device. The number is what a kernel records;
/// keep it in step with `DEVICE_ERROR_*` in common.cuh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum DeviceCheck {
    /// An index outside `0..size` in a gather (index_select, embedding, gather).
    GatherIndex = 1,
    /// An id outside `0..num_embeddings` in embedding's backward.
    EmbeddingBackwardId = 2,
}

impl DeviceCheck {
    fn from_code(code: u64) -> Option<DeviceCheck> {
        match code {
            1 => Some(DeviceCheck::GatherIndex),
            2 => Some(DeviceCheck::EmbeddingBackwardId),
            _ => None,
        }
    }
}

thread_local! {
    /// This thread's error record of each device. Records are never freed: a kernel may still
    /// be about to write one when its thread ends, and each is a few bytes.
    static RECORDS: RefCell<HashMap<usize, &'static DeviceErrors>> = RefCell::new(HashMap::new());
}

/// This thread's error record on device `ordinal` (context `ctx`), made on first use. One per
/// thread, so that a thread's bad index is reported to that thread: tests and workers sharing
/// a device do not see each other's errors.
pub(crate) fn thread_record(ordinal: usize, ctx: &Arc<CudaContext>) -> Result<&'static DeviceErrors> {
    if let Some(r) = RECORDS.with(|r| r.borrow().get(&ordinal).copied()) {
        return Ok(r);
    }
    let record: &'static DeviceErrors = Box::leak(Box::new(DeviceErrors::new(ctx.clone())?));
    RECORDS.with(|r| r.borrow_mut().insert(ordinal, record));
    Ok(record)
}

/// The error this thread's kernels recorded on device `ordinal` since the last look, cleared.
pub(crate) fn take_thread_error(ordinal: usize) -> Option<String> {
    RECORDS.with(|r| r.borrow().get(&ordinal).copied()).and_then(DeviceErrors::take)
}

/// The first error a thread's kernels found: `[check, bad value, bound, 0]` in page-locked host memory
/// mapped into the device's address space, so the host reads it without a copy. Kernels claim
/// the record with an atomic compare-and-swap on a flag in device memory (atomics on mapped
/// host memory are not atomic across the bus), and the winner writes the words with plain
/// stores, the check number last. The host reads the record after a wait, when every earlier
/// kernel has finished, and clears it.
pub(crate) struct DeviceErrors {
    host: *mut u64,
    arg: ErrorRecordArg,
    /// The ops that launched checking kernels lately, for the message.
    ops: Mutex<Vec<&'static str>>,
    _ctx: Arc<CudaContext>,
}

/// What a checking kernel takes (`struct ErrorRecord` in common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorRecordArg {
    claimed: u64,
    words: u64,
}

// SAFETY: two device addresses, the C layout the kernels declare.
unsafe impl cudarc::driver::DeviceRepr for ErrorRecordArg {}

// SAFETY: the record is plain memory; the host reads it only after the device finished writing.
unsafe impl Send for DeviceErrors {}
unsafe impl Sync for DeviceErrors {}

const RECORD_WORDS: usize = 4;

impl DeviceErrors {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<DeviceErrors> {
        let fail = |what: &str, e: &dyn std::fmt::Debug| Error::Msg(format!("{what}: {e:?}"));
        ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", &e))?;
        let bytes = RECORD_WORDS * std::mem::size_of::<u64>();
        // SAFETY: a plain allocation in the bound context, mapped so kernels can write it.
        let host = unsafe {
            drv::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .map_err(|e| fail("allocating the device error record (mapped host memory)", &e))?
            as *mut u64;
        // SAFETY: `host` holds RECORD_WORDS words.
        unsafe { std::ptr::write_bytes(host, 0, RECORD_WORDS) };
        let mut words: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut words, host as *mut _, 0) }
            .result()
            .map_err(|e| fail("mapping the device error record", &e))?;
        // The claim flag lives as long as the process's device (never freed: the device is).
        // SAFETY: a plain allocation and a synchronous memset in the bound context.
        let claimed = unsafe { drv::malloc_sync(8) }.map_err(|e| fail("allocating the error flag", &e))?;
        unsafe { drv::memset_d8_sync(claimed, 0, 8) }.map_err(|e| fail("clearing the error flag", &e))?;
        let arg = ErrorRecordArg { claimed, words };
        Ok(DeviceErrors { host, arg, ops: Mutex::new(Vec::new()), _ctx: ctx })
    }

    /// The record as kernels take it.
    pub(crate) fn arg(&self) -> ErrorRecordArg {
        self.arg
    }

    /// Remembers which op launched a checking kernel, for the message (the last few).
    pub(crate) fn note_op(&self, op: &'static str) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        if ops.last() != Some(&op) {
            ops.retain(|o| *o != op);
            ops.push(op);
            let excess = ops.len().saturating_sub(8);
            ops.drain(..excess);
        }
    }

    /// The recorded error, if any, cleared. Call only when every kernel launched so far has
    /// finished (after a synchronisation or a blocking copy).
    pub(crate) fn take(&self) -> Option<String> {
        // SAFETY: the device finished writing (the caller waited); volatile because the device
        // wrote it behind the compiler's back.
        let words: Vec<u64> =
            (0..RECORD_WORDS).map(|i| unsafe { self.host.add(i).read_volatile() }).collect();
        if words[0] == 0 {
            return None;
        }
        // SAFETY: as above; clearing the words and the flag lets later errors be recorded.
        unsafe {
            std::ptr::write_bytes(self.host, 0, RECORD_WORDS);
            let _ = drv::memset_d8_sync(self.arg.claimed, 0, 8);
        }
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner()).join(", ");
        let (value, bound) = (words[1] as i64, words[2]);
        Some(match DeviceCheck::from_code(words[0]) {
            Some(DeviceCheck::GatherIndex) => format!(
                "index {value} is out of range for a dimension of size {bound} (found on the GPU \
                 by one of: {ops}; CUDA ops run asynchronously, so it is reported at the next \
                 wait for the device)"
            ),
            Some(DeviceCheck::EmbeddingBackwardId) => format!(
                "embedding_backward: id {value} is out of range for {bound} embeddings (found on \
                 the GPU; reported at the next wait for the device)"
            ),
            None => format!("a kernel recorded an unknown error {words:?}"),
        })
    }
}

impl Drop for DeviceErrors {
    fn drop(&mut self) {
        // SAFETY: allocated once in `new`, freed once here.
        unsafe {
            let _ = drv::free_host(self.host as *mut _);
        }
    }
}
