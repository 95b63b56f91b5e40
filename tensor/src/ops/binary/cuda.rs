//! CUDA dispatch for binary ops, comparisons and `where` (kernels in `binary.cu`).

use super::{BinaryOp, CmpOp};
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::{DType, Layout};
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("binary", "src/ops/binary/binary.cu");

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Maximum => 4,
        BinaryOp::Minimum => 5,
        BinaryOp::Pow => 6,
    }
}

fn cmp_code(op: CmpOp) -> i32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Ne => 1,
        CmpOp::Lt => 2,
        CmpOp::Le => 3,
        CmpOp::Gt => 4,
        CmpOp::Ge => 5,
    }
}

/// Launches `kernel(code, sa, sb, a, b, out, n)` into a new storage of `out_dtype`.
fn launch_pair(
    kernel: &str,
    code: i32,
    (a, la): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    out_dtype: DType,
    op: &str,
) -> CudaStorage {
    let n = la.elem_count();
    let dev = a.device();
    let out = expect_launch(CudaStorage::alloc(dev, out_dtype, n), op);
    if n == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, kernel), op);
    let (sa, sb, pa, pb, po, n64) =
        (StridedArg::new(la), StridedArg::new(lb), a.ptr(), b.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut builder = stream.launch_builder(&f);
    builder.arg(&code).arg(&sa).arg(&sb).arg(&pa).arg(&pb).arg(&po).arg(&n64);
    // SAFETY: types match the kernel; the layouts lie inside their buffers; `out` holds n.
    expect_launch(unsafe { builder.launch(launch_cfg(n)) }, op);
    out
}

