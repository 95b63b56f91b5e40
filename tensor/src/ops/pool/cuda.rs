//! CUDA dispatch for pooling (kernels in `pool.cu`). The kernels recompute each window from the
//! axis's [`AxisRule`], so nothing but the tensors lives on the device.

use super::{AxisRule, Windows};
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource};
use crate::storage::CpuStorage;
use crate::{DType, Layout};
use cudarc::driver::{DeviceRepr, PushKernelArg};

pub(crate) const SOURCE: KernelSource = cuda::source!("pool", "src/ops/pool/pool.cu");

/// One axis's window rule, as `struct PoolAxis` in `pool.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CudaAxis {
    kind: i32,
    count_include_pad: i32,
    input: i64,
    output: i64,
    kernel: i64,
    stride: i64,
    padding: i64,
    dilation: i64,
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for CudaAxis {}

impl CudaAxis {
    fn new(rule: AxisRule, input: usize, output: usize) -> CudaAxis {
        let (kind, kernel, stride, padding, dilation, count_include_pad) = match rule {
            AxisRule::Max { kernel, stride, padding, dilation } => {
                (0, kernel, stride, padding, dilation, false)
            }
            AxisRule::Avg { kernel, stride, padding, count_include_pad } => {
                (1, kernel, stride, padding, 1, count_include_pad)
            }
            AxisRule::Adaptive => (2, 1, 1, 0, 1, false),
        };
        CudaAxis {
            kind,
            count_include_pad: count_include_pad as i32,
            input: input as i64,
            output: output as i64,
            kernel: kernel as i64,
            stride: stride as i64,
            padding: padding as i64,
            dilation: dilation as i64,
        }
    }
}

/// The rows' and columns' rules of `win`.
fn axes(win: &Windows) -> (CudaAxis, CudaAxis) {
    let [oh, ow] = win.output();
    (CudaAxis::new(win.rules[0], win.input[0], oh), CudaAxis::new(win.rules[1], win.input[1], ow))
}

/// Where a strided `[N, C, H, W]` layout's planes sit, as `struct PlaneLayout` in `pool.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PlaneLayout {
    offset: i64,
    strides: [i64; 4],
    channels: i64,
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for PlaneLayout {}

impl PlaneLayout {
    fn new(layout: &Layout) -> PlaneLayout {
        let s = layout.strides();
        PlaneLayout {
            offset: layout.offset() as i64,
            strides: [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64],
            channels: layout.dims()[1] as i64,
        }
    }
}

/// Panics as the CPU backend's dispatch does for a non-float tensor.
fn float_kernel(op: &str, base: &str, dtype: DType) -> String {
    assert!(dtype.is_float(), "{op}: expected a floating-point tensor, got dtype {dtype}");
    format!("{base}_{}", cuda::suffix(dtype))
}

fn planes(layout: &Layout) -> usize {
    layout.dims()[0] * layout.dims()[1]
}

/// What max pooling records of each window's maximum: its flat index into the H*W plane (i64)
/// or its offset inside the window (u8, see `window_offset` in `pool.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Argmax {
    Index,
    Offset,
}

/// Max pooling; with `nhwc` both results are written channels-last (the caller's layout).
pub(super) fn max_pool(
    s: &CudaStorage,
    layout: &Layout,
    win: &Windows,
    (nhwc, argmax): (bool, Argmax),
    op: &str,
) -> (CudaStorage, CudaStorage) {
    let kernel = float_kernel(op, "max_pool", s.dtype());
    let [oh, ow] = win.output();
    let n = planes(layout) * oh * ow;
    let dev = s.device();
    let values = expect_launch(CudaStorage::alloc(dev, s.dtype(), n), op);
    let index_dtype = if argmax == Argmax::Offset { DType::U8 } else { DType::I64 };
    let indices = expect_launch(CudaStorage::alloc(dev, index_dtype, n), op);
    if n == 0 {
        return (values, indices);
    }
    if nhwc && argmax == Argmax::Offset && max_pool_offsets_cl(s, layout, win, (&values, &indices), op) {
        return (values, indices);
    }
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let ((rows, cols), lx) = (axes(win), PlaneLayout::new(layout));
    let (x, pv, n64) = (s.ptr(), values.ptr(), n as i64);
    let (pi, po) = match argmax {
        Argmax::Index => (indices.ptr(), 0u64),
        Argmax::Offset => (0u64, indices.ptr()),
    };
    let stream = values.stream();
    let mut b = stream.launch_builder(&f);
    let nhwc = nhwc as i32;
    b.arg(&rows).arg(&cols).arg(&lx).arg(&x).arg(&pv).arg(&pi).arg(&po).arg(&n64).arg(&nhwc);
    // SAFETY: types match the kernel; every window lies inside the input plane, which the
    // layout places inside `s`; `values` and `indices` hold n elements (the one of idx and off
    // that is not 0 is written).
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    (values, indices)
}

