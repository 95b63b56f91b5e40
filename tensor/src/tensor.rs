//! The `Tensor` type: shared storage seen through a layout.

use crate::cell::StorageCell;
use crate::dtype::{DType, Element};
use crate::layout::Layout;
use crate::shape::{Dim, Shape};
use crate::storage::{CpuStorage, Storage};
use crate::{Device, Error, Result};
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

/// An n-dimensional array on a device.
///
/// Cloning is cheap: clones and views (reshape, permute, narrow, expand, ...) share storage
/// through an `Arc` and differ only in their [`Layout`].
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<StorageCell>,
    layout: Layout,
    dtype: DType,
    device: Device,
}

impl Tensor {
    /// A tensor over the whole of `storage`, row-major with `shape`.
    pub(crate) fn from_storage(storage: Storage, shape: impl Into<Shape>) -> Tensor {
        let layout = Layout::contiguous(shape);
        debug_assert_eq!(layout.elem_count(), storage.len());
        Tensor {
            dtype: storage.dtype(),
            device: storage.device(),
            storage: Arc::new(StorageCell::new(storage)),
            layout,
        }
    }

    /// A contiguous tensor over CUDA memory that oxtrain did not allocate, as `torch.from_blob`
    /// (a communication library's symmetric heap, another framework's buffer). `owner` is
    /// kept alive as long as any tensor or view shares the storage, and dropped after.
    ///
    /// # Safety
    /// `ptr` holds `shape`'s element count of `dtype` on GPU `ordinal`, valid for reads and
    /// writes as long as `owner` lives.
    pub unsafe fn from_cuda_blob(
        ptr: u64,
        dtype: DType,
        shape: impl Into<Shape>,
        ordinal: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let dev = crate::cuda::device(ordinal)?;
        let s = crate::cuda::CudaStorage::from_external(&dev, ptr, dtype, shape.elem_count(), owner);
        Ok(Tensor::from_storage(Storage::Cuda(s), shape))
    }

    pub(crate) fn from_cpu(storage: CpuStorage, shape: impl Into<Shape>) -> Tensor {
        Tensor::from_storage(Storage::Cpu(storage), shape)
    }

