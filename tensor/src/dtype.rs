//! Element types: the runtime tag [`DType`] and the compile-time [`Element`] trait that ties each
//! Rust type to its tag and to its variant of [`CpuStorage`].

use crate::storage::CpuStorage;
use half::{bf16, f16};

/// The element type of a tensor, as PyTorch names them (`torch.float32` is `DType::F32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    U32,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U32, DType::U8, DType::Bool];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::U32 | DType::U8)
    }

    /// The name PyTorch prints (`float32`, `bfloat16`, `int64`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::U32 => "uint32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust type that can be a tensor element.
///
/// Conversions go through `f64`, which represents every value of every supported type exactly
/// (i64 beyond 2^53 excepted), so `from_f64(x.to_f64())` is the identity.
pub trait Element: Copy + Send + Sync + PartialOrd + PartialEq + std::fmt::Debug + Default + 'static {
    const DTYPE: DType;
    fn zero() -> Self;
    fn one() -> Self;
    fn to_f64(self) -> f64;
    /// Converts with the semantics of a PyTorch cast: floats round to nearest even,
    /// integers truncate toward zero and wrap, bool is `x != 0`.
    fn from_f64(v: f64) -> Self;
    fn slice_of(storage: &CpuStorage) -> Option<&[Self]>;
    fn slice_of_mut(storage: &mut CpuStorage) -> Option<&mut [Self]>;
    fn into_storage(data: Vec<Self>) -> CpuStorage;
}

macro_rules! element {
    ($t:ty, $dtype:ident, $zero:expr, $one:expr, |$a:ident| $to:expr, |$b:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn zero() -> Self {
                $zero
            }
            fn one() -> Self {
                $one
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let $a = self;
                $to
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                let $b = v;
                $from
            }
            fn slice_of(storage: &CpuStorage) -> Option<&[Self]> {
                match storage {
                    CpuStorage::$dtype(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_of_mut(storage: &mut CpuStorage) -> Option<&mut [Self]> {
                match storage {
                    CpuStorage::$dtype(v) => Some(v),
                    _ => None,
                }
            }
            fn into_storage(data: Vec<Self>) -> CpuStorage {
                CpuStorage::$dtype(data)
            }
        }
    };
}

element!(f32, F32, 0.0, 1.0, |x| x as f64, |v| v as f32);
element!(f64, F64, 0.0, 1.0, |x| x, |v| v);
// Through f32, as PyTorch converts a double to half types (and `half`'s direct f64 path drops
// low mantissa bits before rounding, which misrounds some values).
element!(f16, F16, f16::ZERO, f16::ONE, |x| x.to_f64(), |v| f16::from_f32(v as f32));
element!(bf16, BF16, bf16::ZERO, bf16::ONE, |x| x.to_f64(), |v| bf16::from_f32(v as f32));
// `as` from f64 saturates in Rust (NaN is 0); out-of-range float-to-int casts are undefined in
// PyTorch. Unsigned types go through i64 and wrap, as PyTorch's CPU casts do (-1.0 -> 255u8).
element!(i64, I64, 0, 1, |x| x as f64, |v| v as i64);
element!(u32, U32, 0, 1, |x| x as f64, |v| v as i64 as u32);
element!(u8, U8, 0, 1, |x| x as f64, |v| v as i64 as u8);
element!(bool, Bool, false, true, |x| if x { 1.0 } else { 0.0 }, |v| v != 0.0);

/// Floating-point elements. Arithmetic on f16 and bf16 is done in f32 and rounded once, as
/// PyTorch's CPU kernels do.
pub trait FloatElement: Element + num_traits::Float {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl FloatElement for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl FloatElement for f64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
}
impl FloatElement for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatElement for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