/// Whether 16-byte vectors of `channels` (`dtype`) fit a dense channels-last `layout` whose
/// element counts fit 32-bit arithmetic (`counts`): the vector kernels' preconditions.
fn vector_case(layout: &Layout, dtype: DType, counts: &[usize]) -> Option<usize> {
    let vec = 16 / dtype.size_in_bytes();
    let fits = counts.iter().all(|&c| i32::try_from(c).is_ok());
    (dense_channels_last(layout) && layout.dims()[1].is_multiple_of(vec) && fits).then_some(vec)
}

/// Max pooling with window offsets of a dense channels-last input with whole 16-byte channel
/// vectors (`max_pool_offsets_cl`); `false` when the case is not that one.
fn max_pool_offsets_cl(
    s: &CudaStorage,
    layout: &Layout,
    win: &Windows,
    (values, offsets): (&CudaStorage, &CudaStorage),
    op: &str,
) -> bool {
    let dtype = s.dtype();
    let [oh, ow] = win.output();
    let n_out = planes(layout) * oh * ow;
    let Some(vec) = vector_case(layout, dtype, &[layout.elem_count(), n_out]) else { return false };
    let dev = s.device();
    let f = expect_launch(dev.function(&SOURCE, &format!("max_pool_offsets_cl_{}", cuda::suffix(dtype))), op);
    let (rows, cols) = axes(win);
    let channels = layout.dims()[1];
    let (x, pv, po) = (s.ptr(), values.ptr(), offsets.ptr());
    let (n, groups, ch) = ((n_out / vec) as i32, (channels / vec) as i32, channels as i32);
    let stream = values.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rows).arg(&cols).arg(&x).arg(&pv).arg(&po).arg(&n).arg(&groups).arg(&ch);
    // SAFETY: types match; x is dense channels-last [N, C, H, W] from offset 0 (16-byte aligned
    // as every allocation) and the kernel reads only inside its windows; `values` and `offsets`
    // hold N * C * OH * OW elements, written channels-last, one vector of channels per thread.
    expect_launch(unsafe { b.launch(launch_cfg(n_out / vec)) }, op);
    true
}

/// The divisor override as the kernels take it: 0 for none (an override of 0 is rejected).
fn divisor(win: &Windows) -> i64 {
    win.divisor_override.unwrap_or(0) as i64
}

pub(super) fn avg_pool(s: &CudaStorage, layout: &Layout, win: &Windows, op: &str) -> CudaStorage {
    let kernel = float_kernel(op, "avg_pool", s.dtype());
    let [oh, ow] = win.output();
    let n = planes(layout) * oh * ow;
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, s.dtype(), n), op);
    if n == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let ((rows, cols), lx, d) = (axes(win), PlaneLayout::new(layout), divisor(win));
    let (x, po, n64) = (s.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rows).arg(&cols).arg(&d).arg(&lx).arg(&x).arg(&po).arg(&n64);
    // SAFETY: as in `max_pool`.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// `grad` (with `layout`, the output gradient's) spread back over the input planes.
pub(super) fn avg_pool_backward(grad: &CudaStorage, layout: &Layout, win: &Windows, op: &str) -> CudaStorage {
    let kernel = float_kernel(op, "avg_pool_backward", grad.dtype());
    let [h, w] = win.input;
    let n = planes(layout) * h * w;
    let dev = grad.device();
    let out = expect_launch(CudaStorage::alloc(dev, grad.dtype(), n), op);
    if n == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let ((rows, cols), lg, d) = (axes(win), PlaneLayout::new(layout), divisor(win));
    let (g, po, n64) = (grad.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rows).arg(&cols).arg(&d).arg(&lg).arg(&g).arg(&po).arg(&n64);
    // SAFETY: types match; the kernel reads only outputs 0..oh, 0..ow of each gradient plane,
    // which the layout places inside `grad`; `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

pub(super) fn max_pool_backward(
    grad: &CudaStorage,
    grad_layout: &Layout,
    indices: &CudaStorage,
    index_layout: &Layout,
    input: [usize; 2],
    op: &str,
) -> CudaStorage {
    let dtype = grad.dtype();
    let kernel = float_kernel(op, "max_pool_backward", dtype);
    let planes = planes(grad_layout);
    let plane = input[0] * input[1];
    let dev = grad.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, planes * plane), op);
    if planes * plane == 0 {
        return out;
    }
    // f16/bf16 accumulate in an f32 scratch; f32 and f64 accumulate in the output itself.
    let scratch = match dtype {
        DType::F16 | DType::BF16 => {
            Some(expect_launch(CudaStorage::alloc(dev, DType::F32, planes * plane), op))
        }
        _ => None,
    };
    let err = expect_launch(CudaStorage::zeros(dev, DType::I64, 2), op);
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let (lg, li) = (PlaneLayout::new(grad_layout), PlaneLayout::new(index_layout));
    let [oh, ow] = [grad_layout.dims()[2] as i64, grad_layout.dims()[3] as i64];
    let acc = scratch.as_ref().map_or(out.ptr(), |s| s.ptr());
    let (g, i, po, pe) = (grad.ptr(), indices.ptr(), out.ptr(), err.ptr());
    let (planes64, plane64) = (planes as i64, plane as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&lg)
        .arg(&li)
        .arg(&g)
        .arg(&i)
        .arg(&acc)
        .arg(&po)
        .arg(&planes64)
        .arg(&oh)
        .arg(&ow)
        .arg(&plane64)
        .arg(&pe);
    // SAFETY: types match; the layouts place every (plane, r, c) inside `grad` and `indices`;
    // `acc` and `out` hold planes * plane elements; indices outside 0..plane are not written.
    expect_launch(unsafe { b.launch(launch_cfg(planes)) }, op);
    // Like the CPU kernel, an index outside the plane is a panic; reading the flag waits for
    // the kernel.
    let flag = expect_launch(err.to_cpu(), op);
    if let CpuStorage::I64(v) = &flag {
        assert!(
            v[0] == 0,
            "{op}: index {} is out of range for an input plane of {}x{}",
            v[1],
            input[0],
            input[1]
        );
    }
    out
}