    /// The same storage seen through another layout: how every view op is made.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        debug_assert!(layout.storage_extent() <= self.storage().len());
        Tensor { storage: self.storage.clone(), layout, dtype: self.dtype, device: self.device }
    }

    /// Moves host data onto `device`.
    pub(crate) fn from_cpu_on(
        storage: CpuStorage,
        shape: impl Into<Shape>,
        device: Device,
    ) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::from_cpu(storage, shape)),
            Device::Cuda(ordinal) => {
                let dev = crate::cuda::device(ordinal)?;
                let s = crate::cuda::CudaStorage::from_cpu(&storage, &dev)?;
                Ok(Tensor::from_storage(Storage::Cuda(s), shape))
            }
        }
    }

    /// A tensor that takes ownership of `data`, viewed with `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != data.len() {
            let expected = shape.elem_count();
            return Err(Error::ElementCount { shape: shape.into_vec(), expected, got: data.len() });
        }
        Tensor::from_cpu_on(T::into_storage(data), shape, device)
    }

    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// A tensor from a scalar or (nested) array, shape inferred: `Tensor::new([[1f32, 2.], [3., 4.]], Device::Cpu)`.
    pub fn new<D: TensorData>(data: D, device: Device) -> Result<Tensor> {
        let (values, shape) = data.flatten();
        Tensor::from_vec(values, shape, device)
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Element>(value: T, device: Device) -> Result<Tensor> {
        Tensor::from_vec(vec![value], (), device)
    }

    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }

    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }

    /// The size of one dim (negative counts from the back), as `tensor.size(d)`.
    pub fn dim<D: Dim>(&self, d: D) -> usize {
        self.dims()[d.to_index(self.rank(), "dim")]
    }

    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    pub fn elem_count(&self) -> usize {
        self.layout.elem_count()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Whether two tensors share storage (views of one another).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// An identity of this tensor's storage, equal for tensors that share it.
    pub(crate) fn storage_key(&self) -> usize {
        Arc::as_ptr(&self.storage) as usize
    }

    /// Read access to the storage. Kernels hold it only for the duration of one op.
    pub fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        self.storage.read()
    }

    /// Write access, for in-place ops; the caller must respect the layout. Counts as a write:
    /// it bumps the storage's [`version`](Tensor::version).
    pub fn storage_mut(&self) -> RwLockWriteGuard<'_, Storage> {
        self.storage.write().0
    }

    /// [`storage_mut`](Tensor::storage_mut) and the version this write gave the storage.
    pub(crate) fn storage_mut_versioned(&self) -> (RwLockWriteGuard<'_, Storage>, u64) {
        self.storage.write()
    }

    /// The cell shared by every tensor over this storage (its version and kept casts).
    pub(crate) fn cell(&self) -> &StorageCell {
        &self.storage
    }

    /// Number of tensors and views sharing this storage (for memory tests).
    pub fn storage_ref_count(&self) -> usize {
        Arc::strong_count(&self.storage)
    }

    /// Runs `f` on the CPU storage and this layout; panics naming `op` on another device.
    pub(crate) fn with_cpu<R>(&self, op: &str, f: impl FnOnce(&CpuStorage, &Layout) -> R) -> R {
        match &*self.storage() {
            Storage::Cpu(s) => f(s, &self.layout),
            Storage::Cuda(_) => panic!("{op}: not implemented on {} yet", self.device),
        }
    }

    /// The elements in row-major order as a flat vector (copied).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        assert!(
            T::DTYPE == self.dtype,
            "to_vec::<{:?}>: the tensor has dtype {}, convert it with .to_dtype() first",
            T::DTYPE,
            self.dtype
        );
        if self.device.is_cuda() {
            return self.to_host("to_vec").to_vec();
        }
        // Counted here, on the host copy's read, so a device tensor counts once.
        count_host_read();
        self.with_cpu("to_vec", |s, l| crate::strided::map(s.as_slice::<T>(), l, |x| x))
    }

    /// The elements of any dtype, converted to f64 (handy in tests and metrics).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        if self.device.is_cuda() {
            return self.to_host("to_f64_vec").to_f64_vec();
        }
        count_host_read();
        self.with_cpu(
            "to_f64_vec",
            |s, l| with_cpu_storage!(s, v, T => crate::strided::map(v, l, |x: T| x.to_f64())),
        )
    }

    /// [`Tensor::to_f64_vec`] for a CPU kernel's own operands: a copy inside the backend, not
    /// a read the program makes, so [`host_reads`] does not count it.
    pub(crate) fn kernel_f64_values(&self) -> Vec<f64> {
        if self.device.is_cuda() {
            return self.to_f64_vec();
        }
        self.with_cpu(
            "to_f64_vec",
            |s, l| with_cpu_storage!(s, v, T => crate::strided::map(v, l, |x: T| x.to_f64())),
        )
    }

    /// A rank-1 tensor's elements.
    pub fn to_vec1<T: Element>(&self) -> Vec<T> {
        assert_eq!(self.rank(), 1, "to_vec1: expected rank 1, the tensor has shape {:?}", self.dims());
        self.to_vec()
    }

    /// A rank-2 tensor's rows.
    pub fn to_vec2<T: Element>(&self) -> Vec<Vec<T>> {
        assert_eq!(self.rank(), 2, "to_vec2: expected rank 2, the tensor has shape {:?}", self.dims());
        let cols = self.dims()[1];
        let flat = self.to_vec();
        if cols == 0 {
            return vec![vec![]; self.dims()[0]];
        }
        flat.chunks(cols).map(|c| c.to_vec()).collect()
    }

    /// The single element of a one-element tensor, as `tensor.item()`.
    pub fn to_scalar<T: Element>(&self) -> T {
        assert_eq!(
            self.elem_count(),
            1,
            "to_scalar: the tensor has shape {:?}, not one element",
            self.dims()
        );
        self.to_vec::<T>()[0]
    }

    /// The single element as f64, whatever the dtype.
    pub fn item(&self) -> f64 {
        assert_eq!(self.elem_count(), 1, "item: the tensor has shape {:?}, not one element", self.dims());
        self.to_f64_vec()[0]
    }

    /// This tensor when it is already row-major and gap-free, else a row-major copy.
    pub fn contiguous(&self) -> Tensor {
        if self.is_contiguous() && self.layout.offset() == 0 && self.storage().len() == self.elem_count() {
            return self.clone();
        }
        self.copy()
    }

    /// A row-major copy with its own storage, as `tensor.clone()` in PyTorch.
    pub fn copy(&self) -> Tensor {
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(
                with_cpu_storage!(s, v, T => T::into_storage(crate::strided::map(v, &self.layout, |x| x))),
            ),
            Storage::Cuda(s) => Storage::Cuda(crate::ops::convert::cuda::copy(s, &self.layout)),
        };
        Tensor::from_storage(storage, self.dims())
    }

    /// The tensor on `device` (a cheap clone when already there).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device {
            return Ok(self.clone());
        }
        let src = self.contiguous();
        let host = match &*src.storage() {
            Storage::Cpu(s) => s.clone(),
            // Between two GPUs this goes through the host for now; peer copies come with comm.
            Storage::Cuda(s) => s.to_cpu()?,
        };
        Tensor::from_cpu_on(host, self.dims(), device)
    }

    /// A host copy for reading values; panics naming `op` when the device fails.
    fn to_host(&self, op: &str) -> Tensor {
        self.to_device(Device::Cpu).unwrap_or_else(|e| panic!("{op}: copying to the host failed: {e}"))
    }

    /// Panics naming `op` unless `other` is on this tensor's device.
    pub(crate) fn same_device(&self, other: &Tensor, op: &str) {
        assert!(
            self.device == other.device,
            "{op}: tensors are on different devices ({} and {}); move one with .to_device()",
            self.device,
            other.device
        );
    }

    /// Panics naming `op` unless `other` has this tensor's dtype.
    pub(crate) fn same_dtype(&self, other: &Tensor, op: &str) {
        assert!(
            self.dtype == other.dtype,
            "{op}: dtypes differ ({} with shape {:?} and {} with shape {:?}); convert one with .to_dtype()",
            self.dtype,
            self.dims(),
            other.dtype,
            other.dims()
        );
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor[{:?}, {}, {}]", self.dims(), self.dtype, self.device)?;
        if self.elem_count() <= 16 {
            write!(f, " {:?}", self.to_f64_vec())?;
        }
        Ok(())
    }
}

