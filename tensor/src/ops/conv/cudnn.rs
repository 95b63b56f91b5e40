//! Convolutions through cuDNN's legacy API (cudnnConvolutionForward / BackwardData /
//! BackwardFilter), with algorithms chosen once per shape (`cudnn_plan.rs`) and workspaces from
//! our caching allocator.
//!
//! Tensors are described with explicit strides, so an NCHW tensor and a channels-last (NHWC)
//! view of the same logical shape are both passed as they lie; filters only know the two packed
//! formats, so a convolution runs wholly in one of them: channels-last when the activation
//! (input, or grad_output for the input gradient) is channels-last, else NCHW. Other strides are
//! copied into the chosen format first. The output has that format too, as in PyTorch.

use super::cpu::Geometry;
use super::cuda::{current_stream, device_of, empty, first_ptr};
use super::cudnn_plan::{plan, Algo};
use crate::cuda::libs::{self, CudaLib};
use crate::cuda::CudaDevice;
use crate::ops::matmul::cuda::{allow_tf32, bind};
use crate::{DType, Tensor};
use cudarc::cudnn::{result as dnn, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// A cuDNN handle of one device; used under its mutex, bound to the current stream each call.
pub(crate) struct Handle {
    raw: sys::cudnnHandle_t,
}

// SAFETY: the handle is only used under its mutex.
unsafe impl Send for Handle {}

/// The device's cuDNN handle, or `None` when cuDNN cannot be loaded (or fails to start, which
/// is reported once on stderr); the answer is kept for the life of the process.
pub(crate) fn handle(dev: &Arc<CudaDevice>) -> Option<Arc<Mutex<Handle>>> {
    type PerDevice = HashMap<usize, Option<Arc<Mutex<Handle>>>>;
    static HANDLES: OnceLock<Mutex<PerDevice>> = OnceLock::new();
    let mut handles = HANDLES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    handles.entry(dev.ordinal()).or_insert_with(|| create(dev)).clone()
}

fn create(dev: &Arc<CudaDevice>) -> Option<Arc<Mutex<Handle>>> {
    // Checked first: cudarc panics with only the library's name when it cannot load it.
    if !libs::loadable(CudaLib::Cudnn) {
        return None;
    }
    // Some cuDNN engines call cuBLAS: load it from our search folders before cuDNN looks.
    libs::preload(CudaLib::CublasLt);
    libs::preload(CudaLib::Cublas);
    bind(dev, "conv2d");
    match dnn::create_handle() {
        Ok(raw) => Some(Arc::new(Mutex::new(Handle { raw }))),
        Err(e) => {
            eprintln!(
                "oxtrain: cuDNN was loaded but cudnnCreate failed ({e:?}); CUDA convolutions use im2col + cuBLAS ({})",
                libs::describe_search(CudaLib::Cudnn)
            );
            None
        }
    }
}

fn data_type(dtype: DType) -> sys::cudnnDataType_t {
    match dtype {
        DType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F64 => sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
        DType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => unreachable!("convolutions were checked to be float, got {other}"),
    }
}

/// Whether a 4-D tensor lies packed in NHWC order (and not also in NCHW order, which wins).
fn is_channels_last(t: &Tensor) -> bool {
    !t.is_contiguous() && t.permute([0, 2, 3, 1]).is_contiguous()
}

/// The tensor with the same logical NCHW shape, packed in the chosen order (copied if needed).
fn packed(t: &Tensor, channels_last: bool) -> Tensor {
    if !channels_last {
        t.contiguous()
    } else if t.permute([0, 2, 3, 1]).is_contiguous() {
        t.clone()
    } else {
        t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
    }
}

/// An uninitialised `[n, c, h, w]` tensor stored in the chosen order.
fn empty_packed(dev: &Arc<CudaDevice>, dtype: DType, [n, c, h, w]: [usize; 4], cl: bool, op: &str) -> Tensor {
    if cl {
        empty(dev, dtype, &[n, h, w, c], op).permute([0, 3, 1, 2])
    } else {
        empty(dev, dtype, &[n, c, h, w], op)
    }
}

/// The three convolutions cuDNN computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Direction {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `dy` and `w`.
    BackwardData,
    /// `dw` from `x` and `dy`.
    BackwardFilter,
}

