//! [`SymmetricMemory`] on NVSHMEM: a region of NVSHMEM's symmetric heap (GPU memory) with
//! the one-sided operations done by the host library's stream-ordered calls
//! (`nvshmemx_putmem_on_stream`, `..._signal_on_stream`, `nvshmemx_signal_op_on_stream`, ...)
//! on a stream of the heap's own, each waited for before returning (the trait's calls are
//! synchronous). Atomics run as a one-thread kernel calling NVSHMEM's device atomics
//! (`atomics.cu`): NVSHMEM's host library does not implement host-initiated ones.
//! Signals are watched by polling this PE's word, so `wait_until` times out like every wait.

use super::host::{self, OneSided};
use super::{kernels, NvshmemCommunicator};
use crate::element::ReduceElement;
use crate::error::{CommError, Result};
use crate::gpu::cuda_err;
use crate::op::ReduceOp;
use crate::symmetric::{AtomicElement, Cmp, Signal, SignalOp, SymBuffer, SymmetricMemory};
use crate::work::Work;
use cudarc::driver::result as drv;
use oxtrain_tensor::cuda::Stream;
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A symmetric heap of NVSHMEM memory, borrowed from the communicator that initialised
/// NVSHMEM (drop it first). Make one with [`NvshmemCommunicator::symmetric_heap`].
pub struct NvshmemHeap<'c> {
    comm: &'c NvshmemCommunicator,
    ops: &'static OneSided,
    base: u64,
    size: usize,
    next: Mutex<usize>,
    stream: Stream,
    timeout: Duration,
    /// 16 bytes past the user's part of the allocation: where the atomic kernel leaves the
    /// previous value.
    scratch: u64,
}

fn sig_op(op: SignalOp) -> i32 {
    match op {
        SignalOp::Set => host::SIGNAL_SET,
        SignalOp::Add => host::SIGNAL_ADD,
    }
}

impl NvshmemCommunicator {
    /// `bytes` of symmetric GPU memory on every PE (collective: same size, same order), for
    /// one-sided communication through [`SymmetricMemory`].
    pub fn symmetric_heap(&self, bytes: usize) -> Result<NvshmemHeap<'_>> {
        let api = host::api()?;
        let ops = api.one_sided.as_ref().map_err(|e| {
            CommError::Unsupported(format!("nvshmem: this NVSHMEM lacks a one-sided host call: {e}"))
        })?;
        self.bind()?;
        let size = bytes.div_ceil(16) * 16;
        // SAFETY: collective allocation, called alike on every PE.
        let base = unsafe { (api.malloc)(size + 16) } as u64;
        if base == 0 {
            return Err(CommError::Unsupported(format!(
                "nvshmem: nvshmem_malloc({size}) failed: raise NVSHMEM_SYMMETRIC_SIZE"
            )));
        }
        let stream =
            Stream::new(self.stream.ordinal).map_err(|e| cuda_err("creating the heap's stream", e))?;
        Ok(NvshmemHeap {
            comm: self,
            ops,
            base,
            size,
            next: Mutex::new(0),
            stream,
            timeout: crate::CommOptions::default().timeout,
            scratch: base + size as u64,
        })
    }
}

