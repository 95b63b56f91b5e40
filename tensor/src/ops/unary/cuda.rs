//! CUDA dispatch for unary ops (kernels in `unary.cu`).

use super::UnaryOp;
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::Layout;
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("unary", "src/ops/unary/unary.cu");

/// The op's code in `unary.cu` and its two scalar parameters.
fn code(op: UnaryOp) -> (i32, f64, f64) {
    match op {
        UnaryOp::Neg => (0, 0.0, 0.0),
        UnaryOp::Abs => (1, 0.0, 0.0),
        UnaryOp::Exp => (2, 0.0, 0.0),
        UnaryOp::Log => (3, 0.0, 0.0),
        UnaryOp::Log1p => (4, 0.0, 0.0),
        UnaryOp::Sqrt => (5, 0.0, 0.0),
        UnaryOp::Rsqrt => (6, 0.0, 0.0),
        UnaryOp::Sin => (7, 0.0, 0.0),
        UnaryOp::Cos => (8, 0.0, 0.0),
        UnaryOp::Tanh => (9, 0.0, 0.0),
        UnaryOp::Sigmoid => (10, 0.0, 0.0),
        UnaryOp::Relu => (11, 0.0, 0.0),
        UnaryOp::Gelu => (12, 0.0, 0.0),
        UnaryOp::GeluTanh => (13, 0.0, 0.0),
        UnaryOp::Silu => (14, 0.0, 0.0),
        UnaryOp::Square => (15, 0.0, 0.0),
        UnaryOp::Recip => (16, 0.0, 0.0),
        UnaryOp::Sign => (17, 0.0, 0.0),
        UnaryOp::Floor => (18, 0.0, 0.0),
        UnaryOp::Ceil => (19, 0.0, 0.0),
        UnaryOp::Round => (20, 0.0, 0.0),
        UnaryOp::Affine { mul, add } => (21, mul, add),
        UnaryOp::Powf(e) => (22, e, 0.0),
        UnaryOp::Clamp { min, max } => (23, min, max),
    }
}

pub(super) fn unary(s: &CudaStorage, layout: &Layout, op: UnaryOp) -> CudaStorage {
    // Dtypes were checked in `Tensor::unary`.
    let dtype = s.dtype();
    let n = layout.elem_count();
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, n), op.name());
    if n == 0 {
        return out;
    }
    let (c, p0, p1) = code(op);
    let size = dtype.size_in_bytes() as u64;
    let first = s.ptr() + layout.offset() as u64 * size;
    if dtype.is_float() && layout.is_contiguous() && first.is_multiple_of(16) {
        // The hot ops have kernels of their own (see `unary.cu`).
        let special = if matches!(c, 11..=14 | 21) { c.to_string() } else { String::new() };
        let f = expect_launch(
            dev.function(&SOURCE, &format!("unary_vec{special}_{}", cuda::suffix(dtype))),
            op.name(),
        );
        let (dst, n64) = (out.ptr(), n as i64);
        let stream = out.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&c).arg(&p0).arg(&p1).arg(&first).arg(&dst).arg(&n64);
        // SAFETY: n contiguous elements from the 16-byte-aligned `first`; `out` holds n.
        expect_launch(unsafe { b.launch(launch_cfg(n.div_ceil(16 / size as usize))) }, op.name());
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &format!("unary_{}", cuda::suffix(dtype))), op.name());
    let (arg, src, dst, n64) = (StridedArg::new(layout), s.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&c).arg(&p0).arg(&p1);
    // Integer kernels also take the parameters as integers (see `unary.cu`).
    let integral = p0.fract() == 0.0 && p1.fract() == 0.0 && p0.abs() < 9.2e18 && p1.abs() < 9.2e18;
    let (ip0, ip1, flag) = match op {
        // Bounds rounded inward, saturating like the CPU backend's `as` casts.
        UnaryOp::Clamp { min, max } => (min.ceil() as i64, max.floor() as i64, 1i32),
        _ => (p0 as i64, p1 as i64, integral as i32),
    };
    if !dtype.is_float() {
        if let UnaryOp::Clamp { min, max } = op {
            assert!(!min.is_nan() && !max.is_nan(), "clamp: NaN bound for an integer tensor");
        }
        b.arg(&ip0).arg(&ip1).arg(&flag);
    }
    b.arg(&arg).arg(&src).arg(&dst).arg(&n64);
    // SAFETY: argument types match the kernel's signature; `src` covers the layout and `dst`
    // holds n elements; both buffers outlive the queued work (the cache reuses blocks only in
    // stream order).
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op.name());
    out
}
