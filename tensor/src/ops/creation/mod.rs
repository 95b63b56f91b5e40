//! New tensors: constants, ranges, identity. Random tensors live in `random`.
//!
//! On CUDA every element is generated on the device (see `cuda.rs`), with the formulas below
//! evaluated in f64 there too, so both backends give the same bits.

use crate::dtype::{DType, Element};
use crate::shape::Shape;
use crate::storage::{CpuStorage, Storage};
use crate::{Device, Result, Tensor};

pub(crate) mod cuda;
#[cfg(test)]
mod tests;

impl Tensor {
    /// A tensor of `value` converted to `dtype` (`torch.full`).
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        match device {
            Device::Cpu => Ok(Tensor::from_cpu(CpuStorage::full(dtype, shape.elem_count(), value), shape)),
            Device::Cuda(ordinal) => {
                let s = cuda::full(ordinal, dtype, shape.elem_count(), value)?;
                Ok(Tensor::from_storage(Storage::Cuda(s), shape))
            }
        }
    }

    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        match device {
            Device::Cpu => Ok(Tensor::from_cpu(CpuStorage::zeros(dtype, shape.elem_count()), shape)),
            Device::Cuda(ordinal) => {
                let dev = crate::cuda::device(ordinal)?;
                let s = crate::cuda::CudaStorage::zeros(&dev, dtype, shape.elem_count())?;
                Ok(Tensor::from_storage(Storage::Cuda(s), shape))
            }
        }
    }

    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Tensor {
        Tensor::zeros(self.dims(), self.dtype(), self.device())
            .expect("zeros_like on the tensor's own device")
    }

    pub fn ones_like(&self) -> Tensor {
        self.full_like(1.0)
    }

    pub fn full_like(&self, value: f64) -> Tensor {
        Tensor::full(self.dims(), value, self.dtype(), self.device())
            .expect("full_like on the tensor's own device")
    }

    /// `start, start + step, ...` up to but excluding `end` (`torch.arange`).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        assert!(step != 0.0, "arange: step must be nonzero");
        assert!(
            (end - start) * step >= 0.0,
            "arange: upper bound {end} and lower bound {start} inconsistent with step sign {step}"
        );
        assert!(
            start.is_finite() && end.is_finite(),
            "arange: bounds must be finite, got start {start} and end {end}"
        );
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        // PyTorch counts the elements with the given bounds but, for integer dtypes, computes
        // the values from the start and step truncated to integers.
        let (start, step) = if dtype.is_int() { (start.trunc(), step.trunc()) } else { (start, step) };
        if let Device::Cuda(ordinal) = device {
            return Ok(cuda_vector(cuda::arange(ordinal, dtype, n, start, step)?, n));
        }
        Tensor::from_f64_fn(n, dtype, device, |i| start + i as f64 * step)
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive (`torch.linspace`).
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType, device: Device) -> Result<Tensor> {
        // The bounds are first converted to `dtype`, as in PyTorch (integer linspace starts at
        // the truncated start).
        let (start, end) = (CpuStorage::full(dtype, 1, start), CpuStorage::full(dtype, 1, end));
        let bound = |s: CpuStorage| with_cpu_storage!(&s, v, T => v[0].to_f64());
        let (start, end) = (bound(start), bound(end));
        let step = if steps > 1 { (end - start) / (steps - 1) as f64 } else { 0.0 };
        // Fill from both ends, as PyTorch does, so the last value is exactly `end` (one step is `start`).
        if let Device::Cuda(ordinal) = device {
            return Ok(cuda_vector(cuda::linspace(ordinal, dtype, steps, start, end, step)?, steps));
        }
        let half = steps / 2;
        Tensor::from_f64_fn(steps, dtype, device, |i| {
            if i < half || steps == 1 {
                start + step * i as f64
            } else {
                end - step * (steps - 1 - i) as f64
            }
        })
    }

    /// The `n x n` identity matrix.
    pub fn eye(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        if let Device::Cuda(ordinal) = device {
            return Ok(Tensor::from_storage(Storage::Cuda(cuda::eye(ordinal, dtype, n)?), [n, n]));
        }
        let t = Tensor::from_f64_fn(n * n, dtype, device, |i| if i / n == i % n { 1.0 } else { 0.0 })?;
        Ok(t.reshape([n, n]))
    }

    /// A rank-1 tensor whose element `i` is `f(i)` converted to `dtype`.
    pub(crate) fn from_f64_fn(
        n: usize,
        dtype: DType,
        device: Device,
        f: impl Fn(usize) -> f64,
    ) -> Result<Tensor> {
        fn fill<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> CpuStorage {
            T::into_storage((0..n).map(|i| T::from_f64(f(i))).collect())
        }
        let storage = match dtype {
            DType::F32 => fill::<f32>(n, f),
            DType::F64 => fill::<f64>(n, f),
            DType::F16 => fill::<half::f16>(n, f),
            DType::BF16 => fill::<half::bf16>(n, f),
            DType::I64 => fill::<i64>(n, f),
            DType::U32 => fill::<u32>(n, f),
            DType::U8 => fill::<u8>(n, f),
            DType::Bool => fill::<bool>(n, f),
        };
        Tensor::from_cpu_on(storage, n, device)
    }
}

fn cuda_vector(s: crate::cuda::CudaStorage, n: usize) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), n)
}
