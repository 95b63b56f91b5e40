//! Pooling over the last two dims of `[N, C, H, W]` (or unbatched `[C, H, W]`) tensors, as
//! `torch.nn.functional`'s `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d` and
//! `adaptive_max_pool2d`, with the backward kernels autograd needs.
//!
//! Inputs may be any strided view (a channels-last tensor permuted to NCHW is read in place);
//! results are new contiguous NCHW tensors. f16 and bf16 compute in f32 and round once.
//! Every op first turns its parameters into per-axis [`Window`] lists, so one kernel serves the
//! sliding and the adaptive variant of each reduction.

pub(crate) mod cpu;
pub(crate) mod cuda;
mod offsets;
#[cfg(test)]
mod offsets_tests;
pub use offsets::{MAX_OFFSET_TAPS, NO_OFFSET};
#[cfg(test)]
mod tests;

use crate::storage::Storage;
use crate::{DType, Layout, Shape, Tensor};

/// The input positions one output position reads along one axis: `start..end` by `step`, and
/// `count`, the number of positions an average divides by along this axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub start: usize,
    pub end: usize,
    pub step: usize,
    pub count: usize,
}

/// How the windows along one axis are made: the parameters of `max_windows`, `avg_windows` or
/// `adaptive_windows`, from which the CUDA kernels recompute them instead of uploading tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AxisRule {
    Max { kernel: usize, stride: usize, padding: usize, dilation: usize },
    Avg { kernel: usize, stride: usize, padding: usize, count_include_pad: bool },
    Adaptive,
}

/// The windows of every output row and column of a pooling op.
#[derive(Clone, Debug)]
pub(crate) struct Windows {
    pub input: [usize; 2],
    pub rows: Vec<Window>,
    pub cols: Vec<Window>,
    /// The rule the rows and the columns were made by.
    pub rules: [AxisRule; 2],
    /// Replaces `rows[i].count * cols[j].count` as the divisor of averages.
    pub divisor_override: Option<usize>,
}

impl Windows {
    pub fn output(&self) -> [usize; 2] {
        [self.rows.len(), self.cols.len()]
    }
}

