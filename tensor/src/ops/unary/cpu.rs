//! CPU kernels for unary ops. f16 and bf16 compute in f32 and round once; f64 computes in f64.

use super::UnaryOp;
use crate::dtype::Element;
use crate::storage::CpuStorage;
use crate::strided::map;
use crate::Layout;
use half::{bf16, f16};
use num_traits::Float;

/// The precision an element type computes in.
pub(crate) trait ComputeAs: Element {
    type C: Special;
    fn up(self) -> Self::C;
    fn down(c: Self::C) -> Self;
}

/// What `num_traits::Float` lacks.
pub(crate) trait Special: Float + Send + Sync {
    fn erf(self) -> Self;
    fn round_half_even(self) -> Self;
    fn of(v: f64) -> Self;
}

impl Special for f32 {
    fn erf(self) -> f32 {
        libm::erff(self)
    }
    fn round_half_even(self) -> f32 {
        self.round_ties_even()
    }
    fn of(v: f64) -> f32 {
        v as f32
    }
}
impl Special for f64 {
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    fn round_half_even(self) -> f64 {
        self.round_ties_even()
    }
    fn of(v: f64) -> f64 {
        v
    }
}

macro_rules! compute_as {
    ($t:ty, $c:ty, |$a:ident| $up:expr, |$b:ident| $down:expr) => {
        impl ComputeAs for $t {
            type C = $c;
            #[inline(always)]
            fn up(self) -> $c {
                let $a = self;
                $up
            }
            #[inline(always)]
            fn down(c: $c) -> $t {
                let $b = c;
                $down
            }
        }
    };
}
compute_as!(f32, f32, |x| x, |c| c);
compute_as!(f64, f64, |x| x, |c| c);
compute_as!(f16, f32, |x| x.to_f32(), |c| f16::from_f32(c));
compute_as!(bf16, f32, |x| x.to_f32(), |c| bf16::from_f32(c));

/// The scalar function of a float op, in compute precision `C`.
#[inline(always)]
pub(crate) fn float_fn<C: Special>(op: UnaryOp) -> impl Fn(C) -> C + Sync + Copy {
    let zero = C::zero();
    let one = C::one();
    let half = C::of(0.5);
    let (p0, p1) = match op {
        UnaryOp::Affine { mul, add } => (C::of(mul), C::of(add)),
        UnaryOp::Powf(e) => (C::of(e), zero),
        UnaryOp::Clamp { min, max } => (C::of(min), C::of(max)),
        UnaryOp::Gelu => (C::of(std::f64::consts::FRAC_1_SQRT_2), zero),
        UnaryOp::GeluTanh => (C::of((2.0 / std::f64::consts::PI).sqrt()), C::of(0.044715)),
        _ => (zero, zero),
    };
    move |x: C| match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => one / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => one / (one + (-x).exp()),
        UnaryOp::Relu => {
            if x < zero {
                zero
            } else {
                x
            }
        }
        UnaryOp::Gelu => half * x * (one + (x * p0).erf()),
        UnaryOp::GeluTanh => half * x * (one + (p0 * (x + p1 * x * x * x)).tanh()),
        UnaryOp::Silu => x / (one + (-x).exp()),
        UnaryOp::Square => x * x,
        UnaryOp::Recip => one / x,
        // 0 for both zeros and for NaN, as torch.sign.
        UnaryOp::Sign => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero
            }
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_half_even(),
        UnaryOp::Affine { .. } => x * p0 + p1,
        // PyTorch computes these exponents with sqrt, multiplies and reciprocals, which differ
        // from powf at the edges (pow(-inf, 0.5) is inf, sqrt(-inf) is NaN).
        UnaryOp::Powf(0.5) => x.sqrt(),
        UnaryOp::Powf(-0.5) => one / x.sqrt(),
        UnaryOp::Powf(2.0) => x * x,
        UnaryOp::Powf(3.0) => x * x * x,
        UnaryOp::Powf(-1.0) => one / x,
        UnaryOp::Powf(-2.0) => one / (x * x),
        UnaryOp::Powf(_) => x.powf(p0),
        UnaryOp::Clamp { .. } => {
            // A NaN bound makes every element NaN, as in PyTorch.
            if p0.is_nan() || p1.is_nan() {
                p0 + p1
            } else if x < p0 {
                p0
            } else if x > p1 {
                p1
            } else {
                x
            }
        }
    }
}

