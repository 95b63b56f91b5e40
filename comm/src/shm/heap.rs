//! The symmetric heap of the shm and local backends: each PE's part of the segment, which
//! every other PE of the host can read and write directly.

use super::segment::{futex_wake, publish, wait_word, Attachment, Segment, WaitFor};
use crate::error::{CommError, Result};
use crate::symmetric::{AtomicElement, Cmp, Signal, SignalOp, SymBuffer, SymmetricMemory};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Buffers start on cache-line boundaries so that signals of different buffers do not share
/// a line.
const ALIGN: usize = 64;

/// One PE's handle on the heap shared by the ranks of a [`crate::shm::ShmWorld`].
pub struct ShmHeap {
    seg: Arc<Segment>,
    _attached: Arc<Attachment>,
    rank: usize,
    world: usize,
    next: Mutex<usize>,
    phase: Mutex<u64>,
    timeout: Duration,
    peers: Vec<usize>,
}

impl ShmHeap {
    pub(crate) fn new(attached: Arc<Attachment>, timeout: Duration) -> ShmHeap {
        let (seg, rank) = (attached.seg.clone(), attached.rank);
        let world = seg.layout.world;
        let phase = seg.slot(rank).heap_phase.load(Ordering::Acquire);
        let peers = (0..world).filter(|&r| r != rank).collect();
        ShmHeap {
            seg,
            _attached: attached,
            rank,
            world,
            next: Mutex::new(0),
            phase: Mutex::new(phase),
            timeout,
            peers,
        }
    }

    /// Bytes of heap per PE.
    pub fn capacity_bytes(&self) -> usize {
        self.seg.layout.heap_bytes
    }

    fn ptr<T>(&self, buf: SymBuffer<T>, pe: usize) -> *mut T {
        assert!(pe < self.world, "symmetric heap: PE {pe} out of range for {} PEs", self.world);
        // SAFETY: `alloc` only hands out buffers inside the heap.
        unsafe { self.seg.heap(pe).add(buf.offset) as *mut T }
    }

    fn signal_word(&self, signal: Signal, pe: usize) -> &AtomicU64 {
        assert_eq!(signal.len, 1, "a signal is one u64 element; use buffer.at(i)");
        // SAFETY: aligned u64 inside the heap, only accessed atomically as a signal.
        unsafe { AtomicU64::from_ptr(self.ptr(signal, pe)) }
    }

    fn update_signal(&self, signal: Signal, op: SignalOp, value: u64, pe: usize) {
        let word = self.signal_word(signal, pe);
        match op {
            SignalOp::Set => word.store(value, Ordering::SeqCst),
            SignalOp::Add => {
                word.fetch_add(value, Ordering::SeqCst);
            }
        }
        if self.seg.slot(pe).signal_waiters.load(Ordering::SeqCst) > 0 {
            futex_wake(word);
        }
    }

    fn check_len<T>(&self, op: &str, a: &SymBuffer<T>, b: usize) {
        assert_eq!(a.len, b, "{op}: lengths differ ({} and {b} elements)", a.len);
    }
}

impl SymmetricMemory for ShmHeap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }

    fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<SymBuffer<T>> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let offset = next.div_ceil(ALIGN) * ALIGN;
        let bytes = len * std::mem::size_of::<T>();
        let cap = self.seg.layout.heap_bytes;
        if offset + bytes > cap {
            return Err(CommError::Unsupported(format!(
                "symmetric heap: {bytes} more bytes do not fit in the {cap} bytes per PE ({offset} used); \
                 raise OXTRAIN_SHM_HEAP_BYTES or ShmOptions::heap_bytes"
            )));
        }
        *next = offset + bytes;
        Ok(SymBuffer::new(offset, len))
    }

    fn write_local<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: &[T]) -> Result<()> {
        self.check_len("write_local", &dst, src.len());
        // SAFETY: in bounds; peers synchronise through signals before reading.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr(dst, self.rank), src.len()) };
        Ok(())
    }

    fn read_local<T: bytemuck::Pod>(&self, src: SymBuffer<T>, dst: &mut [T]) -> Result<()> {
        self.check_len("read_local", &src, dst.len());
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(src, self.rank), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn put<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()> {
        self.check_len("put", &dst, src.len);
        // `copy` (memmove): src and dst may overlap when a PE puts to itself.
        unsafe { std::ptr::copy(self.ptr(src, self.rank), self.ptr(dst, pe), src.len) };
        Ok(())
    }

    fn get<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()> {
        self.check_len("get", &dst, src.len);
        unsafe { std::ptr::copy(self.ptr(src, pe), self.ptr(dst, self.rank), src.len) };
        fence(Ordering::Acquire);
        Ok(())
    }

    fn put_with_signal<T: bytemuck::Pod>(
        &self,
        dst: SymBuffer<T>,
        src: SymBuffer<T>,
        signal: Signal,
        op: SignalOp,
        value: u64,
        pe: usize,
    ) -> Result<()> {
        self.put(dst, src, pe)?;
        // The SeqCst signal update releases the data written above.
        self.update_signal(signal, op, value, pe);
        Ok(())
    }

    fn signal(&self, signal: Signal, op: SignalOp, value: u64, pe: usize) -> Result<()> {
        self.update_signal(signal, op, value, pe);
        Ok(())
    }

    fn signal_fetch(&self, signal: Signal) -> u64 {
        self.signal_word(signal, self.rank).load(Ordering::Acquire)
    }

    fn wait_until(&self, signal: Signal, cmp: Cmp, value: u64) -> Result<u64> {
        let word = self.signal_word(signal, self.rank);
        let op =
            format!("wait_until(signal at byte {}, {cmp:?} {value}) on {}", signal.offset, self.seg.backend);
        let w = WaitFor { op: &op, me: self.rank, peers: &self.peers, timeout: self.timeout };
        let waiters = &self.seg.slot(self.rank).signal_waiters;
        // Any peer could be the one to signal, so the timeout names them all.
        wait_word(&self.seg, word, waiters, |v| cmp.holds(v, value), &w, || self.peers.clone())
    }

    fn fence(&self) {
        fence(Ordering::SeqCst);
    }

    fn quiet(&self) -> Result<()> {
        // Puts are synchronous stores; making them globally visible is all that is left.
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn atomic_fetch_add<T: AtomicElement>(&self, target: SymBuffer<T>, value: T, pe: usize) -> Result<T> {
        assert_eq!(target.len, 1, "atomic_fetch_add: the target is one element; use buffer.at(i)");
        Ok(unsafe { T::fetch_add(self.ptr(target, pe), value) })
    }

    fn atomic_compare_swap<T: AtomicElement>(
        &self,
        target: SymBuffer<T>,
        expected: T,
        desired: T,
        pe: usize,
    ) -> Result<T> {
        assert_eq!(target.len, 1, "atomic_compare_swap: the target is one element; use buffer.at(i)");
        Ok(unsafe { T::compare_swap(self.ptr(target, pe), expected, desired) })
    }

    fn barrier_all(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *phase += 1;
        let target = *phase;
        let me = self.seg.slot(self.rank);
        publish(&me.heap_phase, &me.heap_waiters, target);
        let op = format!("barrier_all (symmetric heap on {})", self.seg.backend);
        for &r in &self.peers {
            let slot = self.seg.slot(r);
            let w =
                WaitFor { op: &op, me: self.rank, peers: std::slice::from_ref(&r), timeout: self.timeout };
            wait_word(&self.seg, &slot.heap_phase, &slot.heap_waiters, |v| v >= target, &w, || vec![r])?;
        }
        Ok(())
    }
}
