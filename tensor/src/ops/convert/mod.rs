//! Conversion between dtypes, with PyTorch's cast semantics: float-to-float rounds to nearest
//! even (f32 -> bf16 and f16 included), float-to-int truncates toward zero, integer-to-integer
//! wraps, to bool is `x != 0` (NaN is true).

use crate::dtype::{DType, Element};
use crate::memory_order::MemoryOrder;
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
        if let Some(m) = MemoryOrder::of(self.dims(), &[self]) {
            return m.leave(m.enter(self).to_dtype(dtype));
        }
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(convert(s, self.layout(), dtype)),
            Storage::Cuda(s) => Storage::Cuda(cuda::convert(s, self.layout(), dtype)),
        };
        Tensor::from_storage(storage, self.dims())
    }
}

/// One element's value as each kind of scalar a cast goes through, with C++ cast semantics:
/// floats truncate toward zero into i64 (saturating; NaN is 0), integers wrap, f64 reaches
/// f16/bf16 through f32 as PyTorch's does (two roundings; it also avoids `half`'s direct f64
/// path, which drops the low mantissa bits before rounding).
trait Cast: Element {
    fn cast_f32(self) -> f32;
    fn cast_f64(self) -> f64;
    fn cast_i64(self) -> i64;
    fn is_nonzero(self) -> bool;
}

macro_rules! cast_primitive {
    ($($t:ty),*) => {$(
        impl Cast for $t {
            #[inline(always)]
            fn cast_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn cast_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn cast_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn is_nonzero(self) -> bool {
                self != (0 as $t)
            }
        }
    )*};
}
cast_primitive!(f32, f64, i64, u32, u8);

macro_rules! cast_half {
    ($($t:ty),*) => {$(
        impl Cast for $t {
            #[inline(always)]
            fn cast_f32(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn cast_f64(self) -> f64 {
                self.to_f64()
            }
            #[inline(always)]
            fn cast_i64(self) -> i64 {
                self.to_f32() as i64
            }
            #[inline(always)]
            fn is_nonzero(self) -> bool {
                self.to_f32() != 0.0
            }
        }
    )*};
}
cast_half!(f16, bf16);

impl Cast for bool {
    fn cast_f32(self) -> f32 {
        self as u8 as f32
    }
    fn cast_f64(self) -> f64 {
        self as u8 as f64
    }
    fn cast_i64(self) -> i64 {
        self as i64
    }
    fn is_nonzero(self) -> bool {
        self
    }
}

fn convert(src: &CpuStorage, layout: &Layout, dtype: DType) -> CpuStorage {
    with_cpu_storage!(src, v, S => match dtype {
        DType::F32 => CpuStorage::F32(map(v, layout, |x: S| x.cast_f32())),
        DType::F64 => CpuStorage::F64(map(v, layout, |x: S| x.cast_f64())),
        DType::F16 => CpuStorage::F16(map(v, layout, |x: S| f16::from_f32(x.cast_f32()))),
        DType::BF16 => CpuStorage::BF16(map(v, layout, |x: S| bf16::from_f32(x.cast_f32()))),
        DType::I64 => CpuStorage::I64(map(v, layout, |x: S| x.cast_i64())),
        DType::U32 => CpuStorage::U32(map(v, layout, |x: S| x.cast_i64() as u32)),
        DType::U8 => CpuStorage::U8(map(v, layout, |x: S| x.cast_i64() as u8)),
        DType::Bool => CpuStorage::Bool(map(v, layout, |x: S| x.is_nonzero())),
    })
}