/// Device addresses of the convolution's three tensors (`y` is `dy` for the backward
/// directions); the direction says which one is written.
pub(super) struct Buffers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
}

/// The descriptors of one convolution, destroyed on drop.
pub(super) struct Descriptors {
    pub x: sys::cudnnTensorDescriptor_t,
    pub w: sys::cudnnFilterDescriptor_t,
    pub y: sys::cudnnTensorDescriptor_t,
    pub conv: sys::cudnnConvolutionDescriptor_t,
    pub op: &'static str,
    pub shapes: String,
    pub geometry: Geometry,
    pub channels_last: bool,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: created in `Descriptors::new` and destroyed once, here.
        unsafe {
            let _ = dnn::destroy_tensor_descriptor(self.x);
            let _ = dnn::destroy_filter_descriptor(self.w);
            let _ = dnn::destroy_tensor_descriptor(self.y);
            let _ = dnn::destroy_convolution_descriptor(self.conv);
        }
    }
}

fn c_int(v: usize, op: &str) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("{op}: size {v} is past cuDNN's 32-bit limit"))
}

impl Descriptors {
    /// Panics with the op, the shapes and the status when a cuDNN call fails.
    pub(super) fn check(&self, what: &str, r: Result<(), dnn::CudnnError>) {
        r.unwrap_or_else(|e| panic!("{}: {what} failed for {}: {e:?}", self.op, self.shapes));
    }

    fn new(op: &'static str, dtype: DType, g: &Geometry, cl: bool) -> Descriptors {
        let shapes = format!(
            "input [{}, {}, {}, {}], weight [{}, {}, {}, {}], output [{}, {}, {}, {}], stride {:?}, padding {:?}, dilation {:?}, groups {} ({dtype}{})",
            g.n, g.c, g.h, g.w, g.o, g.c / g.groups, g.kh, g.kw, g.n, g.o, g.oh, g.ow,
            g.stride, g.padding, g.dilation, g.groups, if cl { ", channels-last" } else { "" }
        );
        fn create<T>(op: &str, r: Result<T, dnn::CudnnError>) -> T {
            r.unwrap_or_else(|e| panic!("{op}: creating a cuDNN descriptor failed: {e:?}"))
        }
        let d = Descriptors {
            x: create(op, dnn::create_tensor_descriptor()),
            w: create(op, dnn::create_filter_descriptor()),
            y: create(op, dnn::create_tensor_descriptor()),
            conv: create(op, dnn::create_convolution_descriptor()),
            op,
            shapes,
            geometry: *g,
            channels_last: cl,
        };
        let ty = data_type(dtype);
        let i = |v: usize| c_int(v, op);
        let tensor = |desc, [n, c, h, w]: [usize; 4]| {
            let strides = if cl { [h * w * c, 1, w * c, c] } else { [c * h * w, h * w, w, 1] };
            // SAFETY: a live descriptor.
            unsafe { dnn::set_tensor4d_descriptor_ex(desc, ty, [n, c, h, w].map(i), strides.map(i)) }
        };
        d.check("cudnnSetTensor4dDescriptorEx (input)", tensor(d.x, [g.n, g.c, g.h, g.w]));
        d.check("cudnnSetTensor4dDescriptorEx (output)", tensor(d.y, [g.n, g.o, g.oh, g.ow]));
        let format = if cl {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        // SAFETY: live descriptors throughout.
        unsafe {
            let filter = [g.o, g.c / g.groups, g.kh, g.kw].map(i);
            d.check("cudnnSetFilter4dDescriptor", dnn::set_filter4d_descriptor(d.w, ty, format, filter));
            // 16-bit types and f32 accumulate in f32, f64 in f64.
            let compute = if dtype == DType::F64 {
                sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
            } else {
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT
            };
            d.check(
                "cudnnSetConvolution2dDescriptor",
                dnn::set_convolution2d_descriptor(
                    d.conv,
                    i(g.padding[0]),
                    i(g.padding[1]),
                    i(g.stride[0]),
                    i(g.stride[1]),
                    i(g.dilation[0]),
                    i(g.dilation[1]),
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
            );
            d.check("cudnnSetConvolutionGroupCount", dnn::set_convolution_group_count(d.conv, i(g.groups)));
            d.check(
                "cudnnSetConvolutionMathType",
                dnn::set_convolution_math_type(d.conv, requested_math(dtype)),
            );
            // Our output size and cuDNN's must agree, or the buffers would be wrongly sized.
            let (mut n, mut c, mut h, mut w) = (0, 0, 0, 0);
            d.check(
                "cudnnGetConvolution2dForwardOutputDim",
                sys::cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, &mut n, &mut c, &mut h, &mut w)
                    .result(),
            );
            assert_eq!(
                [n, c, h, w],
                [g.n, g.o, g.oh, g.ow].map(i),
                "{op}: cuDNN's output size differs for {}",
                d.shapes
            );
        }
        d
    }

    /// Sets the math type an algorithm was rated with (as PyTorch does), except that f32 stays
    /// on FMA math unless TF32 is allowed: cuDNN's default math would use TF32.
    fn set_math(&self, dtype: DType, rated: sys::cudnnMathType_t) {
        let math =
            if dtype == DType::F32 && !allow_tf32() { sys::cudnnMathType_t::CUDNN_FMA_MATH } else { rated };
        // SAFETY: a live descriptor.
        self.check("cudnnSetConvolutionMathType", unsafe { dnn::set_convolution_math_type(self.conv, math) });
    }
}

/// Tensor cores for the 16-bit types; for f32 only with TF32 allowed; plain FMA otherwise.
fn requested_math(dtype: DType) -> sys::cudnnMathType_t {
    match dtype {
        DType::F16 | DType::BF16 => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        // Default math lets cuDNN use TF32 for f32.
        DType::F32 if allow_tf32() => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        DType::F32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        _ => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
    }
}

/// Whether an algorithm rated with `math` keeps f32 precise enough: never with conversion of f32
/// operands to f16, and with tensor cores (TF32) only when allowed.
pub(super) fn math_allowed(dtype: DType, math: sys::cudnnMathType_t) -> bool {
    use sys::cudnnMathType_t::*;
    match (dtype, math) {
        (DType::F32, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) => false,
        (DType::F32, CUDNN_TENSOR_OP_MATH) => allow_tf32(),
        _ => true,
    }
}

/// What the three convolutions share: the locked handle bound to the current stream, the
/// scaling factors and a workspace.
struct Call<'a> {
    h: std::sync::MutexGuard<'a, Handle>,
    dev: Arc<CudaDevice>,
    stream: Arc<cudarc::driver::CudaStream>,
    alpha: (f32, f64),
    beta: (f32, f64),
}