pub(super) fn binary(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> CudaStorage {
    let dtype = a.dtype();
    match dtype {
        DType::I64 | DType::U32 | DType::U8 => assert!(
            !matches!(op, BinaryOp::Div | BinaryOp::Pow),
            "{}: not defined for integer tensors (dtype {dtype}); convert with .to_dtype(DType::F32)",
            op.name()
        ),
        DType::Bool => assert!(
            matches!(op, BinaryOp::Add | BinaryOp::Mul | BinaryOp::Maximum | BinaryOp::Minimum),
            "{}: not defined for bool tensors",
            op.name()
        ),
        _ => {}
    }
    if dtype.is_float() {
        if let Some(out) = binary_vectorized(a, la, b, lb, op) {
            return out;
        }
        if let Some(out) = binary_row_broadcast(a, la, b, lb, op) {
            return out;
        }
    }
    let kernel = format!("binary_{}", cuda::suffix(dtype));
    launch_pair(&kernel, binary_code(op), (a, la), (b, lb), dtype, op.name())
}

/// The 16-byte-vector kernel, when both operands are contiguous and 16-byte aligned.
fn binary_vectorized(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Option<CudaStorage> {
    let size = a.dtype().size_in_bytes() as u64;
    let pa = a.ptr() + la.offset() as u64 * size;
    let pb = b.ptr() + lb.offset() as u64 * size;
    if !(la.is_contiguous() && lb.is_contiguous() && pa.is_multiple_of(16) && pb.is_multiple_of(16)) {
        return None;
    }
    let n = la.elem_count();
    let dev = a.device();
    let out = expect_launch(CudaStorage::alloc(dev, a.dtype(), n), op.name());
    if n == 0 {
        return Some(out);
    }
    let f =
        expect_launch(dev.function(&SOURCE, &format!("binary_vec_{}", cuda::suffix(a.dtype()))), op.name());
    let (code, po, n64) = (binary_code(op), out.ptr(), n as i64);
    let stream = out.stream();
    let mut builder = stream.launch_builder(&f);
    builder.arg(&code).arg(&pa).arg(&pb).arg(&po).arg(&n64);
    let vectors = n.div_ceil(16 / size as usize);
    // SAFETY: both inputs hold n contiguous elements from 16-byte-aligned addresses; `out` is
    // a fresh block (512-byte aligned) of n elements.
    expect_launch(unsafe { builder.launch(launch_cfg(vectors)) }, op.name());
    Some(out)
}

/// `a = a op b` in `a`'s own memory with the 16-byte-vector kernel, when both are contiguous,
/// of one length and dtype (a float) and 16-byte aligned; false (nothing done) otherwise. Each
/// thread reads a vector of `a` before it writes that vector back, so the output may be `a`;
/// the arithmetic is the out-of-place kernel's, so the bits are `a.op(b)`'s.
pub(crate) fn binary_in_place(
    a: &mut CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> bool {
    let size = a.dtype().size_in_bytes() as u64;
    let pa = a.ptr() + la.offset() as u64 * size;
    let pb = b.ptr() + lb.offset() as u64 * size;
    let aligned = pa.is_multiple_of(16) && pb.is_multiple_of(16);
    if !(a.dtype().is_float()
        && a.dtype() == b.dtype()
        && la.is_contiguous()
        && lb.is_contiguous()
        && aligned)
    {
        return false;
    }
    let n = la.elem_count();
    if n == 0 {
        return true;
    }
    let dev = a.device().clone();
    let f =
        expect_launch(dev.function(&SOURCE, &format!("binary_vec_{}", cuda::suffix(a.dtype()))), op.name());
    let (code, n64) = (binary_code(op), n as i64);
    let stream = a.stream();
    let mut builder = stream.launch_builder(&f);
    builder.arg(&code).arg(&pa).arg(&pb).arg(&pa).arg(&n64);
    // SAFETY: both operands hold n contiguous elements from 16-byte-aligned addresses, and the
    // kernel reads each element of `a` before writing it (see above).
    expect_launch(unsafe { builder.launch(launch_cfg(n.div_ceil(16 / size as usize))) }, op.name());
    true
}

/// The length of the contiguous block that `l` repeats along its leading dims (strides 0
/// there, row-major contiguous after), if it repeats one at all: `[N]` broadcast to `[M, N]`
/// gives N.
fn repeated_block(l: &Layout) -> Option<usize> {
    let (dims, strides) = (l.dims(), l.strides());
    let (mut k, mut inner) = (dims.len(), 1usize);
    while k > 0 && strides[k - 1] != 0 && (dims[k - 1] == 1 || strides[k - 1] == inner) {
        inner *= dims[k - 1];
        k -= 1;
    }
    let repeats = dims[..k].iter().zip(&strides[..k]).all(|(&d, &s)| d == 1 || s == 0);
    (repeats && inner < l.elem_count()).then_some(inner)
}

/// The 16-byte-vector kernel for a contiguous operand with a broadcast one that repeats a
/// contiguous block (a bias added over rows), when the block is whole vectors and both are
/// 16-byte aligned.
fn binary_row_broadcast(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Option<CudaStorage> {
    let size = a.dtype().size_in_bytes();
    let vector = 16 / size;
    let addr = |s: &CudaStorage, l: &Layout| s.ptr() + (l.offset() * size) as u64;
    let (full, lf, row, lr, row_first) = if la.is_contiguous() {
        (a, la, b, lb, 0i32)
    } else if lb.is_contiguous() {
        (b, lb, a, la, 1i32)
    } else {
        return None;
    };
    let inner = repeated_block(lr)?;
    let (pf, pr) = (addr(full, lf), addr(row, lr));
    let n = lf.elem_count();
    if n == 0 || !inner.is_multiple_of(vector) || !pf.is_multiple_of(16) || !pr.is_multiple_of(16) {
        return None;
    }
    let dev = a.device();
    let out = expect_launch(CudaStorage::alloc(dev, a.dtype(), n), op.name());
    let f = expect_launch(
        dev.function(&SOURCE, &format!("binary_rowvec_{}", cuda::suffix(a.dtype()))),
        op.name(),
    );
    let (code, po) = (binary_code(op), out.ptr());
    let (nv, inner_vecs) = ((n / vector) as i64, (inner / vector) as i64);
    let stream = out.stream();
    let mut builder = stream.launch_builder(&f);
    builder.arg(&code).arg(&pf).arg(&pr).arg(&po).arg(&nv).arg(&inner_vecs).arg(&row_first);
    // SAFETY: `full` holds n contiguous elements and `row` `inner` of them, both from 16-byte
    // aligned addresses; n is a multiple of inner, itself of the vector width; `out` is fresh.
    expect_launch(unsafe { builder.launch(launch_cfg(n / vector)) }, op.name());
    Some(out)
}

/// ReLU's backward in one kernel: `g` where `x > threshold`, else 0 (the layouts broadcast to
/// one shape; the result is contiguous).
pub(super) fn threshold_backward(
    g: &CudaStorage,
    lg: &Layout,
    x: &CudaStorage,
    lx: &Layout,
    threshold: f64,
) -> CudaStorage {
    grad_pair("threshold_backward", (g, lg), (x, lx), threshold)
}

/// GELU's backward in one kernel: `g * gelu'(x)` (`tanh`: the tanh approximation's).
pub(super) fn gelu_backward(
    g: &CudaStorage,
    lg: &Layout,
    x: &CudaStorage,
    lx: &Layout,
    tanh: bool,
) -> CudaStorage {
    grad_pair(if tanh { "gelu_tanh_backward" } else { "gelu_backward" }, (g, lg), (x, lx), 0.0)
}

/// An output gradient combined with the op's input elementwise by kernel `op` (its strided
/// and `_vec` forms), with one scalar parameter; the result is contiguous.
fn grad_pair(
    op: &str,
    (g, lg): (&CudaStorage, &Layout),
    (x, lx): (&CudaStorage, &Layout),
    param: f64,
) -> CudaStorage {
    let (dtype, n, dev) = (g.dtype(), lg.elem_count(), g.device());
    let out = expect_launch(CudaStorage::alloc(dev, dtype, n), op);
    if n == 0 {
        return out;
    }
    let size = dtype.size_in_bytes() as u64;
    let (pg, px) = (g.ptr() + lg.offset() as u64 * size, x.ptr() + lx.offset() as u64 * size);
    let (po, n64) = (out.ptr(), n as i64);
    let stream = out.stream();
    let suffix = cuda::suffix(dtype);
    if lg.is_contiguous() && lx.is_contiguous() && pg.is_multiple_of(16) && px.is_multiple_of(16) {
        let f = expect_launch(dev.function(&SOURCE, &format!("{op}_vec_{suffix}")), op);
        let mut b = stream.launch_builder(&f);
        b.arg(&pg).arg(&px).arg(&po).arg(&n64).arg(&param);
        // SAFETY: both inputs hold n contiguous elements from 16-byte-aligned addresses; `out`
        // is a fresh block of n elements.
        expect_launch(unsafe { b.launch(launch_cfg(n.div_ceil(16 / size as usize))) }, op);
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &format!("{op}_{suffix}")), op);
    let (sg, sx, bg, bx) = (StridedArg::new(lg), StridedArg::new(lx), g.ptr(), x.ptr());
    let mut b = stream.launch_builder(&f);
    b.arg(&sg).arg(&sx).arg(&bg).arg(&bx).arg(&po).arg(&n64).arg(&param);
    // SAFETY: types match the kernel; the layouts lie inside their buffers; `out` holds n.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

pub(super) fn compare(a: &CudaStorage, la: &Layout, b: &CudaStorage, lb: &Layout, op: CmpOp) -> CudaStorage {
    let kernel = format!("cmp_{}", cuda::suffix(a.dtype()));
    launch_pair(&kernel, cmp_code(op), (a, la), (b, lb), DType::Bool, op.name())
}

pub(super) fn where_cond(
    (c, lc): (&CudaStorage, &Layout),
    (t, lt): (&CudaStorage, &Layout),
    (f, lf): (&CudaStorage, &Layout),
) -> CudaStorage {
    let n = lc.elem_count();
    let dtype = t.dtype();
    let dev = t.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, n), "where_cond");
    if n == 0 {
        return out;
    }
    let kernel = format!("where_b{}", dtype.size_in_bytes() * 8);
    let func = expect_launch(dev.function(&SOURCE, &kernel), "where_cond");
    let (sc, st, sf) = (StridedArg::new(lc), StridedArg::new(lt), StridedArg::new(lf));
    let (pc, pt, pf, po, n64) = (c.ptr(), t.ptr(), f.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut builder = stream.launch_builder(&func);
    builder.arg(&sc).arg(&st).arg(&sf).arg(&pc).arg(&pt).arg(&pf).arg(&po).arg(&n64);
    // SAFETY: as in `launch_pair`.
    expect_launch(unsafe { builder.launch(launch_cfg(n)) }, "where_cond");
    out
}
