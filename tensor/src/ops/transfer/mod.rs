//! Moving data to the GPU without waiting for it: pinned uploads (`tensor.to(device,
//! non_blocking=True)` in PyTorch), uploads from the data loader's pinned buffers, and
//! `record_stream`. The pinned-memory design is explained in `cuda/pinned.rs`.

use crate::cuda::{self, CudaStorage, PinnedBuffer};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Device, Result, Tensor};

#[cfg(test)]
mod tests;

impl Tensor {
    /// The tensor on `device`, without waiting for a host-to-device copy to finish: the data is
    /// copied into a pinned staging buffer now (so this tensor may change right after), and the
    /// upload is queued on the device's current stream, where later ops on the result run after
    /// it. Copies from the GPU still wait (the host needs the data), as `to_device` does.
    pub fn to_device_non_blocking(&self, device: Device) -> Result<Tensor> {
        let Device::Cuda(ordinal) = device else { return self.to_device(device) };
        if device == self.device() {
            return Ok(self.clone());
        }
        if self.device() != Device::Cpu {
            return self.to_device(device);
        }
        let src = self.contiguous();
        let storage = src.storage();
        let Storage::Cpu(host) = &*storage else { unreachable!("checked to be on the CPU") };
        let bytes = &host.as_bytes()[src.layout().offset() * self.dtype().size_in_bytes()..]
            [..self.elem_count() * self.dtype().size_in_bytes()];
        let dev = cuda::device(ordinal)?;
        let out = CudaStorage::alloc(&dev, self.dtype(), self.elem_count())?;
        cuda::pinned::upload_staged(bytes, &out)?;
        Ok(Tensor::from_storage(Storage::Cuda(out), self.dims()))
    }

    /// A tensor of `shape` and `dtype` from the first bytes of `buffer` (little-endian elements,
    /// row-major; bool as 0/1 bytes), as the data loader hands over a batch. On CUDA the copy is
    /// queued on the current stream and this returns at once; the buffer's next `as_mut_slice`
    /// waits for the copy. On the CPU the bytes are copied now. Panics if the buffer is too small.
    pub fn from_pinned(
        buffer: &mut PinnedBuffer,
        shape: impl Into<Shape>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let bytes = shape.elem_count() * dtype.size_in_bytes();
        assert!(
            bytes <= buffer.len_bytes(),
            "from_pinned: shape {:?} of {dtype} needs {bytes} bytes, the pinned buffer holds {}",
            shape.dims(),
            buffer.len_bytes()
        );
        let data = &buffer.as_slice::<u8>()[..bytes];
        if dtype == DType::Bool {
            // The device's bool kernels assume 0 or 1, as the CPU's `bool` does.
            if let Some(i) = data.iter().position(|&b| b > 1) {
                panic!("from_pinned: bool data must be 0 or 1 bytes, byte {i} is {}", data[i]);
            }
        }
        match device {
            Device::Cpu => {
                Ok(Tensor::from_cpu(crate::safetensors::storage_from_le_bytes(dtype, data), shape))
            }
            Device::Cuda(ordinal) => {
                let dev = cuda::device(ordinal)?;
                let out = CudaStorage::alloc(&dev, dtype, shape.elem_count())?;
                buffer.upload_to(&out)?;
                Ok(Tensor::from_storage(Storage::Cuda(out), shape))
            }
        }
    }

    /// Marks this tensor's device memory as used by `stream` (`Tensor.record_stream`), so that
    /// when the tensor is freed the memory is not reused before `stream`'s work queued so far
    /// has finished. Needed when a tensor made on one stream is consumed on another (e.g. by a
    /// communication stream). Panics for a CPU tensor or one on another GPU than `stream`.
    pub fn record_stream(&self, stream: &cuda::Stream) {
        let device = self.device();
        match &mut *self.storage_mut() {
            Storage::Cuda(s) => {
                assert_eq!(
                    s.device().ordinal(),
                    stream.ordinal(),
                    "record_stream: the tensor is on {device}, the stream on cuda:{}",
                    stream.ordinal()
                );
                s.record_stream(stream.id());
            }
            Storage::Cpu(_) => panic!("record_stream: expected a CUDA tensor, got one on {device}"),
        }
    }
}
