//! Element types that travel between ranks, and the one reduction kernel for all of them.
//!
//! Half types accumulate in f32 and are rounded once at the end, as NCCL does: a sum over
//! many ranks in bf16 would otherwise lose the small contributions.

use crate::op::ReduceOp;
use half::{bf16, f16};
use oxtrain_tensor::DType;

/// Plain data that can be copied between ranks byte for byte.
pub trait CommElement: bytemuck::Pod + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
}

/// Accumulation arithmetic: f32 or f64.
pub trait Accumulator: Copy + PartialOrd + std::ops::Add<Output = Self> + Send + 'static {
    const ZERO: Self;
    fn div_count(self, n: usize) -> Self;
    fn is_nan(self) -> bool;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Accumulator for f32 {
    const ZERO: f32 = 0.0;
    fn div_count(self, n: usize) -> f32 {
        self / n as f32
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl Accumulator for f64 {
    const ZERO: f64 = 0.0;
    fn div_count(self, n: usize) -> f64 {
        self / n as f64
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// An element that reductions accept, with the type its sums are carried in.
pub trait ReduceElement: CommElement {
    type Acc: Accumulator;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(acc: Self::Acc) -> Self;
}

macro_rules! comm_element {
    ($($t:ty => $dtype:ident),*) => { $(impl CommElement for $t { const DTYPE: DType = DType::$dtype; })* };
}
comm_element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i64 => I64, u32 => U32, u8 => U8);

impl ReduceElement for f32 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self
    }
    fn from_acc(acc: f32) -> f32 {
        acc
    }
}
impl ReduceElement for f64 {
    type Acc = f64;
    fn to_acc(self) -> f64 {
        self
    }
    fn from_acc(acc: f64) -> f64 {
        acc
    }
}
impl ReduceElement for f16 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    fn from_acc(acc: f32) -> f16 {
        f16::from_f32(acc)
    }
}
impl ReduceElement for bf16 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    fn from_acc(acc: f32) -> bf16 {
        bf16::from_f32(acc)
    }
}

/// Runs `$body` with `$T` bound to the reducible element type of `$dtype`; any other dtype
/// panics naming `$op` (a dtype a reduction cannot take is a programming mistake).
#[macro_export]
#[doc(hidden)]
macro_rules! with_reduce_element {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::__DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::__DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::__DType::F16 => {
                type $T = $crate::__half::f16;
                $body
            }
            $crate::__DType::BF16 => {
                type $T = $crate::__half::bf16;
                $body
            }
            other => panic!("{}: reductions take f32, f64, f16 or bf16 tensors, got {}", $op, other),
        }
    };
}

/// Elementwise reduction of `inputs` (one slice per rank, all of `out.len()` elements) into
/// `out`. `out` may alias one of the inputs: each block is read in full before it is written.
///
/// # Safety
/// Every pointer in `inputs` must be valid for reads of `len` elements and `out` for writes.
pub(crate) unsafe fn reduce_into<T: ReduceElement>(
    inputs: &[*const T],
    out: *mut T,
    len: usize,
    op: ReduceOp,
) {
    const BLOCK: usize = 512;
    let mut acc = [T::Acc::ZERO; BLOCK];
    let n = inputs.len();
    let mut start = 0;
    while start < len {
        let m = BLOCK.min(len - start);
        let first = std::slice::from_raw_parts(inputs[0].add(start), m);
        for (a, x) in acc.iter_mut().zip(first) {
            *a = x.to_acc();
        }
        for input in &inputs[1..] {
            let xs = std::slice::from_raw_parts(input.add(start), m);
            match op {
                ReduceOp::Sum | ReduceOp::Avg => {
                    for (a, x) in acc.iter_mut().zip(xs) {
                        *a = *a + x.to_acc();
                    }
                }
                // NaN wins, as in torch: once the running value is NaN no comparison replaces it.
                ReduceOp::Max => {
                    for (a, x) in acc.iter_mut().zip(xs) {
                        let v = x.to_acc();
                        if v > *a || v.is_nan() {
                            *a = v;
                        }
                    }
                }
                ReduceOp::Min => {
                    for (a, x) in acc.iter_mut().zip(xs) {
                        let v = x.to_acc();
                        if v < *a || v.is_nan() {
                            *a = v;
                        }
                    }
                }
            }
        }
        let dst = std::slice::from_raw_parts_mut(out.add(start), m);
        if op == ReduceOp::Avg {
            for (d, a) in dst.iter_mut().zip(&acc[..m]) {
                *d = T::from_acc(a.div_count(n));
            }
        } else {
            for (d, a) in dst.iter_mut().zip(&acc[..m]) {
                *d = T::from_acc(*a);
            }
        }
        start += m;
    }
}
