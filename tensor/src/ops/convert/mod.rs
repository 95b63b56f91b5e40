//! Conversion between dtypes, with PyTorch's cast semantics: float-to-float rounds to nearest
//! even (f32 -> bf16 and f16 included), float-to-int truncates toward zero, to bool is `x != 0`.

use crate::dtype::{DType, Element};
use crate::storage::{CpuStorage, Storage};
use crate::strided::map;
use crate::{Layout, Tensor};
use half::{bf16, f16};

pub(crate) mod cuda;
#[cfg(test)]
mod tests;

impl Tensor {
    /// This tensor as `dtype` (a cheap clone when it already is).
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(convert(s, self.layout(), dtype)),
            Storage::Cuda(s) => Storage::Cuda(cuda::convert(s, self.layout(), dtype)),
        };
        Tensor::from_storage(storage, self.dims())
    }
}

/// Direct conversions where a double rounding through f64 would differ or cost more.
fn convert(src: &CpuStorage, layout: &Layout, dtype: DType) -> CpuStorage {
    match (src, dtype) {
        (CpuStorage::F32(v), DType::BF16) => CpuStorage::BF16(map(v, layout, bf16::from_f32)),
        (CpuStorage::F32(v), DType::F16) => CpuStorage::F16(map(v, layout, f16::from_f32)),
        (CpuStorage::BF16(v), DType::F32) => CpuStorage::F32(map(v, layout, bf16::to_f32)),
        (CpuStorage::F16(v), DType::F32) => CpuStorage::F32(map(v, layout, f16::to_f32)),
        // bf16 <-> f16 goes through f32, which holds both exactly; then one rounding.
        (CpuStorage::BF16(v), DType::F16) => CpuStorage::F16(map(v, layout, |x| f16::from_f32(x.to_f32()))),
        (CpuStorage::F16(v), DType::BF16) => CpuStorage::BF16(map(v, layout, |x| bf16::from_f32(x.to_f32()))),
        _ => with_cpu_storage!(src, v, S => match dtype {
            DType::F32 => CpuStorage::F32(map(v, layout, |x: S| f32::from_f64(x.to_f64()))),
            DType::F64 => CpuStorage::F64(map(v, layout, |x: S| x.to_f64())),
            DType::F16 => CpuStorage::F16(map(v, layout, |x: S| f16::from_f64(x.to_f64()))),
            DType::BF16 => CpuStorage::BF16(map(v, layout, |x: S| bf16::from_f64(x.to_f64()))),
            DType::I64 => CpuStorage::I64(map(v, layout, |x: S| i64::from_f64(x.to_f64()))),
            DType::U32 => CpuStorage::U32(map(v, layout, |x: S| u32::from_f64(x.to_f64()))),
            DType::U8 => CpuStorage::U8(map(v, layout, |x: S| u8::from_f64(x.to_f64()))),
            DType::Bool => CpuStorage::Bool(map(v, layout, |x: S| x.to_f64() != 0.0)),
        }),
    }
}