/// Rust values a tensor can be built from: scalars and nested arrays, slices and vectors.
pub trait TensorData {
    type Elem: Element;
    fn flatten(self) -> (Vec<Self::Elem>, Vec<usize>);
}

impl<T: Element> TensorData for T {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        (vec![self], vec![])
    }
}
impl<T: Element> TensorData for Vec<T> {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        let n = self.len();
        (self, vec![n])
    }
}
impl<T: Element> TensorData for &[T] {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        (self.to_vec(), vec![self.len()])
    }
}
impl<T: Element, const N: usize> TensorData for [T; N] {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        (self.to_vec(), vec![N])
    }
}
impl<T: Element, const N: usize, const M: usize> TensorData for [[T; N]; M] {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        (self.iter().flatten().copied().collect(), vec![M, N])
    }
}
impl<T: Element, const N: usize, const M: usize, const L: usize> TensorData for [[[T; N]; M]; L] {
    type Elem = T;
    fn flatten(self) -> (Vec<T>, Vec<usize>) {
        (self.iter().flatten().flatten().copied().collect(), vec![L, M, N])
    }
}

thread_local! {
    static HOST_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_host_read() {
    HOST_READS.with(|n| n.set(n.get() + 1));
}

/// Reads of tensor values into host memory (`to_vec`, `to_f64_vec`, `item`, ...) made on this
/// thread so far, on any device. On a GPU each one waits for the work queued before it, so a
/// training loop that should queue steps ahead counts them: on the CPU as on the GPU, where
/// [`crate::cuda::host_waits`] counts the waits themselves.
pub fn host_reads() -> u64 {
    HOST_READS.with(|n| n.get())
}
