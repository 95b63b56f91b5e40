//! Device memory holding one tensor's elements, and the strided-layout argument kernels take.

use super::alloc::CudaBuffer;
use super::device::CudaDevice;
use super::host_waits::Wait;
use super::stream::current_raw;
use crate::storage::CpuStorage;
use crate::{DType, Error, Layout, Result};
use cudarc::driver::{result as drv, CudaStream, DeviceRepr};
use std::sync::Arc;

/// Elements of one dtype in device memory.
pub struct CudaStorage {
    buf: CudaBuffer,
    dtype: DType,
    len: usize,
    device: Arc<CudaDevice>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStorage({} x {}, cuda:{})", self.len, self.dtype, self.device.ordinal())
    }
}

fn drv_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Msg(format!("{what}: {e:?}"))
}

impl CudaStorage {
    /// Uninitialised room for `len` elements, allocated for the current stream.
    pub fn alloc(device: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let stream = current_raw(device);
        let buf = device.allocator().alloc(len * dtype.size_in_bytes(), stream.cu_stream() as usize)?;
        Ok(CudaStorage { buf, dtype, len, device: device.clone() })
    }

    /// Storage over device memory that oxtrain did not allocate (see [`CudaBuffer::external`]).
    ///
    /// # Safety
    /// As [`CudaBuffer::external`]: `ptr` holds `len` elements of `dtype` on `device`, valid as
    /// long as `owner` lives.
    pub unsafe fn from_external(
        device: &Arc<CudaDevice>,
        ptr: u64,
        dtype: DType,
        len: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> CudaStorage {
        let buf = CudaBuffer::external(ptr, len * dtype.size_in_bytes(), owner);
        CudaStorage { buf, dtype, len, device: device.clone() }
    }

    /// `len` zero elements (all-zero bits is zero for every dtype).
    pub fn zeros(device: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let s = CudaStorage::alloc(device, dtype, len)?;
        let stream = s.stream();
        // SAFETY: the block holds at least `bytes` bytes and belongs to `s`.
        unsafe { drv::memset_d8_async(s.ptr(), 0, s.bytes(), stream.cu_stream()) }
            .map_err(|e| drv_err("cuMemsetD8Async", e))?;
        Ok(s)
    }

    /// A copy of host data on `device`.
    pub fn from_cpu(cpu: &CpuStorage, device: &Arc<CudaDevice>) -> Result<CudaStorage> {
        let s = CudaStorage::alloc(device, cpu.dtype(), cpu.len())?;
        let stream = s.stream();
        // SAFETY: sizes match; the host slice lives until the synchronize below (a pageable
        // source is staged by the driver, and waiting keeps that true for pinned memory too).
        unsafe {
            drv::memcpy_htod_async(s.ptr(), cpu.as_bytes(), stream.cu_stream())
                .map_err(|e| drv_err("copying to the device", e))?;
        }
        stream.synchronize().map_err(|e| drv_err("copying to the device", e))?;
        device.waited(Wait::SynchronousUpload);
        Ok(s)
    }

    /// The elements copied to the host (waits for queued work on the current stream).
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        let mut cpu = CpuStorage::zeros(self.dtype, self.len);
        let stream = self.stream();
        let bytes = cpu_bytes_mut(&mut cpu);
        // SAFETY: `bytes` is exactly this storage's size; we wait before reading it.
        unsafe {
            drv::memcpy_dtoh_async(bytes, self.ptr(), stream.cu_stream())
                .map_err(|e| drv_err("copying to the host", e))?;
        }
        stream.synchronize().map_err(|e| drv_err("copying to the host", e))?;
        self.device.waited(Wait::CopyToHost);
        Ok(cpu)
    }

    pub fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The current stream of this storage's device: where ops on it are queued.
    pub fn stream(&self) -> Arc<CudaStream> {
        current_raw(&self.device)
    }

    /// See [`CudaBuffer::record_stream`].
    pub fn record_stream(&mut self, stream: usize) {
        self.buf.record_stream(stream)
    }
}

fn cpu_bytes_mut(cpu: &mut CpuStorage) -> &mut [u8] {
    match cpu {
        CpuStorage::F32(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::F64(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::F16(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::BF16(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::I64(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::U32(v) => bytemuck::cast_slice_mut(v),
        CpuStorage::U8(v) => v,
        // SAFETY: the device only ever holds 0 or 1 in bool storage (kernels write 0/1).
        CpuStorage::Bool(v) => unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len()) },
    }
}

/// Most dims a strided kernel argument holds; layouts are merged first, so this is rarely hit.
pub const MAX_DIMS: usize = 8;

/// A layout passed by value to kernels (`struct Strided` in `cuda/common.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StridedArg {
    pub rank: i32,
    pub contiguous: i32,
    pub offset: i64,
    pub dims: [i64; MAX_DIMS],
    pub strides: [i64; MAX_DIMS],
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for StridedArg {}

impl StridedArg {
    /// The layout with size-1 dims dropped and mergeable neighbours merged; panics past MAX_DIMS.
    pub fn new(layout: &Layout) -> StridedArg {
        let mut dims: Vec<i64> = Vec::new();
        let mut strides: Vec<i64> = Vec::new();
        for (&d, &s) in layout.dims().iter().zip(layout.strides()) {
            if d == 1 {
                continue;
            }
            if let (Some(ld), Some(ls)) = (dims.last_mut(), strides.last_mut()) {
                if *ls == (s * d) as i64 {
                    *ld *= d as i64;
                    *ls = s as i64;
                    continue;
                }
            }
            dims.push(d as i64);
            strides.push(s as i64);
        }
        assert!(
            dims.len() <= MAX_DIMS,
            "CUDA kernels take layouts of at most {MAX_DIMS} dims after merging; got shape {:?} strides {:?}",
            layout.dims(),
            layout.strides()
        );
        let mut arg = StridedArg {
            rank: dims.len() as i32,
            contiguous: layout.is_contiguous() as i32,
            offset: layout.offset() as i64,
            dims: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        arg.dims[..dims.len()].copy_from_slice(&dims);
        arg.strides[..strides.len()].copy_from_slice(&strides);
        arg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_arg_merges_dims_like_the_cpu_walk() {
        let a = StridedArg::new(&Layout::contiguous([2, 3, 4]));
        assert_eq!((a.rank, a.contiguous, a.dims[0], a.strides[0]), (1, 1, 24, 1));
        let t = StridedArg::new(&Layout::contiguous([2, 3, 4]).permute(&[0, 2, 1]));
        assert_eq!(t.rank, 3);
        assert_eq!((&t.dims[..3], &t.strides[..3]), (&[2, 4, 3][..], &[12, 1, 4][..]));
        let b = StridedArg::new(&Layout::contiguous([3, 1]).broadcast_as(&[2, 3, 5]).unwrap());
        assert_eq!((&b.dims[..3], &b.strides[..3]), (&[2, 3, 5][..], &[0, 1, 0][..]));
    }
}