impl<'a> Call<'a> {
    fn new(handle: &'a Mutex<Handle>, dev: Arc<CudaDevice>, op: &str) -> Call<'a> {
        let h = handle.lock().unwrap_or_else(|e| e.into_inner());
        bind(&dev, op);
        let stream = current_stream(&dev, op);
        // SAFETY: a live handle and a stream of this device's context.
        unsafe { dnn::set_stream(h.raw, stream.cu_stream() as sys::cudaStream_t) }
            .unwrap_or_else(|e| panic!("{op}: cudnnSetStream failed: {e:?}"));
        Call { h, dev, stream, alpha: (1.0, 1.0), beta: (0.0, 0.0) }
    }

    /// Pointers to alpha and beta in the type cuDNN expects: double for f64, float otherwise.
    fn scale(&self, dtype: DType) -> (*const c_void, *const c_void) {
        if dtype == DType::F64 {
            (&self.alpha.1 as *const f64 as _, &self.beta.1 as *const f64 as _)
        } else {
            (&self.alpha.0 as *const f32 as _, &self.beta.0 as *const f32 as _)
        }
    }

    /// A workspace of `bytes` on the current stream (freed blocks are reused in stream order,
    /// so dropping it right after queueing the convolution is safe).
    fn workspace(&self, bytes: usize, op: &str) -> Option<Tensor> {
        (bytes > 0).then(|| empty(&self.dev, DType::U8, &[bytes], op))
    }
}

fn ws_ptr(ws: &Option<Tensor>) -> *mut c_void {
    ws.as_ref().map_or(std::ptr::null_mut(), |t| first_ptr(t) as *mut c_void)
}

pub(super) fn forward(handle: &Mutex<Handle>, x: &Tensor, w: &Tensor, g: &Geometry) -> Option<Tensor> {
    const OP: &str = "conv2d";
    let (dtype, dev) = (x.dtype(), device_of(x, OP));
    let cl = is_channels_last(x);
    let (x, w) = (packed(x, cl), packed(w, cl));
    let y = empty_packed(&dev, dtype, [g.n, g.o, g.oh, g.ow], cl, OP);
    let bufs = Buffers { x: first_ptr(&x), w: first_ptr(&w), y: first_ptr(&y) };
    convolve(handle, dev, OP, Direction::Forward, dtype, g, cl, &bufs).then_some(y)
}

pub(super) fn backward_input(
    handle: &Mutex<Handle>,
    gy: &Tensor,
    w: &Tensor,
    g: &Geometry,
) -> Option<Tensor> {
    const OP: &str = "conv2d_backward_input";
    let (dtype, dev) = (gy.dtype(), device_of(gy, OP));
    let cl = is_channels_last(gy);
    let (gy, w) = (packed(gy, cl), packed(w, cl));
    let dx = empty_packed(&dev, dtype, [g.n, g.c, g.h, g.w], cl, OP);
    let bufs = Buffers { x: first_ptr(&dx), w: first_ptr(&w), y: first_ptr(&gy) };
    convolve(handle, dev, OP, Direction::BackwardData, dtype, g, cl, &bufs).then_some(dx)
}

pub(super) fn backward_weight(
    handle: &Mutex<Handle>,
    gy: &Tensor,
    x: &Tensor,
    g: &Geometry,
) -> Option<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    let (dtype, dev) = (gy.dtype(), device_of(gy, OP));
    let cl = is_channels_last(x);
    let (gy, x) = (packed(gy, cl), packed(x, cl));
    let dw = empty_packed(&dev, dtype, [g.o, g.c / g.groups, g.kh, g.kw], cl, OP);
    let bufs = Buffers { x: first_ptr(&x), w: first_ptr(&dw), y: first_ptr(&gy) };
    convolve(handle, dev, OP, Direction::BackwardFilter, dtype, g, cl, &bufs).then_some(dw)
}

