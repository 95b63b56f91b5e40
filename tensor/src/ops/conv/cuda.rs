//! CUDA convolutions: through cuDNN when it loads (see `cudnn.rs`), else im2col (`conv.cu`) and
//! the cuBLAS GEMM of `ops/matmul/cuda.rs`.
//!
//! The fallback unfolds a chunk of samples at a time into a column matrix (bounded by
//! [`COL_BYTES`]) and multiplies each group with one strided-batched GEMM over the chunk's
//! samples. bf16/f16 accumulate in f32 as on the CPU: GEMMs run with f32 accumulation, the
//! input gradient's columns are kept in f32 until col2im has summed them, and the weight
//! gradient is summed over chunks in an f32 buffer and rounded once.

use super::cpu::Geometry;
use super::cudnn;
use crate::cuda::{self, expect_launch, launch_cfg, CudaDevice, CudaStorage, KernelSource};
use crate::ops::matmul::cuda::{gemm, Operand};
use crate::storage::Storage;
use crate::{DType, Tensor};
use cudarc::driver::{CudaStream, DeviceRepr, PushKernelArg};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

pub(crate) const SOURCE: KernelSource = cuda::source!("conv", "src/ops/conv/conv.cu");

/// Most bytes of column matrix the fallback unfolds at once.
const COL_BYTES: usize = 256 << 20;

fn enabled_flag() -> &'static AtomicBool {
    static ENABLED: OnceLock<AtomicBool> = OnceLock::new();
    ENABLED.get_or_init(|| {
        let disabled = std::env::var("OXTRAIN_DISABLE_CUDNN").is_ok_and(|v| !v.is_empty() && v != "0");
        AtomicBool::new(!disabled)
    })
}

/// Lets CUDA convolutions use cuDNN when it can be loaded (`torch.backends.cudnn.enabled`).
/// On by default; `OXTRAIN_DISABLE_CUDNN=1` in the environment turns it off at start. When off
/// (or when cuDNN is missing) convolutions run as im2col + cuBLAS GEMM. Process-wide.
pub fn set_cudnn_enabled(enabled: bool) {
    enabled_flag().store(enabled, Ordering::Relaxed);
}

/// Whether CUDA convolutions may use cuDNN (see [`set_cudnn_enabled`]).
pub fn cudnn_enabled() -> bool {
    enabled_flag().load(Ordering::Relaxed)
}