impl NvshmemHeap<'_> {
    fn addr<T>(&self, b: SymBuffer<T>) -> u64 {
        let end = b.offset + b.len * std::mem::size_of::<T>();
        assert!(
            end <= self.size,
            "SymBuffer at {}..{end} is outside this heap of {} bytes",
            b.offset,
            self.size
        );
        self.base + b.offset as u64
    }

    fn raw_stream(&self) -> host::CuStream {
        self.stream.raw().cu_stream() as host::CuStream
    }

    fn sync(&self, what: &str) -> Result<()> {
        self.stream.synchronize().map_err(|e| cuda_err(format!("nvshmem {what}"), e))
    }

    /// Runs one atomic on `target` at `pe` through the device kernel; returns the old value.
    fn atomic<T: AtomicElement>(
        &self,
        target: SymBuffer<T>,
        kind: i32,
        value: T,
        expected: T,
        pe: usize,
    ) -> Result<T> {
        self.check_pe(pe);
        assert_eq!(
            target.len, 1,
            "atomics take a one-element SymBuffer (use .at(i)), got {} elements",
            target.len
        );
        let width = std::mem::size_of::<T>();
        let bits = |v: T| -> u64 {
            match width {
                4 => u64::from(bytemuck::cast::<T, u32>(v)),
                _ => bytemuck::cast::<T, u64>(v),
            }
        };
        let args = kernels::AtomicArgs {
            target: self.addr(target),
            old: self.scratch,
            value: bits(value),
            expected: bits(expected),
            pe: pe as i32,
            kind,
            width: width as i32,
            pad_: 0,
        };
        self.comm.bind()?;
        // SAFETY: target is inside this heap (addr checks), scratch is the heap's own 16 bytes,
        // the context is bound; the call is waited for before the scratch is read.
        unsafe {
            kernels::launch_atomic(self.comm.module.atomic, &args, self.stream.raw().cu_stream() as _)?
        };
        self.sync("atomic")?;
        let mut old = [T::zeroed()];
        // SAFETY: scratch holds at least `width` bytes.
        unsafe { drv::memcpy_dtoh_sync(&mut old, self.scratch) }
            .map_err(|e| cuda_err("reading an atomic's old value", format!("{e:?}")))?;
        Ok(old[0])
    }

    /// All-reduces `buf` in place over every PE, with no staging copy: the kernel reads every
    /// PE's copy and writes the result into every copy over NVLink (`symmetric.cu`). This is
    /// the fastest all-reduce of the backend for large messages; keep buffers that are reduced
    /// every step (gradient buckets) on the heap to use it. Collective: every PE calls it with
    /// the same buffer. Like the [`Communicator`](crate::Communicator) ops, it is ordered after
    /// the caller's current stream and returns at once; wait on the [`Work`] before reading the
    /// buffer (`Work::synchronize` before `read_local`, which does not wait for streams).
    /// Needs every PE on this node (reachable by load/store). Two kernels: two-shot pushes whose
    /// results land straight in the peers' copies (whole 16-byte packs), or one pass that loads
    /// the peers' copies; see `symmetric_pushes` in options.rs for the choice.
    pub fn all_reduce<T: ReduceElement>(&self, buf: SymBuffer<T>, op: ReduceOp) -> Result<Work> {
        let f = self.comm.function("symmetric all_reduce", <T as crate::CommElement>::DTYPE, true)?;
        self.comm.symmetric_all_reduce(f, self.addr(buf), buf.len, std::mem::size_of::<T>(), op)
    }

    fn check_pe(&self, pe: usize) {
        assert!(pe < self.comm.world, "PE {pe} is out of range for {} PEs", self.comm.world);
    }
}

impl Drop for NvshmemHeap<'_> {
    fn drop(&mut self) {
        let Ok(api) = host::api() else { return };
        let _ = self.stream.synchronize();
        // SAFETY: collective free of the heap allocated in `symmetric_heap`.
        unsafe {
            (api.barrier_all)();
            (api.free)(self.base as *mut c_void);
        }
    }
}

