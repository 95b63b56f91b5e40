//! 2-D convolution on NCHW tensors (`torch.nn.functional.conv2d`) and its two backward
//! primitives, the gradients with respect to the input and to the weight.
//!
//! f32 and f64 compute natively; f16 and bf16 compute in f32 and round once (the gemm crate has
//! no bf16 kernel, and f32 accumulation is what PyTorch's CPU kernels use for both). On CUDA
//! they run through cuDNN when it loads, else as im2col + cuBLAS (`cuda.rs`), both accumulating
//! 16-bit types in f32; channels-last (NHWC) views are convolved as they lie there.

mod cpu;
pub(crate) mod cuda;
mod cudnn;
mod cudnn_graph;
pub(crate) mod cudnn_plan;
#[cfg(test)]
mod tests;
mod unfold;

use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Tensor};
use cpu::Geometry;

/// Checks the shapes of a convolution and works out its output size; panics naming `op`.
#[allow(clippy::too_many_arguments)]
fn geometry(
    op: &str,
    input: &[usize],
    weight: &[usize],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Geometry {
    assert!(
        input.len() == 4 && weight.len() == 4,
        "{op}: expected a 4-D input [N, C, H, W] and a 4-D weight [O, C/groups, KH, KW], got {input:?} and {weight:?}"
    );
    assert!(groups > 0, "{op}: groups must be positive, got 0");
    assert!(
        stride.iter().chain(&dilation).all(|&s| s > 0),
        "{op}: stride {stride:?} and dilation {dilation:?} must be positive"
    );
    let ([n, c, h, w], [o, cg, kh, kw]) =
        ([input[0], input[1], input[2], input[3]], [weight[0], weight[1], weight[2], weight[3]]);
    assert!(
        c == cg * groups,
        "{op}: input {input:?} has {c} channels but weight {weight:?} with groups = {groups} expects {}",
        cg * groups
    );
    assert!(
        o % groups == 0,
        "{op}: weight {weight:?} has {o} output channels, not divisible by groups = {groups}"
    );
    let out_size = |len: usize, k: usize, s: usize, p: usize, d: usize| {
        let span = d * (k - 1) + 1;
        assert!(
            k > 0 && len + 2 * p >= span,
            "{op}: input {input:?} padded by {padding:?} is smaller than the kernel {weight:?} dilated by {dilation:?}"
        );
        (len + 2 * p - span) / s + 1
    };
    let oh = out_size(h, kh, stride[0], padding[0], dilation[0]);
    let ow = out_size(w, kw, stride[1], padding[1], dilation[1]);
    Geometry { n, c, h, w, o, kh, kw, oh, ow, stride, padding, dilation, groups }
}

/// The dtype convolutions compute in: f16 and bf16 widen to f32.
fn compute_dtype(dtype: DType, op: &str) -> DType {
    match dtype {
        DType::F32 | DType::F64 => dtype,
        DType::F16 | DType::BF16 => DType::F32,
        other => panic!("{op}: expected a floating-point tensor, got {other}"),
    }
}

/// Runs `f` on the contiguous storages of `tensors` (converted to the compute dtype) and
/// returns a tensor of `shape` in `dtype`. Convolutions unfold their input anyway, so a strided
/// input is copied once here rather than read with strides in the unfolding loops.
fn run(
    op: &str,
    dtype: DType,
    tensors: &[&Tensor],
    shape: [usize; 4],
    f: impl Fn(&[&CpuStorage]) -> CpuStorage,
) -> Tensor {
    let compute = compute_dtype(dtype, op);
    let prepared: Vec<Tensor> = tensors.iter().map(|t| t.to_dtype(compute).contiguous()).collect();
    let guards: Vec<_> = prepared.iter().map(|t| t.storage()).collect();
    let cpu: Vec<&CpuStorage> = guards
        .iter()
        .map(|g| match &**g {
            Storage::Cpu(s) => s,
            Storage::Cuda(_) => unreachable!("{op}: CUDA tensors are dispatched before `run`"),
        })
        .collect();
    let out = Tensor::from_cpu(f(&cpu), shape);
    drop(guards);
    out.to_dtype(dtype)
}

impl Tensor {
    /// 2-D convolution (cross-correlation, as in PyTorch) of an input `[N, C, H, W]` with a weight
    /// `[O, C/groups, KH, KW]` and an optional bias `[O]`, giving `[N, O, OH, OW]` where
    /// `OH = (H + 2*padding[0] - dilation[0]*(KH-1) - 1) / stride[0] + 1` (likewise OW).
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Tensor {
        const OP: &str = "conv2d";
        self.same_device(weight, OP);
        self.same_dtype(weight, OP);
        let g = geometry(OP, self.dims(), weight.dims(), stride, padding, dilation, groups);
        let mut tensors = vec![self, weight];
        if let Some(b) = bias {
            self.same_device(b, OP);
            self.same_dtype(b, OP);
            assert!(
                b.dims() == [g.o],
                "conv2d: bias has shape {:?}, expected [{}] for weight {:?}",
                b.dims(),
                g.o,
                weight.dims()
            );
            tensors.push(b);
        }
        if let Device::Cuda(_) = self.device() {
            compute_dtype(self.dtype(), OP);
            return cuda::conv2d(self, weight, bias, &g);
        }
        run(OP, self.dtype(), &tensors, [g.n, g.o, g.oh, g.ow], |s| match s {
            [CpuStorage::F32(x), CpuStorage::F32(w), rest @ ..] => {
                CpuStorage::F32(cpu::forward(x, w, rest.first().map(|b| b.as_slice::<f32>()), &g))
            }
            [CpuStorage::F64(x), CpuStorage::F64(w), rest @ ..] => {
                CpuStorage::F64(cpu::forward(x, w, rest.first().map(|b| b.as_slice::<f64>()), &g))
            }
            _ => unreachable!("conv2d: operands were converted to f32 or f64"),
        })
    }

    /// The gradient of [`conv2d`](Tensor::conv2d) with respect to its input, given the gradient
    /// of its output `grad_output [N, O, OH, OW]`, the weight and the input's shape
    /// (`torch.nn.grad.conv2d_input`).
    pub fn conv2d_backward_input(
        grad_output: &Tensor,
        weight: &Tensor,
        input_shape: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Tensor {
        const OP: &str = "conv2d_backward_input";
        grad_output.same_device(weight, OP);
        grad_output.same_dtype(weight, OP);
        let g = geometry(OP, &input_shape, weight.dims(), stride, padding, dilation, groups);
        check_grad_output(OP, grad_output, &g, &input_shape);
        if let Device::Cuda(_) = grad_output.device() {
            compute_dtype(grad_output.dtype(), OP);
            return cuda::backward_input(grad_output, weight, &g);
        }
        run(OP, grad_output.dtype(), &[grad_output, weight], input_shape, |s| match s {
            [CpuStorage::F32(gy), CpuStorage::F32(w)] => CpuStorage::F32(cpu::backward_input(gy, w, &g)),
            [CpuStorage::F64(gy), CpuStorage::F64(w)] => CpuStorage::F64(cpu::backward_input(gy, w, &g)),
            _ => unreachable!("conv2d_backward_input: operands were converted to f32 or f64"),
        })
    }

    /// The gradient of [`conv2d`](Tensor::conv2d) with respect to its weight, summed over the
    /// batch, given `grad_output [N, O, OH, OW]`, the input and the weight's shape
    /// (`torch.nn.grad.conv2d_weight`).
    pub fn conv2d_backward_weight(
        grad_output: &Tensor,
        input: &Tensor,
        weight_shape: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Tensor {
        const OP: &str = "conv2d_backward_weight";
        grad_output.same_device(input, OP);
        grad_output.same_dtype(input, OP);
        let g = geometry(OP, input.dims(), &weight_shape, stride, padding, dilation, groups);
        check_grad_output(OP, grad_output, &g, input.dims());
        if let Device::Cuda(_) = grad_output.device() {
            compute_dtype(grad_output.dtype(), OP);
            return cuda::backward_weight(grad_output, input, &g);
        }
        run(OP, grad_output.dtype(), &[grad_output, input], weight_shape, |s| match s {
            [CpuStorage::F32(gy), CpuStorage::F32(x)] => CpuStorage::F32(cpu::backward_weight(gy, x, &g)),
            [CpuStorage::F64(gy), CpuStorage::F64(x)] => CpuStorage::F64(cpu::backward_weight(gy, x, &g)),
            _ => unreachable!("conv2d_backward_weight: operands were converted to f32 or f64"),
        })
    }
}

fn check_grad_output(op: &str, grad_output: &Tensor, g: &Geometry, input_shape: &[usize]) {
    assert!(
        grad_output.dims() == [g.n, g.o, g.oh, g.ow],
        "{op}: grad_output has shape {:?}, but the convolution of input {input_shape:?} gives [{}, {}, {}, {}]",
        grad_output.dims(),
        g.n,
        g.o,
        g.oh,
        g.ow
    );
}