/// PyTorch's `pooling_output_shape`: the number of windows along an axis, which may be zero or
/// negative for inputs that are too small. With `ceil_mode` a partial last window counts, but
/// only when it starts inside the input or its left padding.
pub(crate) fn pooled_len(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> i64 {
    let (i, k, s, p, d) = (input as i64, kernel as i64, stride as i64, padding as i64, dilation as i64);
    let span = i + 2 * p - d * (k - 1) - 1 + if ceil_mode { s - 1 } else { 0 };
    let mut out = span.div_euclid(s) + 1;
    if ceil_mode && (out - 1) * s >= i + p {
        out -= 1;
    }
    out
}

/// The sliding windows of max pooling: dilated, with positions in the -inf padding skipped.
/// An all-padding window keeps `start` past the input, as PyTorch's index for it does.
fn max_windows(
    input: usize,
    output: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Vec<Window> {
    (0..output)
        .map(|o| {
            let first = (o * stride) as i64 - padding as i64;
            let end = (first + ((kernel - 1) * dilation) as i64 + 1).min(input as i64);
            let skipped =
                if first < 0 { (first.unsigned_abs() as usize).div_ceil(dilation) as i64 } else { 0 };
            let start = first + skipped * dilation as i64;
            Window { start: start as usize, end: end.max(0) as usize, step: dilation, count: 0 }
        })
        .collect()
}

/// The sliding windows of average pooling: the zero padding counts towards the divisor only
/// with `count_include_pad` (and never the part a ceil-mode window hangs past the padding).
fn avg_windows(
    input: usize,
    output: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    count_include_pad: bool,
) -> Vec<Window> {
    (0..output)
        .map(|o| {
            let first = (o * stride) as i64 - padding as i64;
            let last = (first + kernel as i64).min((input + padding) as i64);
            let (start, end) = (first.max(0), last.min(input as i64));
            let count = if count_include_pad { last - first } else { (end - start).max(0) };
            Window { start: start as usize, end: end.max(start) as usize, step: 1, count: count as usize }
        })
        .collect()
}

/// PyTorch's adaptive windows: output `o` of `output` covers `floor(o*in/out)..ceil((o+1)*in/out)`.
fn adaptive_windows(input: usize, output: usize) -> Vec<Window> {
    (0..output)
        .map(|o| {
            let start = o * input / output;
            let end = ((o + 1) * input).div_ceil(output);
            Window { start, end, step: 1, count: end - start }
        })
        .collect()
}

/// Panics naming `op` unless `dims` is `[N, C, H, W]` or `[C, H, W]` with non-zero C, H, W.
fn check_input(op: &str, dims: &[usize]) {
    let ok = matches!(dims.len(), 3 | 4) && dims[dims.len() - 3..].iter().all(|&d| d > 0);
    assert!(
        ok,
        "{op}: expected an [N, C, H, W] or [C, H, W] input with non-zero C, H and W, got shape {dims:?}"
    );
}

fn spatial(dims: &[usize]) -> [usize; 2] {
    [dims[dims.len() - 2], dims[dims.len() - 1]]
}

/// Checks kernel, stride, padding and dilation as PyTorch does and returns the output size.
fn sliding_output(
    op: &str,
    dims: &[usize],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> [usize; 2] {
    check_input(op, dims);
    assert!(
        kernel.iter().chain(&stride).chain(&dilation).all(|&v| v > 0),
        "{op}: kernel {kernel:?}, stride {stride:?} and dilation {dilation:?} must all be positive"
    );
    assert!(
        padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2,
        "{op}: padding {padding:?} must be at most half the kernel {kernel:?}"
    );
    let input = spatial(dims);
    let out: [i64; 2] = std::array::from_fn(|a| {
        pooled_len(input[a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode)
    });
    assert!(
        out[0] >= 1 && out[1] >= 1,
        "{op}: input of shape {dims:?} is too small for kernel {kernel:?}, stride {stride:?}, padding \
         {padding:?}, dilation {dilation:?} (the output would be {}x{})",
        out[0],
        out[1]
    );
    [out[0] as usize, out[1] as usize]
}

fn max_pool_windows(
    op: &str,
    dims: &[usize],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> Windows {
    let out = sliding_output(op, dims, kernel, stride, padding, dilation, ceil_mode);
    let input = spatial(dims);
    let axis = |a: usize| max_windows(input[a], out[a], kernel[a], stride[a], padding[a], dilation[a]);
    let rule = |a: usize| AxisRule::Max {
        kernel: kernel[a],
        stride: stride[a],
        padding: padding[a],
        dilation: dilation[a],
    };
    Windows { input, rows: axis(0), cols: axis(1), rules: [rule(0), rule(1)], divisor_override: None }
}

#[allow(clippy::too_many_arguments)]
fn avg_pool_windows(
    op: &str,
    dims: &[usize],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<usize>,
) -> Windows {
    assert!(divisor_override != Some(0), "{op}: divisor_override must not be zero");
    let out = sliding_output(op, dims, kernel, stride, padding, [1, 1], ceil_mode);
    let input = spatial(dims);
    let axis = |a: usize| avg_windows(input[a], out[a], kernel[a], stride[a], padding[a], count_include_pad);
    let rule = |a: usize| AxisRule::Avg {
        kernel: kernel[a],
        stride: stride[a],
        padding: padding[a],
        count_include_pad,
    };
    Windows { input, rows: axis(0), cols: axis(1), rules: [rule(0), rule(1)], divisor_override }
}

fn adaptive_pool_windows(op: &str, dims: &[usize], output_size: [usize; 2]) -> Windows {
    check_input(op, dims);
    let input = spatial(dims);
    Windows {
        input,
        rows: adaptive_windows(input[0], output_size[0]),
        cols: adaptive_windows(input[1], output_size[1]),
        rules: [AxisRule::Adaptive; 2],
        divisor_override: None,
    }
}

/// The layout seen as `[N, C, H, W]` (an unbatched input gets N = 1).
fn nchw(layout: &Layout) -> Layout {
    if layout.rank() == 3 {
        layout.unsqueeze(0)
    } else {
        layout.clone()
    }
}

/// Whether a CUDA pooling op takes `t` as channels-last (4-D, the channel innermost) and so
/// writes its results channels-last too.
fn nhwc_on_cuda(t: &Tensor) -> bool {
    t.device().is_cuda() && t.rank() == 4 && t.layout().strides()[1] == 1 && t.dims()[1] > 1
}

/// A row-major NCHW result whose storage a kernel filled in NHWC order, seen as NCHW.
fn channels_last_view(t: &Tensor) -> Tensor {
    let [_, c, h, w] = [t.dims()[0], t.dims()[1], t.dims()[2], t.dims()[3]];
    t.with_layout(Layout::new(t.dims(), vec![h * w * c, 1, w * c, c], 0))
}

/// `dims` with the last two replaced by `hw`.
fn with_spatial(dims: &[usize], hw: [usize; 2]) -> Vec<usize> {
    let mut out = dims.to_vec();
    let r = out.len();
    out[r - 2..].copy_from_slice(&hw);
    out
}

impl Tensor {
    /// Max over sliding `kernel` windows, as `F.max_pool2d(x, kernel, stride, padding, dilation,
    /// ceil_mode, return_indices=True)`: the maxima and, as I64, each one's flat index into its
    /// H*W input plane (the first maximum wins ties; NaN propagates). Padding counts as -inf and
    /// may be at most half the kernel. A dilated window that misses the input entirely gives
    /// -inf and an index past the plane, as PyTorch does; [`Tensor::max_pool2d_backward`]
    /// rejects such an index.
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> (Tensor, Tensor) {
        let op = "max_pool2d";
        let windows = max_pool_windows(op, self.dims(), kernel, stride, padding, dilation, ceil_mode);
        self.max_pool_with(op, &windows)
    }

    /// Max over PyTorch's adaptive windows (see [`Tensor::adaptive_avg_pool2d`]), with indices
    /// as [`Tensor::max_pool2d`] returns them.
    pub fn adaptive_max_pool2d(&self, output_size: [usize; 2]) -> (Tensor, Tensor) {
        let op = "adaptive_max_pool2d";
        let windows = adaptive_pool_windows(op, self.dims(), output_size);
        self.max_pool_with(op, &windows)
    }

    fn max_pool_with(&self, op: &str, windows: &Windows) -> (Tensor, Tensor) {
        let (values, indices) = match &*self.storage() {
            Storage::Cpu(s) => {
                let (v, i) = cpu::max_pool(s, &nchw(self.layout()), windows, op);
                (Storage::Cpu(v), Storage::Cpu(i))
            }
            Storage::Cuda(s) => {
                let how = (nhwc_on_cuda(self), cuda::Argmax::Index);
                let (v, i) = cuda::max_pool(s, &nchw(self.layout()), windows, how, op);
                (Storage::Cuda(v), Storage::Cuda(i))
            }
        };
        let dims = with_spatial(self.dims(), windows.output());
        let (values, indices) =
            (Tensor::from_storage(values, dims.clone()), Tensor::from_storage(indices, dims));
        if nhwc_on_cuda(self) {
            // Channels-last in, channels-last out, so the next convolution runs in NHWC.
            (channels_last_view(&values), channels_last_view(&indices))
        } else {
            (values, indices)
        }
    }

    /// The gradient of [`Tensor::max_pool2d`] (and of [`Tensor::adaptive_max_pool2d`]) with
    /// respect to its input, called on the output gradient: each element of `self` is added to
    /// the input position `indices` names. Returns a tensor of `input_shape`. An index outside
    /// its plane is a panic. Autograd uses [`Tensor::max_pool2d_with_indices_backward`], which
    /// knows the windows and so runs in parallel over the input on a GPU.
    pub fn max_pool2d_backward(&self, indices: &Tensor, input_shape: impl Into<Shape>) -> Tensor {
        self.max_pool_backward("max_pool2d_backward", indices, input_shape.into(), None)
    }

    /// The gradient of `max_pool2d(kernel, stride, padding, dilation, ceil_mode)`, as PyTorch's
    /// `max_pool2d_with_indices_backward`: `self` is the output gradient and `indices` what the
    /// forward returned. Each input element gathers the gradients of the windows that cover it
    /// and chose it, in row-major order, which is the order [`Tensor::max_pool2d_backward`] adds
    /// them in, so both give the same bits; on CUDA this runs one thread per input element
    /// (without waiting for the GPU) where that one runs a thread per plane. A channels-last
    /// gradient gives a channels-last result. Indices that no covering window could have chosen
    /// are not checked: pass the forward's own.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool2d_with_indices_backward(
        &self,
        indices: &Tensor,
        input_shape: impl Into<Shape>,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Tensor {
        let op = "max_pool2d_with_indices_backward";
        let input_shape = input_shape.into();
        let windows = max_pool_windows(op, &input_shape, kernel, stride, padding, dilation, ceil_mode);
        self.max_pool_backward(op, indices, input_shape, Some(&windows))
    }

    /// The gradient of [`Tensor::adaptive_max_pool2d`], as
    /// [`Tensor::max_pool2d_with_indices_backward`] (the output size is `self`'s).
    pub fn adaptive_max_pool2d_backward(&self, indices: &Tensor, input_shape: impl Into<Shape>) -> Tensor {
        let op = "adaptive_max_pool2d_backward";
        let input_shape = input_shape.into();
        let windows = adaptive_pool_windows(op, &input_shape, spatial(self.dims()));
        self.max_pool_backward(op, indices, input_shape, Some(&windows))
    }

    fn max_pool_backward(
        &self,
        op: &str,
        indices: &Tensor,
        input_shape: Shape,
        windows: Option<&Windows>,
    ) -> Tensor {
        check_input(op, &input_shape);
        let lead = input_shape.rank() - 2;
        assert!(
            self.rank() == input_shape.rank() && self.dims()[..lead] == input_shape[..lead],
            "{op}: grad_out of shape {:?} does not match the input shape {:?} outside the last two dims",
            self.dims(),
            input_shape.dims()
        );
        assert!(
            indices.dims() == self.dims() && indices.dtype() == DType::I64,
            "{op}: indices must be int64 with grad_out's shape {:?}, got {} of shape {:?}",
            self.dims(),
            indices.dtype(),
            indices.dims()
        );
        if let Some(w) = windows {
            assert!(
                spatial(self.dims()) == w.output(),
                "{op}: grad_out of shape {:?} is not the forward's output, whose last two dims are {:?}",
                self.dims(),
                w.output()
            );
        }
        self.same_device(indices, op);
        let (g_layout, i_layout) = (nchw(self.layout()), nchw(indices.layout()));
        match (&*self.storage(), &*indices.storage(), windows) {
            (Storage::Cpu(g), Storage::Cpu(i), _) => {
                let out =
                    cpu::max_pool_backward(g, &g_layout, (i, &i_layout, None), spatial(&input_shape), op);
                Tensor::from_storage(Storage::Cpu(out), input_shape)
            }
            (Storage::Cuda(g), Storage::Cuda(i), Some(w)) => {
                // Channels-last in, channels-last out, so the convolution before the pooling
                // gets its gradient in the order it computes in.
                let nhwc = nhwc_on_cuda(self);
                let argmax = (i, &i_layout, cuda::Argmax::Index);
                let out = cuda::max_pool_backward_gather(g, &g_layout, argmax, w, nhwc, op);
                let t = Tensor::from_storage(Storage::Cuda(out), input_shape.clone());
                if nhwc {
                    channels_last_view(&t)
                } else {
                    t
                }
            }
            (Storage::Cuda(g), Storage::Cuda(i), None) => {
                let out = cuda::max_pool_backward(g, &g_layout, i, &i_layout, spatial(&input_shape), op);
                Tensor::from_storage(Storage::Cuda(out), input_shape)
            }
            _ => unreachable!("{op}: checked to be on one device"),
        }
    }

    /// Mean over sliding `kernel` windows, as `F.avg_pool2d(x, kernel, stride, padding, ceil_mode,
    /// count_include_pad, divisor_override)`: zero padding, counted in the divisor only with
    /// `count_include_pad`; `divisor_override` replaces the divisor of every window.
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<usize>,
    ) -> Tensor {
        let op = "avg_pool2d";
        let windows = avg_pool_windows(
            op,
            self.dims(),
            kernel,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
            divisor_override,
        );
        self.avg_pool_with(op, &windows)
    }

    /// Mean over PyTorch's adaptive windows, as `F.adaptive_avg_pool2d(x, output_size)`: output
    /// row `i` of `out` covers input rows `floor(i*in/out)..ceil((i+1)*in/out)`, columns alike.
    pub fn adaptive_avg_pool2d(&self, output_size: [usize; 2]) -> Tensor {
        let op = "adaptive_avg_pool2d";
        let windows = adaptive_pool_windows(op, self.dims(), output_size);
        self.avg_pool_with(op, &windows)
    }

    fn avg_pool_with(&self, op: &str, windows: &Windows) -> Tensor {
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(cpu::avg_pool(s, &nchw(self.layout()), windows, op)),
            Storage::Cuda(s) => Storage::Cuda(cuda::avg_pool(s, &nchw(self.layout()), windows, op)),
        };
        Tensor::from_storage(storage, with_spatial(self.dims(), windows.output()))
    }

    /// The gradient of [`Tensor::avg_pool2d`] with respect to its input, called on the output
    /// gradient, with the forward's parameters. Returns a tensor of `input_shape`.
    #[allow(clippy::too_many_arguments)]
    pub fn avg_pool2d_backward(
        &self,
        input_shape: impl Into<Shape>,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<usize>,
    ) -> Tensor {
        let op = "avg_pool2d_backward";
        let input_shape = input_shape.into();
        let windows = avg_pool_windows(
            op,
            &input_shape,
            kernel,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
            divisor_override,
        );
        self.avg_pool_backward_with(op, &windows, input_shape)
    }

    /// The gradient of [`Tensor::adaptive_avg_pool2d`] with respect to its input, called on the
    /// output gradient (whose last two dims are the output size). Returns a tensor of `input_shape`.
    pub fn adaptive_avg_pool2d_backward(&self, input_shape: impl Into<Shape>) -> Tensor {
        let op = "adaptive_avg_pool2d_backward";
        let input_shape = input_shape.into();
        check_input(op, &input_shape);
        assert!(
            self.rank() == input_shape.rank(),
            "{op}: grad_out of shape {:?} and input shape {:?} differ in rank",
            self.dims(),
            input_shape.dims()
        );
        let windows = adaptive_pool_windows(op, &input_shape, spatial(self.dims()));
        self.avg_pool_backward_with(op, &windows, input_shape)
    }

    fn avg_pool_backward_with(&self, op: &str, windows: &Windows, input_shape: Shape) -> Tensor {
        let expected = with_spatial(&input_shape, windows.output());
        assert!(
            self.dims() == expected.as_slice(),
            "{op}: grad_out has shape {:?}, but the forward's output for input {:?} has shape {expected:?}",
            self.dims(),
            input_shape.dims()
        );
        let storage = match &*self.storage() {
            Storage::Cpu(g) => Storage::Cpu(cpu::avg_pool_backward(g, &nchw(self.layout()), windows, op)),
            Storage::Cuda(g) => Storage::Cuda(cuda::avg_pool_backward(g, &nchw(self.layout()), windows, op)),
        };
        Tensor::from_storage(storage, input_shape)
    }
}
