//! CPU kernels for binary ops. f16 and bf16 compute in f32 and round once.

use super::{BinaryOp, CmpOp};
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::storage::CpuStorage;
use crate::strided::{zip3_map, zip_map};
use crate::Layout;
use num_traits::Float;

fn float_binary<T: ComputeAs>(a: &[T], la: &Layout, b: &[T], lb: &Layout, op: BinaryOp) -> Vec<T> {
    // A macro, not a helper taking `fn(C, C) -> C`: a function pointer is called per element
    // and keeps the loop from vectorising; a closure literal per op is inlined into its own loop.
    macro_rules! go {
        (|$x:ident, $y:ident| $e:expr) => {
            zip_map(a, la, b, lb, |x: T, y: T| {
                let ($x, $y) = (x.up(), y.up());
                T::down($e)
            })
        };
    }
    match op {
        BinaryOp::Add => go!(|x, y| x + y),
        BinaryOp::Sub => go!(|x, y| x - y),
        BinaryOp::Mul => go!(|x, y| x * y),
        BinaryOp::Div => go!(|x, y| x / y),
        // NaN propagates, as in torch.maximum.
        BinaryOp::Maximum => go!(|x, y| if x.is_nan() || x > y { x } else { y }),
        BinaryOp::Minimum => go!(|x, y| if x.is_nan() || x < y { x } else { y }),
        BinaryOp::Pow => go!(|x, y| x.powf(y)),
    }
}

/// Integer arithmetic wraps on overflow, as PyTorch's does.
macro_rules! int_binary {
    ($a:expr, $la:expr, $b:expr, $lb:expr, $op:expr, $dtype:expr) => {{
        let (a, la, b, lb) = ($a, $la, $b, $lb);
        match $op {
            BinaryOp::Add => zip_map(a, la, b, lb, |x, y| x.wrapping_add(y)),
            BinaryOp::Sub => zip_map(a, la, b, lb, |x, y| x.wrapping_sub(y)),
            BinaryOp::Mul => zip_map(a, la, b, lb, |x, y| x.wrapping_mul(y)),
            BinaryOp::Maximum => zip_map(a, la, b, lb, |x, y| if x > y { x } else { y }),
            BinaryOp::Minimum => zip_map(a, la, b, lb, |x, y| if x < y { x } else { y }),
            op => panic!(
                "{}: not defined for integer tensors (dtype {}); convert with .to_dtype(DType::F32)",
                op.name(),
                $dtype
            ),
        }
    }};
}

