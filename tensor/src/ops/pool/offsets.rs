//! Max pooling that records each maximum as its offset inside the window (u8) instead of its
//! flat index into the plane (i64): what a training step keeps for the backward pass, an
//! eighth of the memory (a ResNet-50 stem at batch 256 keeps 51 MB instead of 411 MB), and on
//! CUDA a backward that reads one byte per channel where it read eight.
//!
//! The offset of the tap `(ki, kj)` of a window is `ki * kernel[1] + kj`, the tap at input
//! row `o_h * stride[0] - padding[0] + ki * dilation[0]` (columns alike); a window with no
//! element inside the input gets [`NO_OFFSET`]. The values, the ties (the first maximum in
//! row-major window order wins, NaN wins and a later NaN over an earlier one) and the
//! gradient's sums (in row-major window order) are those of [`Tensor::max_pool2d`] and
//! [`Tensor::max_pool2d_with_indices_backward`].

use super::{
    channels_last_view, check_input, cpu, cuda, max_pool_windows, nchw, nhwc_on_cuda, spatial, with_spatial,
    AxisRule, Windows,
};
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Shape, Tensor};

/// The offset of a window with no element inside the input.
pub const NO_OFFSET: u8 = 255;

/// Most taps a kernel may have for u8 offsets (one value is [`NO_OFFSET`]).
pub const MAX_OFFSET_TAPS: usize = NO_OFFSET as usize;

/// The first tap of window `o` along an axis of `rule` (may lie in the padding) and the
/// dilation and kernel length.
fn first_tap(rule: AxisRule, o: usize) -> (i64, i64, i64) {
    match rule {
        AxisRule::Max { kernel, stride, padding, dilation } => {
            ((o * stride) as i64 - padding as i64, dilation as i64, kernel as i64)
        }
        _ => unreachable!("window offsets are made for sliding max windows only"),
    }
}

/// Contiguous `[planes, OH, OW]` flat indices (CPU) as window offsets.
fn offsets_from_indices(indices: &[i64], win: &Windows) -> Vec<u8> {
    let [oh, ow] = win.output();
    let width = win.input[1] as i64;
    let mut out = Vec::with_capacity(indices.len());
    for (i, &at) in indices.iter().enumerate() {
        let (r, c) = (i / ow % oh, i % ow);
        let (rw, cw) = (win.rows[r], win.cols[c]);
        if rw.start >= rw.end || cw.start >= cw.end {
            out.push(NO_OFFSET);
            continue;
        }
        let ((fh, dh, _), (fw, dw, kw)) = (first_tap(win.rules[0], r), first_tap(win.rules[1], c));
        let (ki, kj) = ((at / width - fh) / dh, (at % width - fw) / dw);
        out.push((ki * kw + kj) as u8);
    }
    out
}

/// Contiguous `[planes, OH, OW]` window offsets (CPU) as flat indices; [`NO_OFFSET`] gives -1.
fn indices_from_offsets(offsets: &[u8], win: &Windows) -> Vec<i64> {
    let [oh, ow] = win.output();
    let width = win.input[1] as i64;
    offsets
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            if k == NO_OFFSET {
                return -1;
            }
            let (r, c) = (i / ow % oh, i % ow);
            let ((fh, dh, _), (fw, dw, kw)) = (first_tap(win.rules[0], r), first_tap(win.rules[1], c));
            let (ki, kj) = (k as i64 / kw, k as i64 % kw);
            (fh + ki * dh) * width + fw + kj * dw
        })
        .collect()
}

/// Panics naming `op` unless a kernel of `kernel` taps has u8 offsets.
fn check_taps(op: &str, kernel: [usize; 2]) {
    assert!(
        kernel[0] * kernel[1] <= MAX_OFFSET_TAPS,
        "{op}: a {}x{} kernel has more taps than u8 offsets hold ({MAX_OFFSET_TAPS}); use max_pool2d's indices",
        kernel[0],
        kernel[1]
    );
}

