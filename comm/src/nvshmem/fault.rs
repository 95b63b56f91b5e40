//! Device-side timeouts. Every wait inside the collective kernels gives up after the
//! communicator's timeout (`OXTRAIN_COMM_TIMEOUT`, as the CPU backends) and records which PE
//! it waited for in a [`FaultRecord`] in pinned host memory mapped into the GPU. The host reads
//! it without synchronising: before every call (a fault makes the communicator unusable, as
//! NCCL's after a timeout: its peers are out of step), and when a [`Work`] is synchronised.

use crate::error::{CommError, Result};
use crate::gpu::cuda_err;
use crate::work::{Work, WorkWaiter};
use cudarc::driver::{result as drv, sys};
use std::sync::Arc;
use std::time::Duration;

/// `struct OxFault` of `collectives.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FaultRecord {
    pub code: u32,
    pub peer: u32,
    pub epoch: u64,
    pub block: u32,
    pub mode: u32,
}

/// The record, in page-locked host memory the GPU writes through its mapping.
pub(crate) struct Fault {
    host: *mut FaultRecord,
    device: u64,
    rank: usize,
    timeout: Duration,
}

// SAFETY: the record is only read (volatile) on the host and written by the GPU; the memory
// lives until the last handle is dropped.
unsafe impl Send for Fault {}
unsafe impl Sync for Fault {}

impl Fault {
    /// Allocates the record (zeroed: no fault) for `rank`; the context must be current.
    pub fn new(rank: usize, timeout: Duration) -> Result<Arc<Fault>> {
        let bytes = std::mem::size_of::<FaultRecord>();
        // SAFETY: a fresh allocation of `bytes`, mapped into the device's address space.
        unsafe {
            let host = drv::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP)
                .map_err(|e| cuda_err("allocating the fault record", format!("{e:?}")))?
                as *mut FaultRecord;
            host.write(FaultRecord::default());
            let mut device = 0;
            sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut _, 0)
                .result()
                .map_err(|e| cuda_err("mapping the fault record", format!("{e:?}")))?;
            Ok(Arc::new(Fault { host, device, rank, timeout }))
        }
    }

    /// The record's address for the kernels.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// The kernels' wait limit in nanoseconds.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos().min(u64::MAX as u128) as u64
    }

    /// Err once a kernel has given up waiting.
    pub fn check(&self, op: &str) -> Result<()> {
        // SAFETY: a live record; volatile because the GPU writes it behind our back.
        let f = unsafe { std::ptr::read_volatile(self.host) };
        match timeout_error(&f, op, self.rank, self.timeout) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `work`, whose `synchronize` and `wait` also report a kernel that gave up.
    pub fn checked(self: &Arc<Self>, op: &'static str, work: Work) -> Work {
        Work::from_waiter(Box::new(Checked { inner: work, fault: self.clone(), op }))
    }
}

/// The error a fault record stands for (None: no kernel gave up): code 1 a wait that timed out,
/// code 2 PEs that passed different symmetric buffers.
fn timeout_error(f: &FaultRecord, op: &str, rank: usize, timeout: Duration) -> Option<CommError> {
    if f.code == 0 {
        return None;
    }
    if f.code == 2 {
        return Some(CommError::Mismatch {
            op: op.to_string(),
            detail: format!(
                "rank {rank} and PE {} passed different symmetric buffers (another tensor, offset or length) to the \
                 same zero-copy all_reduce (launch {}, block {}); every rank must pass its copy of the same symmetric \
                 tensor. Nothing was stored into the peers' tensors; the communicator is unusable now",
                f.peer, f.epoch, f.block
            ),
        });
    }
    Some(CommError::Timeout {
        op: op.to_string(),
        me: rank,
        ranks: vec![f.peer as usize],
        timeout,
        hint: format!(
            "a collective kernel (launch {}, block {}) gave up waiting for PE {} on the GPU. Every rank must call \
             the same collectives in the same order; a rank that died or hangs leaves the others here. The \
             communicator is unusable now (its ranks are out of step); raise OXTRAIN_COMM_TIMEOUT if a rank is \
             merely slow",
            f.epoch, f.block, f.peer
        ),
    })
}

impl Drop for Fault {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; no kernel can still write it (the communicator that
        // launched them synchronised its stream before dropping its handle).
        unsafe {
            let _ = drv::free_host(self.host as *mut _);
        }
    }
}

struct Checked {
    inner: Work,
    fault: Arc<Fault>,
    op: &'static str,
}

impl WorkWaiter for Checked {
    fn wait(self: Box<Self>) -> Result<()> {
        // After: a blocking wait (barrier) has then seen its own kernel end.
        self.inner.wait()?;
        self.fault.check(self.op)
    }

    fn is_completed(&mut self) -> bool {
        self.inner.is_completed()
    }

    fn synchronize(self: Box<Self>) -> Result<()> {
        self.inner.synchronize()?;
        self.fault.check(self.op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_the_kernels_layout() {
        // struct OxFault in collectives.cu: u32, u32, u64, u32, u32.
        assert_eq!(std::mem::size_of::<FaultRecord>(), 24);
        assert_eq!(std::mem::offset_of!(FaultRecord, epoch), 8);
        assert_eq!(std::mem::offset_of!(FaultRecord, mode), 20);
    }

    #[test]
    fn a_fault_names_the_pe_waited_for_and_says_what_to_do() {
        let none = FaultRecord::default();
        assert!(timeout_error(&none, "all_reduce", 0, Duration::from_secs(2)).is_none());
        let f = FaultRecord { code: 1, peer: 3, epoch: 41, block: 7, mode: 2 };
        match timeout_error(&f, "nvshmem all_reduce", 1, Duration::from_secs(2)) {
            Some(CommError::Timeout { op, me, ranks, timeout, hint }) => {
                assert_eq!(
                    (op.as_str(), me, ranks, timeout),
                    ("nvshmem all_reduce", 1, vec![3], Duration::from_secs(2))
                );
                assert!(
                    hint.contains("launch 41, block 7") && hint.contains("OXTRAIN_COMM_TIMEOUT"),
                    "{hint}"
                );
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn a_mismatch_names_both_sides() {
        let f = FaultRecord { code: 2, peer: 0, epoch: 5, block: 3, mode: 5 };
        match timeout_error(&f, "nvshmem symmetric all_reduce", 1, Duration::from_secs(2)) {
            Some(CommError::Mismatch { op, detail }) => {
                assert_eq!(op, "nvshmem symmetric all_reduce");
                assert!(detail.contains("rank 1 and PE 0 passed different symmetric buffers"), "{detail}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
}
