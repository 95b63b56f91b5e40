//! One-sided communication (PGAS) on a symmetric heap, in the manner of OpenSHMEM/NVSHMEM.
//!
//! Every rank ("PE") allocates the same buffers in the same order, so a [`SymBuffer`] names
//! the same offset on every PE: `put` writes into a peer's copy, `get` reads it, a signal
//! word tells the peer that data has landed. One generic API over any `bytemuck::Pod`
//! element; a backend implements [`SymmetricMemory`] (shm and local here; NVSHMEM, whose
//! buffers live in GPU memory, fits the same trait).

use crate::error::Result;
use oxtrain_tensor::{Element, Tensor};
use std::marker::PhantomData;
use std::ops::Range;

/// A typed buffer at the same place on every PE. Cheap to copy; valid as long as the heap.
#[derive(Debug)]
pub struct SymBuffer<T> {
    pub(crate) offset: usize,
    pub(crate) len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for SymBuffer<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SymBuffer<T> {}

impl<T> SymBuffer<T> {
    pub(crate) fn new(offset: usize, len: usize) -> SymBuffer<T> {
        SymBuffer { offset, len, _t: PhantomData }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte offset in the heap (the same on every PE).
    pub fn offset_bytes(&self) -> usize {
        self.offset
    }

    /// A part of the buffer; panics when out of range.
    pub fn slice(&self, range: Range<usize>) -> SymBuffer<T> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "SymBuffer::slice: range {range:?} out of bounds for a buffer of {} elements",
            self.len
        );
        SymBuffer::new(self.offset + range.start * std::mem::size_of::<T>(), range.len())
    }

    /// The same bytes seen as elements of `U` (as `Tensor.view(dtype)`); panics when the
    /// byte length is not a whole number of `U`s or the offset is not aligned for `U`.
    pub fn cast<U>(&self) -> SymBuffer<U> {
        let (bytes, size) = (self.len * std::mem::size_of::<T>(), std::mem::size_of::<U>().max(1));
        assert!(
            bytes.is_multiple_of(size) && self.offset.is_multiple_of(std::mem::align_of::<U>()),
            "SymBuffer::cast: {bytes} bytes at offset {} are not a whole, aligned number of {size}-byte elements",
            self.offset
        );
        SymBuffer::new(self.offset, bytes / size)
    }

    /// One element, as the target of an atomic or a signal.
    pub fn at(&self, index: usize) -> SymBuffer<T> {
        self.slice(index..index + 1)
    }
}

/// A signal word: a `u64` on the symmetric heap that `put_with_signal` updates and
/// `wait_until` watches.
pub type Signal = SymBuffer<u64>;

/// How `put_with_signal` updates the signal (`NVSHMEM_SIGNAL_SET` / `NVSHMEM_SIGNAL_ADD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    Set,
    Add,
}

/// The comparison of `wait_until` (`NVSHMEM_CMP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl Cmp {
    pub fn holds(self, value: u64, target: u64) -> bool {
        match self {
            Cmp::Eq => value == target,
            Cmp::Ne => value != target,
            Cmp::Gt => value > target,
            Cmp::Ge => value >= target,
            Cmp::Lt => value < target,
            Cmp::Le => value <= target,
        }
    }
}

/// Integer elements with hardware atomics on the heap.
pub trait AtomicElement: bytemuck::Pod + Send + Sync + std::fmt::Debug {
    /// # Safety
    /// `ptr` must be valid, aligned and only accessed atomically by others.
    unsafe fn fetch_add(ptr: *mut Self, value: Self) -> Self;
    /// Returns the previous value; the swap happened when it equals `expected`.
    /// # Safety
    /// As for `fetch_add`.
    unsafe fn compare_swap(ptr: *mut Self, expected: Self, desired: Self) -> Self;
}