impl Tensor {
    /// [`Tensor::max_pool2d`] with each maximum's offset inside its window (u8, see the module)
    /// instead of its flat index: the maxima, and the offsets for
    /// [`Tensor::max_pool2d_with_offsets_backward`]. The kernel may have at most
    /// [`MAX_OFFSET_TAPS`] taps. A channels-last CUDA input gives channels-last results.
    pub fn max_pool2d_with_offsets(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> (Tensor, Tensor) {
        let op = "max_pool2d_with_offsets";
        let windows = max_pool_windows(op, self.dims(), kernel, stride, padding, dilation, ceil_mode);
        check_taps(op, kernel);
        let dims = with_spatial(self.dims(), windows.output());
        match &*self.storage() {
            Storage::Cpu(s) => {
                let (values, indices) = cpu::max_pool(s, &nchw(self.layout()), &windows, op);
                let CpuStorage::I64(indices) = indices else { unreachable!("{op}: indices are i64") };
                let offsets = offsets_from_indices(&indices, &windows);
                (Tensor::from_cpu(values, dims.clone()), Tensor::from_cpu(CpuStorage::U8(offsets), dims))
            }
            Storage::Cuda(s) => {
                let nhwc = nhwc_on_cuda(self);
                let how = (nhwc, cuda::Argmax::Offset);
                let (v, o) = cuda::max_pool(s, &nchw(self.layout()), &windows, how, op);
                let (v, o) = (
                    Tensor::from_storage(Storage::Cuda(v), dims.clone()),
                    Tensor::from_storage(Storage::Cuda(o), dims),
                );
                if nhwc {
                    (channels_last_view(&v), channels_last_view(&o))
                } else {
                    (v, o)
                }
            }
        }
    }

    /// The gradient of [`Tensor::max_pool2d_with_offsets`] with respect to its input, called
    /// on the output gradient with the forward's offsets and parameters: each input element
    /// gathers the gradients of the windows that chose it, in row-major order, the same sums
    /// as [`Tensor::max_pool2d_with_indices_backward`]; a window with no element passes
    /// nothing. A channels-last CUDA gradient gives a channels-last result.
    #[allow(clippy::too_many_arguments)]
    pub fn max_pool2d_with_offsets_backward(
        &self,
        offsets: &Tensor,
        input_shape: impl Into<Shape>,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Tensor {
        let op = "max_pool2d_with_offsets_backward";
        let input_shape = input_shape.into();
        check_input(op, &input_shape);
        let windows = max_pool_windows(op, &input_shape, kernel, stride, padding, dilation, ceil_mode);
        check_taps(op, kernel);
        let expected = with_spatial(&input_shape, windows.output());
        assert!(
            self.dims() == expected.as_slice() && offsets.dims() == expected.as_slice() && offsets.dtype() == DType::U8,
            "{op}: grad_out ({:?}) and u8 offsets ({} {:?}) must have the forward's output shape {expected:?}",
            self.dims(),
            offsets.dtype(),
            offsets.dims()
        );
        self.same_device(offsets, op);
        let (g_layout, o_layout) = (nchw(self.layout()), nchw(offsets.layout()));
        match (&*self.storage(), &*offsets.storage()) {
            (Storage::Cpu(g), Storage::Cpu(_)) => {
                let packed = offsets.contiguous();
                let indices = match &*packed.storage() {
                    Storage::Cpu(CpuStorage::U8(o)) => indices_from_offsets(o, &windows),
                    _ => unreachable!("{op}: checked to be u8 on the CPU"),
                };
                let (indices, i_layout) = (CpuStorage::I64(indices), nchw(packed.layout()));
                let input = spatial(&input_shape);
                let out = cpu::max_pool_backward(g, &g_layout, (&indices, &i_layout, Some(-1)), input, op);
                Tensor::from_storage(Storage::Cpu(out), input_shape)
            }
            (Storage::Cuda(g), Storage::Cuda(o)) => {
                let nhwc = nhwc_on_cuda(self);
                let argmax = (o, &o_layout, cuda::Argmax::Offset);
                let out = cuda::max_pool_backward_gather(g, &g_layout, argmax, &windows, nhwc, op);
                let t = Tensor::from_storage(Storage::Cuda(out), input_shape);
                if nhwc {
                    channels_last_view(&t)
                } else {
                    t
                }
            }
            _ => unreachable!("{op}: checked to be on one device"),
        }
    }
}