fn float_unary<T: ComputeAs>(v: &[T], layout: &Layout, op: UnaryOp) -> Vec<T> {
    // The match on `op` inside `f` is loop-invariant; LLVM unswitches it out of the loop.
    let f = float_fn::<T::C>(op);
    map(v, layout, move |x: T| T::down(f(x.up())))
}

/// Integer elements: unary ops compute exactly in i128 and wrap back to the type, as PyTorch's
/// integer arithmetic wraps (`-x` on uint8 is `256 - x`, `abs(i64::MIN)` is `i64::MIN`).
trait WrapInt: Element {
    fn widen(self) -> i128;
    fn wrap(v: i128) -> Self;
}
macro_rules! wrap_int {
    ($($t:ty),*) => {$(
        impl WrapInt for $t {
            #[inline(always)]
            fn widen(self) -> i128 {
                self as i128
            }
            #[inline(always)]
            fn wrap(v: i128) -> $t {
                v as $t
            }
        }
    )*};
}
wrap_int!(i64, u32, u8);

fn is_integral(v: f64) -> bool {
    v.fract() == 0.0 && v.abs() < 9.2e18
}

fn int_unary<T: WrapInt>(v: &[T], layout: &Layout, op: UnaryOp) -> Vec<T> {
    match op {
        UnaryOp::Neg => map(v, layout, |x: T| T::wrap(x.widen().wrapping_neg())),
        UnaryOp::Abs => map(v, layout, |x: T| T::wrap(x.widen().abs())),
        UnaryOp::Relu => map(v, layout, |x: T| T::wrap(x.widen().max(0))),
        UnaryOp::Square => map(v, layout, |x: T| T::wrap(x.widen().wrapping_mul(x.widen()))),
        UnaryOp::Sign => map(v, layout, |x: T| T::wrap(x.widen().signum())),
        UnaryOp::Affine { mul, add } if is_integral(mul) && is_integral(add) => {
            let (mul, add) = (mul as i128, add as i128);
            map(v, layout, move |x: T| T::wrap(x.widen().wrapping_mul(mul).wrapping_add(add)))
        }
        // Fractional factors: computed in f64 and truncated toward zero, as a float result cast back.
        UnaryOp::Affine { mul, add } => map(v, layout, move |x: T| T::from_f64(x.to_f64() * mul + add)),
        UnaryOp::Clamp { min, max } => {
            assert!(!min.is_nan() && !max.is_nan(), "clamp: NaN bound for an integer tensor");
            // Integer bounds inside [min, max]; infinite bounds saturate to i128's range.
            let (lo, hi) = (min.ceil() as i128, max.floor() as i128);
            map(v, layout, move |x: T| {
                let w = x.widen();
                T::wrap(if w < lo {
                    lo
                } else if w > hi {
                    hi
                } else {
                    w
                })
            })
        }
        op => unreachable!("{}: checked to work on integers", op.name()),
    }
}

pub(super) fn unary(s: &CpuStorage, layout: &Layout, op: UnaryOp) -> CpuStorage {
    let int_op = |dtype| {
        assert!(
            op.works_on_integers(),
            "{}: not defined for integer tensors (dtype {dtype}); convert with .to_dtype(DType::F32)",
            op.name()
        )
    };
    match s {
        CpuStorage::F32(v) => CpuStorage::F32(float_unary(v, layout, op)),
        CpuStorage::F64(v) => CpuStorage::F64(float_unary(v, layout, op)),
        CpuStorage::F16(v) => CpuStorage::F16(float_unary(v, layout, op)),
        CpuStorage::BF16(v) => CpuStorage::BF16(float_unary(v, layout, op)),
        CpuStorage::I64(v) => {
            int_op(s.dtype());
            CpuStorage::I64(int_unary(v, layout, op))
        }
        CpuStorage::U32(v) => {
            int_op(s.dtype());
            CpuStorage::U32(int_unary(v, layout, op))
        }
        CpuStorage::U8(v) => {
            int_op(s.dtype());
            CpuStorage::U8(int_unary(v, layout, op))
        }
        CpuStorage::Bool(_) => panic!("{}: not defined for bool tensors", op.name()),
    }
}