impl SymmetricMemory for NvshmemHeap<'_> {
    fn rank(&self) -> usize {
        self.comm.rank
    }
    fn world_size(&self) -> usize {
        self.comm.world
    }

    fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<SymBuffer<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let offset = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let offset = next.div_ceil(16) * 16;
            if offset + bytes > self.size {
                return Err(CommError::Unsupported(format!(
                    "nvshmem heap: {bytes} more bytes do not fit ({offset} of {} used); make a larger heap",
                    self.size
                )));
            }
            *next = offset + bytes;
            offset
        };
        let buf = SymBuffer::new(offset, len);
        self.comm.bind()?;
        // Zeroed everywhere before any PE can write into it.
        unsafe {
            drv::memset_d8_sync(self.addr(buf), 0, bytes)
                .map_err(|e| cuda_err("zeroing a heap buffer", format!("{e:?}")))?;
        }
        self.barrier_all()?;
        Ok(buf)
    }

    fn write_local<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: &[T]) -> Result<()> {
        assert_eq!(src.len(), dst.len, "write_local: {} elements into a buffer of {}", src.len(), dst.len);
        self.comm.bind()?;
        // SAFETY: the range is inside the heap (checked by addr).
        unsafe { drv::memcpy_htod_sync(self.addr(dst), src) }
            .map_err(|e| cuda_err("write_local", format!("{e:?}")))
    }

    fn read_local<T: bytemuck::Pod>(&self, src: SymBuffer<T>, dst: &mut [T]) -> Result<()> {
        assert_eq!(dst.len(), src.len, "read_local: a buffer of {} elements into {}", src.len, dst.len());
        self.comm.bind()?;
        // SAFETY: as write_local.
        unsafe { drv::memcpy_dtoh_sync(dst, self.addr(src)) }
            .map_err(|e| cuda_err("read_local", format!("{e:?}")))
    }

    fn put<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()> {
        assert_eq!(dst.len, src.len, "put: lengths differ ({} and {})", dst.len, src.len);
        self.check_pe(pe);
        self.comm.bind()?;
        let bytes = src.len * std::mem::size_of::<T>();
        // SAFETY: symmetric addresses inside the heap; waited for before returning.
        unsafe {
            (self.ops.putmem_on_stream)(
                self.addr(dst) as *mut c_void,
                self.addr(src) as *const c_void,
                bytes,
                pe as i32,
                self.raw_stream(),
            )
        };
        self.sync("put")
    }

    fn get<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()> {
        assert_eq!(dst.len, src.len, "get: lengths differ ({} and {})", dst.len, src.len);
        self.check_pe(pe);
        self.comm.bind()?;
        let bytes = src.len * std::mem::size_of::<T>();
        // SAFETY: as put.
        unsafe {
            (self.ops.getmem_on_stream)(
                self.addr(dst) as *mut c_void,
                self.addr(src) as *const c_void,
                bytes,
                pe as i32,
                self.raw_stream(),
            )
        };
        self.sync("get")
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
        assert_eq!(dst.len, src.len, "put_with_signal: lengths differ ({} and {})", dst.len, src.len);
        self.check_pe(pe);
        self.comm.bind()?;
        let bytes = src.len * std::mem::size_of::<T>();
        // SAFETY: as put; the signal word is a symmetric u64 of this heap.
        unsafe {
            (self.ops.putmem_signal_on_stream)(
                self.addr(dst) as *mut c_void,
                self.addr(src) as *const c_void,
                bytes,
                self.addr(signal) as *mut u64,
                value,
                sig_op(op),
                pe as i32,
                self.raw_stream(),
            )
        };
        self.sync("put_with_signal")
    }

    fn signal(&self, signal: Signal, op: SignalOp, value: u64, pe: usize) -> Result<()> {
        self.check_pe(pe);
        self.comm.bind()?;
        // SAFETY: a symmetric u64 of this heap.
        unsafe {
            (self.ops.signal_op_on_stream)(
                self.addr(signal) as *mut u64,
                value,
                sig_op(op),
                pe as i32,
                self.raw_stream(),
            )
        };
        self.sync("signal")
    }

    fn signal_fetch(&self, signal: Signal) -> u64 {
        let mut v = [0u64];
        let _ = self.comm.bind();
        // SAFETY: one u64 inside the heap.
        let _ = unsafe { drv::memcpy_dtoh_sync(&mut v, self.addr(signal)) };
        v[0]
    }

    fn wait_until(&self, signal: Signal, cmp: Cmp, value: u64) -> Result<u64> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let v = self.signal_fetch(signal);
            if cmp.holds(v, value) {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    op: format!("wait_until(signal {cmp:?} {value}, last seen {v})"),
                    me: self.comm.rank,
                    ranks: (0..self.comm.world).filter(|&r| r != self.comm.rank).collect(),
                    timeout: self.timeout,
                    hint: "no peer raised the signal (not started, crashed, or a mismatched protocol)".into(),
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn fence(&self) {
        // Every put has completed when its call returns, so order already holds.
    }

    fn quiet(&self) -> Result<()> {
        self.comm.bind()?;
        // SAFETY: a live stream.
        unsafe { (self.ops.quiet_on_stream)(self.raw_stream()) };
        self.sync("quiet")
    }

    fn atomic_fetch_add<T: AtomicElement>(&self, target: SymBuffer<T>, value: T, pe: usize) -> Result<T> {
        self.atomic(target, kernels::ATOMIC_FETCH_ADD, value, T::zeroed(), pe)
    }

    fn atomic_compare_swap<T: AtomicElement>(
        &self,
        target: SymBuffer<T>,
        expected: T,
        desired: T,
        pe: usize,
    ) -> Result<T> {
        self.atomic(target, kernels::ATOMIC_COMPARE_SWAP, desired, expected, pe)
    }

    fn barrier_all(&self) -> Result<()> {
        self.sync("barrier_all")?;
        let api = host::api()?;
        self.comm.bind()?;
        // SAFETY: collective, called alike on every PE.
        unsafe { (api.barrier_all)() };
        Ok(())
    }
}
