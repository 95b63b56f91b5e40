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
    /// `exp`: in f32 the vectorisable `vmath::exp_f32` (within 2 ulp), in f64 libm's.
    fn exp_v(self) -> Self;
    fn round_half_even(self) -> Self;
    fn of(v: f64) -> Self;
}

impl Special for f32 {
    fn erf(self) -> f32 {
        libm::erff(self)
    }
    #[inline(always)]
    fn exp_v(self) -> f32 {
        crate::vmath::exp_f32(self)
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
    #[inline(always)]
    fn exp_v(self) -> f64 {
        self.exp()
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

/// `T::down(f(x.up()))` over the view: one monomorphised, vectorisable loop per closure `f`.
#[inline(always)]
fn go<T: ComputeAs>(v: &[T], layout: &Layout, f: impl Fn(T::C) -> T::C + Sync) -> Vec<T> {
    map(v, layout, move |x: T| T::down(f(x.up())))
}

/// Each op is its own closure, so each gets its own loop: a single closure with a `match op`
/// per element (as this was) keeps the compiler from vectorising any of them.
fn float_unary<T: ComputeAs>(v: &[T], layout: &Layout, op: UnaryOp) -> Vec<T> {
    let c = <T::C as Special>::of;
    let (zero, one, half) = (c(0.0), c(1.0), c(0.5));
    match op {
        UnaryOp::Neg => go(v, layout, |x| -x),
        UnaryOp::Abs => go(v, layout, |x| x.abs()),
        UnaryOp::Exp => go(v, layout, |x| x.exp()),
        UnaryOp::Log => go(v, layout, |x| x.ln()),
        UnaryOp::Log1p => go(v, layout, |x| x.ln_1p()),
        UnaryOp::Sqrt => go(v, layout, |x| x.sqrt()),
        UnaryOp::Rsqrt => go(v, layout, |x| one / x.sqrt()),
        UnaryOp::Sin => go(v, layout, |x| x.sin()),
        UnaryOp::Cos => go(v, layout, |x| x.cos()),
        UnaryOp::Tanh => go(v, layout, |x| x.tanh()),
        UnaryOp::Sigmoid => go(v, layout, |x| one / (one + (-x).exp())),
        // NaN stays NaN (`NaN < 0` is false), as torch.relu.
        UnaryOp::Relu => go(v, layout, |x| if x < zero { zero } else { x }),
        UnaryOp::Gelu => {
            let k = c(std::f64::consts::FRAC_1_SQRT_2);
            go(v, layout, move |x| half * x * (one + (x * k).erf()))
        }
        UnaryOp::GeluTanh => {
            // x/2 (1 + tanh(u)) written as x sigmoid(2u): the same function, with an exp the
            // compiler vectorises instead of libm's tanh (which took most of GPT-2's MLP time).
            let (k2, a) = (c(2.0 * (2.0 / std::f64::consts::PI).sqrt()), c(0.044715));
            go(v, layout, move |x| x / (one + (-(k2 * (x + a * x * x * x))).exp_v()))
        }
        UnaryOp::Silu => go(v, layout, |x| x / (one + (-x).exp())),
        UnaryOp::Square => go(v, layout, |x| x * x),
        UnaryOp::Recip => go(v, layout, |x| one / x),
        // 0 for both zeros and for NaN, as torch.sign.
        UnaryOp::Sign => go(v, layout, |x| {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero
            }
        }),
        UnaryOp::Floor => go(v, layout, |x| x.floor()),
        UnaryOp::Ceil => go(v, layout, |x| x.ceil()),
        UnaryOp::Round => go(v, layout, |x| x.round_half_even()),
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (c(mul), c(add));
            go(v, layout, move |x| x * m + a)
        }
        // PyTorch computes these exponents with sqrt, multiplies and reciprocals, which differ
        // from powf at the edges (pow(-inf, 0.5) is inf, sqrt(-inf) is NaN).
        UnaryOp::Powf(0.5) => go(v, layout, |x| x.sqrt()),
        UnaryOp::Powf(-0.5) => go(v, layout, |x| one / x.sqrt()),
        UnaryOp::Powf(2.0) => go(v, layout, |x| x * x),
        UnaryOp::Powf(3.0) => go(v, layout, |x| x * x * x),
        UnaryOp::Powf(-1.0) => go(v, layout, |x| one / x),
        UnaryOp::Powf(-2.0) => go(v, layout, |x| one / (x * x)),
        UnaryOp::Powf(e) => {
            let e = c(e);
            go(v, layout, move |x| x.powf(e))
        }
        // A NaN bound makes every element NaN, as in PyTorch.
        UnaryOp::Clamp { min, max } if min.is_nan() || max.is_nan() => go(v, layout, |_| c(f64::NAN)),
        UnaryOp::Clamp { min, max } => {
            let (lo, hi) = (c(min), c(max));
            go(v, layout, move |x| {
                if x < lo {
                    lo
                } else if x > hi {
                    hi
                } else {
                    x
                }
            })
        }
    }
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