/// Whether 16-bit convolutions try cuDNN's graph API first (`OXTRAIN_CUDNN_GRAPH=0` keeps
/// them on the legacy API, for comparison).
fn use_graph_api() -> bool {
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(|| !std::env::var("OXTRAIN_CUDNN_GRAPH").is_ok_and(|v| v == "0"))
}

/// Queues one convolution on the current stream; false when cuDNN has no algorithm for it
/// (the caller falls back to im2col). The buffers stay alive until the work is queued.
#[allow(clippy::too_many_arguments)]
fn convolve(
    handle: &Mutex<Handle>,
    dev: Arc<CudaDevice>,
    op: &'static str,
    direction: Direction,
    dtype: DType,
    g: &Geometry,
    cl: bool,
    b: &Buffers,
) -> bool {
    let call = Call::new(handle, dev, op);
    let raw = call.h.raw;
    if use_graph_api() {
        let workspace = |bytes: usize| call.workspace(bytes, op);
        let run =
            super::cudnn_graph::Run { handle: raw, stream: &call.stream, bufs: b, workspace: &workspace };
        if super::cudnn_graph::convolve(&run, call.dev.ordinal(), direction, dtype, g, cl, op) {
            return true;
        }
    }
    // The legacy API's descriptors, built only when the graph path did not take the call.
    let d = Descriptors::new(op, dtype, g, cl);
    let Some(plan) =
        plan(raw, &d, direction, dtype, call.dev.ordinal(), b, |bytes| call.workspace(bytes, op))
    else {
        return false;
    };
    d.set_math(dtype, plan.math);
    let (alpha, beta) = call.scale(dtype);
    let (x, w, y) = (b.x as *mut c_void, b.w as *mut c_void, b.y as *mut c_void);
    // SAFETY (this block): live handle and descriptors; the buffers are laid out as the
    // descriptors say and outlive the queued work; the workspace holds `bytes`.
    unsafe {
        let mut bytes = 0;
        match plan.algo {
            Algo::Forward(a) => {
                d.check(
                    "cudnnGetConvolutionForwardWorkspaceSize",
                    sys::cudnnGetConvolutionForwardWorkspaceSize(raw, d.x, d.w, d.conv, d.y, a, &mut bytes)
                        .result(),
                );
                let ws = call.workspace(bytes, op);
                d.check(
                    "cudnnConvolutionForward",
                    dnn::convolution_forward(
                        raw,
                        alpha,
                        d.x,
                        x,
                        d.w,
                        w,
                        d.conv,
                        a,
                        ws_ptr(&ws),
                        bytes,
                        beta,
                        d.y,
                        y,
                    ),
                );
            }
            Algo::BackwardData(a) => {
                d.check(
                    "cudnnGetConvolutionBackwardDataWorkspaceSize",
                    sys::cudnnGetConvolutionBackwardDataWorkspaceSize(
                        raw, d.w, d.y, d.conv, d.x, a, &mut bytes,
                    )
                    .result(),
                );
                let ws = call.workspace(bytes, op);
                d.check(
                    "cudnnConvolutionBackwardData",
                    dnn::convolution_backward_data(
                        raw,
                        alpha,
                        d.w,
                        w,
                        d.y,
                        y,
                        d.conv,
                        a,
                        ws_ptr(&ws),
                        bytes,
                        beta,
                        d.x,
                        x,
                    ),
                );
            }
            Algo::BackwardFilter(a) => {
                d.check(
                    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                    sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        raw, d.x, d.y, d.conv, d.w, a, &mut bytes,
                    )
                    .result(),
                );
                let ws = call.workspace(bytes, op);
                d.check(
                    "cudnnConvolutionBackwardFilter",
                    dnn::convolution_backward_filter(
                        raw,
                        alpha,
                        d.x,
                        x,
                        d.y,
                        y,
                        d.conv,
                        a,
                        ws_ptr(&ws),
                        bytes,
                        beta,
                        d.w,
                        w,
                    ),
                );
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuDNN's descriptors need no GPU, but cuDNN itself is not installed in CI; these tests are
    /// ignored there (`cargo test` reports them as ignored, not passed) and run, with
    /// `--include-ignored`, where cuDNN is (the GPU sittings). Run there, a missing cuDNN fails.
    fn require_cudnn() {
        assert!(
            libs::loadable(CudaLib::Cudnn),
            "cuDNN is required here: {}",
            libs::describe_search(CudaLib::Cudnn)
        );
    }

    /// cuDNN accepts our descriptors (groups, dilation, channels-last strides) and agrees on the
    /// output size.
    #[test]
    #[ignore = "needs cuDNN (libcudnn.so.9), not installed in CI"]
    fn cudnn_accepts_our_descriptors_where_installed() {
        require_cudnn();
        let g = super::super::geometry("conv2d", &[2, 6, 17, 13], &[9, 2, 3, 2], [2, 1], [1, 2], [2, 1], 3);
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for cl in [false, true] {
                let d = Descriptors::new("conv2d", dtype, &g, cl);
                d.set_math(dtype, sys::cudnnMathType_t::CUDNN_DEFAULT_MATH);
            }
        }
    }

    /// An output size of ours that cuDNN computes differently is a panic naming both.
    #[test]
    #[ignore = "needs cuDNN (libcudnn.so.9), not installed in CI"]
    fn a_wrong_output_size_is_caught() {
        require_cudnn();
        let g = Geometry {
            n: 1,
            c: 2,
            h: 5,
            w: 5,
            o: 3,
            kh: 3,
            kw: 3,
            oh: 4,
            ow: 3,
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        };
        let caught = std::panic::catch_unwind(|| drop(Descriptors::new("conv2d", DType::F32, &g, false)))
            .expect_err("an output height of 4 where cuDNN computes 3 must be caught");
        let msg = caught.downcast_ref::<String>().map_or("(not a String panic)", String::as_str);
        assert!(msg.contains("conv2d: cuDNN's output size differs"), "{msg}");
    }
}