#[cfg(test)]
thread_local! {
    /// Tests pick a path per thread, since the process-wide switch is shared by tests that run
    /// in parallel.
    static TEST_CUDNN: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with cuDNN allowed or not on this thread (tests only).
#[cfg(test)]
pub(crate) fn with_cudnn<R>(allowed: bool, f: impl FnOnce() -> R) -> R {
    let previous = TEST_CUDNN.with(|c| c.replace(Some(allowed)));
    let out = f();
    TEST_CUDNN.with(|c| c.set(previous));
    out
}

/// Whether cuDNN would serve a convolution on `dev` now (tests report which path ran).
#[cfg(test)]
pub(crate) fn cudnn_available(dev: &Arc<CudaDevice>) -> bool {
    cudnn::handle(dev).is_some()
}

fn cudnn_handle(dev: &Arc<CudaDevice>) -> Option<Arc<std::sync::Mutex<cudnn::Handle>>> {
    #[cfg(test)]
    if let Some(allowed) = TEST_CUDNN.with(|c| c.get()) {
        return if allowed { cudnn::handle(dev) } else { None };
    }
    if cudnn_enabled() {
        cudnn::handle(dev)
    } else {
        None
    }
}

/// Runs `cudnn_call` when cuDNN serves this device, else (or when cuDNN offers no algorithm)
/// `fallback`, saying once per op and reason on stderr that the slower path runs.
fn cudnn_or_fallback(
    dev: &Arc<CudaDevice>,
    op: &'static str,
    x: &Tensor,
    cudnn_call: impl FnOnce(&std::sync::Mutex<cudnn::Handle>) -> Option<Tensor>,
    fallback: impl FnOnce() -> Tensor,
) -> Tensor {
    static WARNED: std::sync::Mutex<Vec<(&'static str, bool)>> = std::sync::Mutex::new(Vec::new());
    let handle = cudnn_handle(dev);
    let loaded = handle.is_some();
    if let Some(y) = handle.and_then(|h| cudnn_call(&h)) {
        return y;
    }
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if cudnn_enabled() && !warned.contains(&(op, loaded)) {
        warned.push((op, loaded));
        let why = if loaded {
            format!("cuDNN offers no algorithm for {} with strides {:?}", x.dtype(), x.strides())
        } else {
            "cuDNN is not available".to_string()
        };
        eprintln!("oxtrain: {op} runs on the im2col fallback: {why}");
    }
    fallback()
}

/// Shapes of the convolution for `conv.cu` (`struct ConvArgs`), samples `n0..n0 + count`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ConvArgs {
    n0: i64,
    count: i64,
    c: i64,
    h: i64,
    w: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    stride_h: i64,
    stride_w: i64,
    pad_h: i64,
    pad_w: i64,
    dil_h: i64,
    dil_w: i64,
}

// SAFETY: plain old data with the C layout `conv.cu` declares.
unsafe impl DeviceRepr for ConvArgs {}

impl ConvArgs {
    fn new(g: &Geometry, n0: usize, count: usize) -> ConvArgs {
        let i = |v: usize| v as i64;
        ConvArgs {
            n0: i(n0),
            count: i(count),
            c: i(g.c),
            h: i(g.h),
            w: i(g.w),
            kh: i(g.kh),
            kw: i(g.kw),
            oh: i(g.oh),
            ow: i(g.ow),
            stride_h: i(g.stride[0]),
            stride_w: i(g.stride[1]),
            pad_h: i(g.padding[0]),
            pad_w: i(g.padding[1]),
            dil_h: i(g.dilation[0]),
            dil_w: i(g.dilation[1]),
        }
    }
}

/// The device of a CUDA tensor.
pub(super) fn device_of(t: &Tensor, op: &str) -> Arc<CudaDevice> {
    match &*t.storage() {
        Storage::Cuda(s) => s.device().clone(),
        Storage::Cpu(_) => unreachable!("{op}: a CUDA tensor with host storage"),
    }
}

/// The address of the tensor's storage, plus `elements` of its dtype. The tensor must stay alive
/// until the work reading it is queued (blocks are reused in stream order after that).
pub(super) fn ptr_at(t: &Tensor, elements: usize) -> u64 {
    match &*t.storage() {
        Storage::Cuda(s) => s.ptr() + (elements * s.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("a CUDA tensor with host storage"),
    }
}

/// The address of the tensor's first element (its layout's offset included).
pub(super) fn first_ptr(t: &Tensor) -> u64 {
    ptr_at(t, t.layout().offset())
}

/// An uninitialised contiguous tensor (every element is written before it is read).
pub(super) fn empty(dev: &Arc<CudaDevice>, dtype: DType, shape: &[usize], op: &str) -> Tensor {
    let n = shape.iter().product();
    let s = CudaStorage::alloc(dev, dtype, n).unwrap_or_else(|e| panic!("{op}: {e}"));
    Tensor::from_storage(Storage::Cuda(s), shape)
}

pub(super) fn zeros(dev: &Arc<CudaDevice>, dtype: DType, shape: &[usize], op: &str) -> Tensor {
    let n = shape.iter().product();
    let s = CudaStorage::zeros(dev, dtype, n).unwrap_or_else(|e| panic!("{op}: {e}"));
    Tensor::from_storage(Storage::Cuda(s), shape)
}

pub(super) fn current_stream(dev: &Arc<CudaDevice>, op: &str) -> Arc<CudaStream> {
    cuda::Stream::current(dev.ordinal()).unwrap_or_else(|e| panic!("{op}: {e}")).raw().clone()
}

/// The dtype gradients are accumulated in: f32 for the 16-bit types.
fn accumulator(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Samples per chunk, so that the chunk's column matrix stays under [`COL_BYTES`].
fn chunk_samples(g: &Geometry, elem_bytes: usize) -> usize {
    let per_sample = g.c * g.kh * g.kw * g.oh * g.ow * elem_bytes;
    (COL_BYTES / per_sample.max(1)).clamp(1, g.n.max(1))
}

/// Unfolds samples `n0..n0 + count` of `x` (any strides) into `col`, element
/// `[nl * col_n + row * col_row + pixel]`.
#[allow(clippy::too_many_arguments)]
fn im2col(
    x: &Tensor,
    g: &Geometry,
    n0: usize,
    count: usize,
    col: u64,
    col_n: usize,
    col_row: usize,
    op: &str,
) {
    let dev = device_of(x, op);
    let f = expect_launch(dev.function(&SOURCE, &format!("im2col_{}", cuda::suffix(x.dtype()))), op);
    let st: Vec<i64> = x.strides().iter().map(|&s| s as i64).collect();
    let (xp, x_off, args) = (ptr_at(x, 0), x.layout().offset() as i64, ConvArgs::new(g, n0, count));
    let (col_n, col_row) = (col_n as i64, col_row as i64);
    let total = count * g.c * g.kh * g.kw * g.oh * g.ow;
    let stream = current_stream(&dev, op);
    let mut b = stream.launch_builder(&f);
    b.arg(&xp).arg(&x_off).arg(&st[0]).arg(&st[1]).arg(&st[2]).arg(&st[3]);
    b.arg(&args).arg(&col).arg(&col_n).arg(&col_row);
    // SAFETY: argument types match `im2col_*`; x's strides cover its elements, and `col` holds
    // `count` samples of the given strides (the callers size it).
    expect_launch(unsafe { b.launch(launch_cfg(total)) }, op);
}

/// Folds the column gradients of samples `n0..n0 + count` back onto `dx` (contiguous NCHW).
fn col2im(col: u64, col_n: usize, g: &Geometry, n0: usize, count: usize, dx: &Tensor, op: &str) {
    let dev = device_of(dx, op);
    let f = expect_launch(dev.function(&SOURCE, &format!("col2im_{}", cuda::suffix(dx.dtype()))), op);
    let (col_n, args, dxp) = (col_n as i64, ConvArgs::new(g, n0, count), first_ptr(dx));
    let total = count * g.c * g.h * g.w;
    let stream = current_stream(&dev, op);
    let mut b = stream.launch_builder(&f);
    b.arg(&col).arg(&col_n).arg(&args).arg(&dxp);
    // SAFETY: argument types match `col2im_*`; `col` holds the chunk's column gradients in the
    // accumulator dtype and `dx` the whole contiguous input gradient.
    expect_launch(unsafe { b.launch(launch_cfg(total)) }, op);
}

/// `conv2d` on CUDA, bias added after the convolution (as PyTorch does on the GPU).
pub(super) fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d";
    let dev = device_of(x, OP);
    let y = if x.elem_count() == 0 || w.elem_count() == 0 || g.n * g.o * g.oh * g.ow == 0 {
        zeros(&dev, x.dtype(), &[g.n, g.o, g.oh, g.ow], OP)
    } else {
        cudnn_or_fallback(&dev, OP, x, |h| cudnn::forward(h, x, w, g), || forward_fallback(x, w, g))
    };
    match bias {
        Some(b) => y.add(&b.reshape([1, g.o, 1, 1])),
        None => y,
    }
}

pub(super) fn backward_input(gy: &Tensor, w: &Tensor, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d_backward_input";
    let dev = device_of(gy, OP);
    if gy.elem_count() == 0 || w.elem_count() == 0 || g.n * g.c * g.h * g.w == 0 {
        return zeros(&dev, gy.dtype(), &[g.n, g.c, g.h, g.w], OP);
    }
    cudnn_or_fallback(
        &dev,
        OP,
        gy,
        |h| cudnn::backward_input(h, gy, w, g),
        || backward_input_fallback(gy, w, g),
    )
}

pub(super) fn backward_weight(gy: &Tensor, x: &Tensor, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d_backward_weight";
    let dev = device_of(gy, OP);
    let shape = [g.o, g.c / g.groups, g.kh, g.kw];
    if gy.elem_count() == 0 || x.elem_count() == 0 || shape.iter().product::<usize>() == 0 {
        return zeros(&dev, gy.dtype(), &shape, OP);
    }
    cudnn_or_fallback(
        &dev,
        OP,
        x,
        |h| cudnn::backward_weight(h, gy, x, g),
        || backward_weight_fallback(gy, x, g),
    )
}

/// `y [N, O, OH, OW] = W_g [O/g, patch] @ col_g [patch, OH*OW]` per sample and group.
fn forward_fallback(x: &Tensor, w: &Tensor, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d";
    let (dtype, dev) = (x.dtype(), device_of(x, OP));
    let es = dtype.size_in_bytes();
    let (l, patch, og) = (g.oh * g.ow, g.c / g.groups * g.kh * g.kw, g.o / g.groups);
    let rows = g.groups * patch;
    let w = w.contiguous();
    let y = empty(&dev, dtype, &[g.n, g.o, g.oh, g.ow], OP);
    let nb = chunk_samples(g, es);
    let col = empty(&dev, dtype, &[nb * rows * l], OP);
    let stream = current_stream(&dev, OP);
    let op = |ptr, rs, cs, batch_stride| Operand { ptr, dtype, rs, cs, batch_stride };
    for n0 in (0..g.n).step_by(nb) {
        let count = nb.min(g.n - n0);
        im2col(x, g, n0, count, first_ptr(&col), rows * l, l, OP);
        for gi in 0..g.groups {
            let a = op(ptr_at(&w, gi * og * patch), patch, 1, 0);
            let b = op(ptr_at(&col, gi * patch * l), l, 1, rows * l);
            let c = op(ptr_at(&y, (n0 * g.o + gi * og) * l), l, 1, g.o * l);
            gemm(&dev, &stream, OP, (og, l, patch), count, a, b, c, false);
        }
    }
    y
}

/// `col_g [patch, OH*OW] = W_g^T @ grad_y_g` per sample and group (in f32 for 16-bit types),
/// then col2im.
fn backward_input_fallback(gy: &Tensor, w: &Tensor, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d_backward_input";
    let (dtype, dev) = (gy.dtype(), device_of(gy, OP));
    let acc = accumulator(dtype);
    let (l, patch, og) = (g.oh * g.ow, g.c / g.groups * g.kh * g.kw, g.o / g.groups);
    let rows = g.groups * patch;
    let (gy, w) = (gy.contiguous(), w.contiguous());
    let dx = empty(&dev, dtype, &[g.n, g.c, g.h, g.w], OP);
    let nb = chunk_samples(g, acc.size_in_bytes());
    let col = empty(&dev, acc, &[nb * rows * l], OP);
    let stream = current_stream(&dev, OP);
    let op = |ptr, dtype, rs, cs, batch_stride| Operand { ptr, dtype, rs, cs, batch_stride };
    for n0 in (0..g.n).step_by(nb) {
        let count = nb.min(g.n - n0);
        for gi in 0..g.groups {
            // W_g^T: the [O/g, patch] block read with swapped strides.
            let a = op(ptr_at(&w, gi * og * patch), dtype, 1, patch, 0);
            let b = op(ptr_at(&gy, (n0 * g.o + gi * og) * l), dtype, l, 1, g.o * l);
            let c = op(ptr_at(&col, gi * patch * l), acc, l, 1, rows * l);
            gemm(&dev, &stream, OP, (patch, l, og), count, a, b, c, false);
        }
        col2im(first_ptr(&col), rows * l, g, n0, count, &dx, OP);
    }
    dx
}

/// `grad_w_g [O/g, patch] = sum over samples of grad_y_g [O/g, OH*OW] @ col_g^T`. Each chunk's
/// samples sit side by side in one column matrix `[patch rows, count * OH*OW]`, so a chunk is
/// one GEMM per group, added onto an f32 (f64) accumulator.
fn backward_weight_fallback(gy: &Tensor, x: &Tensor, g: &Geometry) -> Tensor {
    const OP: &str = "conv2d_backward_weight";
    let (dtype, dev) = (gy.dtype(), device_of(gy, OP));
    let acc = accumulator(dtype);
    let (l, patch, og) = (g.oh * g.ow, g.c / g.groups * g.kh * g.kw, g.o / g.groups);
    let rows = g.groups * patch;
    let dw = empty(&dev, acc, &[g.o, g.c / g.groups, g.kh, g.kw], OP);
    let nb = chunk_samples(g, dtype.size_in_bytes());
    let col = empty(&dev, dtype, &[nb * rows * l], OP);
    let stream = current_stream(&dev, OP);
    let op = |ptr, dtype, rs, cs| Operand { ptr, dtype, rs, cs, batch_stride: 0 };
    for n0 in (0..g.n).step_by(nb) {
        let count = nb.min(g.n - n0);
        let k = count * l;
        // grad_y of the chunk as [O, count * OH*OW]: output channel major.
        let gy_chunk = gy.narrow(0, n0, count).transpose(0, 1).contiguous();
        im2col(x, g, n0, count, first_ptr(&col), l, k, OP);
        for gi in 0..g.groups {
            let a = op(ptr_at(&gy_chunk, gi * og * k), dtype, k, 1);
            // col_g^T: the [patch, k] block read with swapped strides.
            let b = op(ptr_at(&col, gi * patch * k), dtype, 1, k);
            let c = op(ptr_at(&dw, gi * og * patch), acc, patch, 1);
            gemm(&dev, &stream, OP, (og, patch, k), 1, a, b, c, n0 > 0);
        }
    }
    dw.to_dtype(dtype)
}
