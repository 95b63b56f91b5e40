//! Gradients of max and average pooling, sliding and adaptive (kernels in the tensor crate's
//! `ops/pool`): each uses the tensor crate's backward kernel of its op.

use crate::Var;
use oxtrain_tensor::ops::pool::MAX_OFFSET_TAPS;
use oxtrain_tensor::{Shape, Tensor};
use std::sync::OnceLock;

/// Whether CUDA max pooling keeps window offsets for its backward: on unless
/// `OXTRAIN_DISABLE_POOL_OFFSETS=1` (then the flat i64 indices, as before).
fn pool_offsets_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("OXTRAIN_DISABLE_POOL_OFFSETS").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

impl Var {
    /// Max pooling, as `F.max_pool2d`; the gradient goes to each window's (first) maximum.
    /// On CUDA the backward keeps each maximum's offset in its window (one byte) rather than
    /// its flat index (eight), unless `OXTRAIN_DISABLE_POOL_OFFSETS=1`.
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Var {
        let x = self.tensor();
        let input = Shape::from(self.dims());
        let offsets =
            x.device().is_cuda() && kernel[0] * kernel[1] <= MAX_OFFSET_TAPS && pool_offsets_enabled();
        if offsets {
            let (out, offsets) = x.max_pool2d_with_offsets(kernel, stride, padding, dilation, ceil_mode);
            return Var::from_op("max_pool2d", out, &[self], move |g, _| {
                vec![Some(g.max_pool2d_with_offsets_backward(
                    &offsets, &input, kernel, stride, padding, dilation, ceil_mode,
                ))]
            });
        }
        let (out, indices) = x.max_pool2d(kernel, stride, padding, dilation, ceil_mode);
        Var::from_op("max_pool2d", out, &[self], move |g, _| {
            vec![Some(g.max_pool2d_with_indices_backward(
                &indices, &input, kernel, stride, padding, dilation, ceil_mode,
            ))]
        })
    }

    /// Max pooling over PyTorch's adaptive windows, as `F.adaptive_max_pool2d`.
    pub fn adaptive_max_pool2d(&self, output_size: [usize; 2]) -> Var {
        let (out, indices) = self.tensor().adaptive_max_pool2d(output_size);
        let input = Shape::from(self.dims());
        Var::from_op("adaptive_max_pool2d", out, &[self], move |g, _| {
            vec![Some(g.adaptive_max_pool2d_backward(&indices, &input))]
        })
    }

    /// Average pooling, as `F.avg_pool2d`.
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<usize>,
    ) -> Var {
        let out =
            self.tensor().avg_pool2d(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
        let input = Shape::from(self.dims());
        Var::from_op("avg_pool2d", out, &[self], move |g, _| {
            vec![Some(g.avg_pool2d_backward(
                &input,
                kernel,
                stride,
                padding,
                ceil_mode,
                count_include_pad,
                divisor_override,
            ))]
        })
    }

    /// Average pooling over PyTorch's adaptive windows, as `F.adaptive_avg_pool2d`.
    pub fn adaptive_avg_pool2d(&self, output_size: [usize; 2]) -> Var {
        let out = self.tensor().adaptive_avg_pool2d(output_size);
        let input = Shape::from(self.dims());
        let nhwc = channels_last_on_cuda(self.tensor());
        Var::from_op("adaptive_avg_pool2d", out, &[self], move |g, _| {
            let dx = g.adaptive_avg_pool2d_backward(&input);
            // The gradient goes back in the input's memory format, as PyTorch's does, so the
            // layers before keep computing channels-last.
            vec![Some(if nhwc { dx.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]) } else { dx })]
        })
    }
}

/// A 4-D CUDA tensor stored channels-last (the channel innermost), whose gradient should be too.
fn channels_last_on_cuda(t: &Tensor) -> bool {
    t.device().is_cuda() && t.rank() == 4 && t.dims()[1] > 1 && t.layout().strides()[1] == 1
}