pub(super) fn binary(a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout, op: BinaryOp) -> CpuStorage {
    match (a, b) {
        (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(float_binary(a, la, b, lb, op)),
        (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(float_binary(a, la, b, lb, op)),
        (CpuStorage::F16(a), CpuStorage::F16(b)) => CpuStorage::F16(float_binary(a, la, b, lb, op)),
        (CpuStorage::BF16(a), CpuStorage::BF16(b)) => CpuStorage::BF16(float_binary(a, la, b, lb, op)),
        (CpuStorage::I64(a), CpuStorage::I64(b)) => CpuStorage::I64(int_binary!(a, la, b, lb, op, "int64")),
        (CpuStorage::U32(a), CpuStorage::U32(b)) => CpuStorage::U32(int_binary!(a, la, b, lb, op, "uint32")),
        (CpuStorage::U8(a), CpuStorage::U8(b)) => CpuStorage::U8(int_binary!(a, la, b, lb, op, "uint8")),
        (CpuStorage::Bool(a), CpuStorage::Bool(b)) => CpuStorage::Bool(match op {
            // PyTorch's bool arithmetic: + is or, * is and.
            BinaryOp::Add | BinaryOp::Maximum => zip_map(a, la, b, lb, |x, y| x | y),
            BinaryOp::Mul | BinaryOp::Minimum => zip_map(a, la, b, lb, |x, y| x & y),
            op => panic!("{}: not defined for bool tensors", op.name()),
        }),
        (a, b) => unreachable!("binary {}: dtypes {} and {} checked equal", op.name(), a.dtype(), b.dtype()),
    }
}

fn threshold_backward_typed<T: ComputeAs>(
    g: &[T],
    lg: &Layout,
    x: &[T],
    lx: &Layout,
    threshold: f64,
) -> Vec<T> {
    let (th, zero) = (<T::C as Special>::of(threshold), T::down(<T::C as Special>::of(0.0)));
    zip_map(g, lg, x, lx, move |g: T, x: T| if x.up() > th { g } else { zero })
}

pub(super) fn threshold_backward(
    g: &CpuStorage,
    lg: &Layout,
    x: &CpuStorage,
    lx: &Layout,
    threshold: f64,
) -> CpuStorage {
    with_float_storage!(g, "threshold_backward", gv, T => T::into_storage(
        threshold_backward_typed::<T>(gv, lg, x.as_slice::<T>(), lx, threshold)
    ))
}

fn gelu_backward_typed<T: ComputeAs>(g: &[T], lg: &Layout, x: &[T], lx: &Layout, tanh: bool) -> Vec<T> {
    let of = <T::C as Special>::of;
    let (half, one) = (of(0.5), of(1.0));
    if tanh {
        let (c, k, k3) = (of((2.0 / std::f64::consts::PI).sqrt()), of(0.044715), of(3.0 * 0.044715));
        // With s = sigmoid(2u) = (1 + tanh(u)) / 2: d/dx [x s] = s + 2x s (1 - s) u', the tanh
        // form's derivative rewritten over a vectorisable exp (as the forward).
        zip_map(g, lg, x, lx, move |g: T, x: T| {
            let x = x.up();
            let u = c * (x + k * x * x * x);
            let s = one / (one + (-(u + u)).exp_v());
            let d = s + (x + x) * s * (one - s) * c * (one + k3 * x * x);
            T::down(g.up() * d)
        })
    } else {
        let (r2, rpi) = (of(std::f64::consts::FRAC_1_SQRT_2), of(1.0 / (2.0 * std::f64::consts::PI).sqrt()));
        zip_map(g, lg, x, lx, move |g: T, x: T| {
            let x = x.up();
            let d = half * (one + (x * r2).erf()) + x * rpi * (-half * x * x).exp();
            T::down(g.up() * d)
        })
    }
}

/// `g * gelu'(x)`, exact (erf) or the tanh approximation, in one pass.
pub(super) fn gelu_backward(
    g: &CpuStorage,
    lg: &Layout,
    x: &CpuStorage,
    lx: &Layout,
    tanh: bool,
) -> CpuStorage {
    with_float_storage!(g, "gelu_backward", gv, T => T::into_storage(
        gelu_backward_typed::<T>(gv, lg, x.as_slice::<T>(), lx, tanh)
    ))
}

fn cmp_typed<T: Element>(a: &[T], la: &Layout, b: &[T], lb: &Layout, op: CmpOp) -> Vec<bool> {
    match op {
        CmpOp::Eq => zip_map(a, la, b, lb, |x, y| x == y),
        CmpOp::Ne => zip_map(a, la, b, lb, |x, y| x != y),
        CmpOp::Lt => zip_map(a, la, b, lb, |x, y| x < y),
        CmpOp::Le => zip_map(a, la, b, lb, |x, y| x <= y),
        CmpOp::Gt => zip_map(a, la, b, lb, |x, y| x > y),
        CmpOp::Ge => zip_map(a, la, b, lb, |x, y| x >= y),
    }
}

pub(super) fn compare(a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout, op: CmpOp) -> CpuStorage {
    CpuStorage::Bool(with_cpu_storage!(a, av, T => cmp_typed::<T>(av, la, b.as_slice::<T>(), lb, op)))
}

pub(super) fn where_cond(
    c: &CpuStorage,
    lc: &Layout,
    t: &CpuStorage,
    lt: &Layout,
    f: &CpuStorage,
    lf: &Layout,
) -> CpuStorage {
    let c = c.as_slice::<bool>();
    with_cpu_storage!(t, tv, T => T::into_storage(zip3_map(
        (c, lc),
        (tv.as_slice(), lt),
        (f.as_slice::<T>(), lf),
        |c, x, y| if c { x } else { y },
    )))
}