macro_rules! atomic_element {
    ($($t:ty => $a:ty),*) => {$(
        impl AtomicElement for $t {
            unsafe fn fetch_add(ptr: *mut Self, value: Self) -> Self {
                <$a>::from_ptr(ptr).fetch_add(value, std::sync::atomic::Ordering::AcqRel)
            }
            unsafe fn compare_swap(ptr: *mut Self, expected: Self, desired: Self) -> Self {
                match <$a>::from_ptr(ptr).compare_exchange(expected, desired, std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    )*};
}
atomic_element!(u32 => std::sync::atomic::AtomicU32, u64 => std::sync::atomic::AtomicU64, i32 => std::sync::atomic::AtomicI32, i64 => std::sync::atomic::AtomicI64);

/// A symmetric heap and the one-sided operations on it.
///
/// Ordering: puts from one PE to another are ordered before a later signal update from the
/// same PE (`put_with_signal` is the usual way to publish data); `fence` orders puts to
/// each PE, `quiet` waits until all of this PE's puts are complete and visible.
pub trait SymmetricMemory: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// Allocates `len` elements on every PE. Collective: every PE calls it in the same order
    /// with the same length (checked where the backend can). Zero-initialised.
    fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<SymBuffer<T>>;

    /// `n` signal words, all zero.
    fn alloc_signals(&self, n: usize) -> Result<SymBuffer<u64>> {
        self.alloc::<u64>(n)
    }

    /// Copies host data into this PE's copy of `dst`.
    fn write_local<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: &[T]) -> Result<()>;
    /// Copies this PE's copy of `src` out to host memory.
    fn read_local<T: bytemuck::Pod>(&self, src: SymBuffer<T>, dst: &mut [T]) -> Result<()>;

    /// Writes this PE's `src` into PE `pe`'s `dst` (same length).
    fn put<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()>;
    /// Reads PE `pe`'s `src` into this PE's `dst`.
    fn get<T: bytemuck::Pod>(&self, dst: SymBuffer<T>, src: SymBuffer<T>, pe: usize) -> Result<()>;
    /// `put`, then updates PE `pe`'s `signal` once the data is visible there.
    fn put_with_signal<T: bytemuck::Pod>(
        &self,
        dst: SymBuffer<T>,
        src: SymBuffer<T>,
        signal: Signal,
        op: SignalOp,
        value: u64,
        pe: usize,
    ) -> Result<()>;
    /// Sets or adds to PE `pe`'s signal word without data.
    fn signal(&self, signal: Signal, op: SignalOp, value: u64, pe: usize) -> Result<()>;
    /// This PE's current value of a signal word.
    fn signal_fetch(&self, signal: Signal) -> u64;
    /// Waits until this PE's `signal` compares true against `value` and returns its value;
    /// times out (naming dead peers first) like every wait.
    fn wait_until(&self, signal: Signal, cmp: Cmp, value: u64) -> Result<u64>;

    /// Orders this PE's puts to each PE.
    fn fence(&self);
    /// Waits until this PE's puts are complete.
    fn quiet(&self) -> Result<()>;

    /// Atomically adds `value` to PE `pe`'s element `target` (one element) and returns its old value.
    fn atomic_fetch_add<T: AtomicElement>(&self, target: SymBuffer<T>, value: T, pe: usize) -> Result<T>;
    /// Atomically replaces PE `pe`'s `target` by `desired` if it equals `expected`; returns
    /// the old value.
    fn atomic_compare_swap<T: AtomicElement>(
        &self,
        target: SymBuffer<T>,
        expected: T,
        desired: T,
        pe: usize,
    ) -> Result<T>;

    /// Waits until every PE has reached this barrier, with `quiet` semantics.
    fn barrier_all(&self) -> Result<()>;

    /// A symmetric buffer holding the elements of `t` on this PE (collective, like `alloc`).
    fn alloc_tensor<T: bytemuck::Pod + Element>(&self, t: &Tensor) -> Result<SymBuffer<T>> {
        let buf = self.alloc::<T>(t.elem_count())?;
        self.write_local(buf, &t.to_vec::<T>())?;
        Ok(buf)
    }

    /// This PE's copy of `buf` as a CPU tensor of `shape`.
    fn to_tensor<T: bytemuck::Pod + Element>(&self, buf: SymBuffer<T>, shape: &[usize]) -> Result<Tensor> {
        let mut v = vec![T::zero(); buf.len()];
        self.read_local(buf, &mut v)?;
        Tensor::from_vec(v, shape.to_vec(), oxtrain_tensor::Device::Cpu)
            .map_err(|e| crate::CommError::Unsupported(format!("to_tensor: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::SymBuffer;

    #[test]
    fn cast_keeps_the_bytes_and_slices_stay_in_place() {
        let bytes = SymBuffer::<u8>::new(64, 48);
        let f = bytes.cast::<f32>();
        assert_eq!((f.offset_bytes(), f.len()), (64, 12));
        let h = f.slice(2..6).cast::<u16>();
        assert_eq!((h.offset_bytes(), h.len()), (72, 8));
    }

    #[test]
    #[should_panic(expected = "not a whole, aligned number")]
    fn cast_refuses_a_partial_element() {
        let _ = SymBuffer::<u8>::new(0, 6).cast::<f32>();
    }

    #[test]
    #[should_panic(expected = "not a whole, aligned number")]
    fn cast_refuses_a_misaligned_offset() {
        let _ = SymBuffer::<u8>::new(2, 8).cast::<f32>();
    }
}