/// The max-pooling gradient gathered per input element (kernel `max_pool_backward_gather`):
/// each element adds, in row-major order, the gradients of the covering windows whose argmax
/// (`indices`, as `argmax` says) names it. `nhwc` numbers the threads (and lays out the result)
/// channels-last.
#[allow(clippy::too_many_arguments)]
pub(super) fn max_pool_backward_gather(
    grad: &CudaStorage,
    grad_layout: &Layout,
    (indices, index_layout, argmax): (&CudaStorage, &Layout, Argmax),
    win: &Windows,
    nhwc: bool,
    op: &str,
) -> CudaStorage {
    let kernel = float_kernel(op, "max_pool_backward_gather", grad.dtype());
    let [h, w] = win.input;
    let n = planes(grad_layout) * h * w;
    let dev = grad.device();
    let out = expect_launch(CudaStorage::alloc(dev, grad.dtype(), n), op);
    if n == 0 {
        return out;
    }
    if nhwc && max_pool_backward_cl(grad, grad_layout, (indices, index_layout, argmax), win, &out, op) {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let ((rows, cols), lg, li) = (axes(win), PlaneLayout::new(grad_layout), PlaneLayout::new(index_layout));
    let (pi, po) = match argmax {
        Argmax::Index => (indices.ptr(), 0u64),
        Argmax::Offset => (0u64, indices.ptr()),
    };
    let (g, out_ptr, n64, nhwc) = (grad.ptr(), out.ptr(), n as i64, nhwc as i32);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rows).arg(&cols).arg(&lg).arg(&li).arg(&g).arg(&pi).arg(&po).arg(&out_ptr).arg(&n64).arg(&nhwc);
    // SAFETY: types match; the kernel reads only the covering outputs 0..oh, 0..ow of each
    // plane, which the layouts place inside `grad` and `indices`; `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// Whether `l` is a dense channels-last `[N, C, H, W]` (strides `(H*W*C, 1, W*C, C)`, offset 0).
fn dense_channels_last(l: &Layout) -> bool {
    let (d, s) = (l.dims(), l.strides());
    l.offset() == 0 && s == [d[2] * d[3] * d[1], 1, d[3] * d[1], d[1]]
}

/// The gather for dense channels-last gradients and argmaxes with whole 16-byte channel
/// vectors and 32-bit sizes (`max_pool_backward_cl`, `max_pool_offsets_backward_cl`: a vector
/// of channels per thread); `false` when the case is not that one (the general kernel then
/// runs).
fn max_pool_backward_cl(
    grad: &CudaStorage,
    grad_layout: &Layout,
    (indices, index_layout, argmax): (&CudaStorage, &Layout, Argmax),
    win: &Windows,
    out: &CudaStorage,
    op: &str,
) -> bool {
    let dtype = grad.dtype();
    let channels = grad_layout.dims()[1];
    let [h, w] = win.input;
    let n_in = grad_layout.dims()[0] * channels * h * w;
    let Some(vec) = vector_case(grad_layout, dtype, &[n_in, grad_layout.elem_count()]) else { return false };
    if !dense_channels_last(index_layout) {
        return false;
    }
    let dev = grad.device();
    let base = match argmax {
        Argmax::Index => "max_pool_backward_cl",
        Argmax::Offset => "max_pool_offsets_backward_cl",
    };
    let f = expect_launch(dev.function(&SOURCE, &format!("{base}_{}", cuda::suffix(dtype))), op);
    let (rows, cols) = axes(win);
    let (g, i, po) = (grad.ptr(), indices.ptr(), out.ptr());
    let (n, groups, ch) = ((n_in / vec) as i32, (channels / vec) as i32, channels as i32);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rows).arg(&cols).arg(&g).arg(&i).arg(&po).arg(&n).arg(&groups).arg(&ch);
    // SAFETY: types match; g and the argmaxes are dense channels-last [N, C, OH, OW] from
    // offset 0 and the kernel reads only their covering outputs; `out` holds N * C * H * W
    // elements, written channels-last, one vector of channels per thread.
    expect_launch(unsafe { b.launch(launch_cfg(n_in / vec)) }, op);
    true
}
