//! Backing memory of tensors: an enum over the backends, each an enum over dtypes.
//!
//! Op families dispatch with a `match` on [`Storage`]; adding a backend variant makes every
//! op that lacks an implementation fail to compile, which is the guarantee a backend trait
//! would give, without one trait that every op family has to edit.

use crate::dtype::{DType, Element};
use crate::Device;
use half::{bf16, f16};

/// Host memory, one variant per dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    U32(Vec<u32>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`CpuStorage`]
/// (`$T` names the element type, usable in turbofish and generic calls).
#[macro_export]
#[doc(hidden)]
macro_rules! with_cpu_storage {
    ($storage:expr, $v:ident, $T:ident => $body:expr) => {
        match $storage {
            $crate::CpuStorage::F32($v) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::CpuStorage::F64($v) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
            $crate::CpuStorage::F16($v) => {
                #[allow(dead_code)]
                type $T = $crate::half::f16;
                $body
            }
            $crate::CpuStorage::BF16($v) => {
                #[allow(dead_code)]
                type $T = $crate::half::bf16;
                $body
            }
            $crate::CpuStorage::I64($v) => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            $crate::CpuStorage::U32($v) => {
                #[allow(dead_code)]
                type $T = u32;
                $body
            }
            $crate::CpuStorage::U8($v) => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $crate::CpuStorage::Bool($v) => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            }
        }
    };
}

/// Like [`with_cpu_storage!`] for the four float variants; any other dtype panics with a
/// message naming `$op`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_float_storage {
    ($storage:expr, $op:expr, $v:ident, $T:ident => $body:expr) => {
        match $storage {
            $crate::CpuStorage::F32($v) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::CpuStorage::F64($v) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
            $crate::CpuStorage::F16($v) => {
                #[allow(dead_code)]
                type $T = $crate::half::f16;
                $body
            }
            $crate::CpuStorage::BF16($v) => {
                #[allow(dead_code)]
                type $T = $crate::half::bf16;
                $body
            }
            other => panic!("{}: expected a floating-point tensor, got dtype {}", $op, other.dtype()),
        }
    };
}

impl CpuStorage {
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_cpu_storage!(self, v, T => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zero elements of `dtype` (`false` for bool).
    pub fn zeros(dtype: DType, n: usize) -> CpuStorage {
        match dtype {
            DType::F32 => CpuStorage::F32(vec![0.0; n]),
            DType::F64 => CpuStorage::F64(vec![0.0; n]),
            DType::F16 => CpuStorage::F16(vec![f16::ZERO; n]),
            DType::BF16 => CpuStorage::BF16(vec![bf16::ZERO; n]),
            DType::I64 => CpuStorage::I64(vec![0; n]),
            DType::U32 => CpuStorage::U32(vec![0; n]),
            DType::U8 => CpuStorage::U8(vec![0; n]),
            DType::Bool => CpuStorage::Bool(vec![false; n]),
        }
    }

    /// `n` copies of `value` converted to `dtype` with cast semantics.
    pub fn full(dtype: DType, n: usize, value: f64) -> CpuStorage {
        fn fill<T: Element>(n: usize, value: f64) -> CpuStorage {
            T::into_storage(vec![T::from_f64(value); n])
        }
        match dtype {
            DType::F32 => fill::<f32>(n, value),
            DType::F64 => fill::<f64>(n, value),
            DType::F16 => fill::<f16>(n, value),
            DType::BF16 => fill::<bf16>(n, value),
            DType::I64 => fill::<i64>(n, value),
            DType::U32 => fill::<u32>(n, value),
            DType::U8 => fill::<u8>(n, value),
            DType::Bool => fill::<bool>(n, value),
        }
    }

    /// The typed slice, or a panic naming both dtypes.
    pub fn as_slice<T: Element>(&self) -> &[T] {
        match T::slice_of(self) {
            Some(s) => s,
            None => panic!("storage holds {} elements, asked for {}", self.dtype(), T::DTYPE),
        }
    }

    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        let dtype = self.dtype();
        match T::slice_of_mut(self) {
            Some(s) => s,
            None => panic!("storage holds {dtype} elements, asked for {}", T::DTYPE),
        }
    }

    /// The raw little-endian bytes of the elements (bool as 0/1 bytes), as safetensors stores them.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice(v),
            CpuStorage::F64(v) => bytemuck::cast_slice(v),
            CpuStorage::F16(v) => bytemuck::cast_slice(v),
            CpuStorage::BF16(v) => bytemuck::cast_slice(v),
            CpuStorage::I64(v) => bytemuck::cast_slice(v),
            CpuStorage::U32(v) => bytemuck::cast_slice(v),
            CpuStorage::U8(v) => v,
            // SAFETY: bool is one byte holding 0 or 1.
            CpuStorage::Bool(v) => unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len()) },
        }
    }
}

/// Memory on some device.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(crate::cuda::CudaStorage),
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.device().ordinal()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
