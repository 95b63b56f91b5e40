//! `softmax` and `log_softmax` along one dim, numerically stable: the max along the dim is
//! subtracted before `exp`, and `log_softmax` is `(x - max) - log(sum(exp(x - max)))`, so huge
//! logits do not overflow and tiny probabilities keep their logarithm. A `-inf` logit gets
//! probability 0; a slice that is all `-inf`, or holds NaN or `+inf`, gives NaN, as in PyTorch.
//! Float tensors only; f16 and bf16 compute in f32.

mod backward;
mod cpu;
mod cross_entropy;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::shape::Dim;
use crate::storage::Storage;
use crate::Tensor;

/// The softmax family; the CUDA backend maps each to a kernel by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SoftmaxOp {
    Softmax,
    LogSoftmax,
}

impl SoftmaxOp {
    pub fn name(&self) -> &'static str {
        match self {
            SoftmaxOp::Softmax => "softmax",
            SoftmaxOp::LogSoftmax => "log_softmax",
        }
    }
}

impl Tensor {
    /// Applies `op` along `dim`; the result is a new contiguous tensor of the input's shape.
    pub fn softmax_op<D: Dim>(&self, op: SoftmaxOp, dim: D) -> Tensor {
        // A scalar takes dim 0 or -1, as in PyTorch, and is a slice of one element.
        let d =
            if self.rank() == 0 { dim.to_index(1, op.name()) } else { dim.to_index(self.rank(), op.name()) };
        assert!(
            self.dtype().is_float(),
            "{}: expected a floating-point tensor, got dtype {} (shape {:?}); convert it with .to_dtype() first",
            op.name(),
            self.dtype(),
            self.dims()
        );
        let dims = self.dims();
        let (outer, n, inner) = if dims.is_empty() {
            (1, 1, 1)
        } else {
            (dims[..d].iter().product(), dims[d], dims[d + 1..].iter().product())
        };
        // Kernels read a row-major block [outer, n, inner]: views pay one copy here.
        let input = self.contiguous();
        let storage = match &*input.storage() {
            Storage::Cpu(s) => Storage::Cpu(cpu::softmax(s, outer, n, inner, op)),
            Storage::Cuda(s) => Storage::Cuda(cuda::softmax(s, input.layout().offset(), outer, n, inner, op)),
        };
        Tensor::from_storage(storage, self.dims())
    }

    /// `exp(x) / sum(exp(x))` along `dim`, as `torch.softmax(x, dim)`.
    pub fn softmax<D: Dim>(&self, dim: D) -> Tensor {
        self.softmax_op(SoftmaxOp::Softmax, dim)
    }

    /// `log(softmax(x))` along `dim`, computed without forming the softmax, as `torch.log_softmax`.
    pub fn log_softmax<D: Dim>(&self, dim: D) -> Tensor {
        self.softmax_op(SoftmaxOp::LogSoftmax, dim)
    }

    /// The gradient of `op` along `dim` from its output `y`, `self` being the output gradient:
    /// `y * (g - sum(g * y))` for softmax, `g - exp(y) * sum(g)` for log_softmax, the sums
    /// along `dim` (`torch._softmax_backward_data`). Along the last dim one fused pass over each
    /// row; along another dim composed from tensor ops.
    pub fn softmax_backward<D: Dim>(&self, y: &Tensor, op: SoftmaxOp, dim: D) -> Tensor {
        let name = "softmax_backward";
        self.same_dtype(y, name);
        self.same_device(y, name);
        assert!(
            self.dims() == y.dims() && y.dtype().is_float(),
            "{name}: the gradient {:?} and the output {:?} must be float tensors of one shape",
            self.dims(),
            y.dims()
        );
        let d = if y.rank() == 0 { dim.to_index(1, name) } else { dim.to_index(y.rank(), name) };
        if y.rank() > 0 && d + 1 != y.rank() {
            return match op {
                SoftmaxOp::Softmax => y.mul(&self.sub(&self.mul(y).sum(d, true))),
                SoftmaxOp::LogSoftmax => self.sub(&y.exp().mul(&self.sum(d, true))),
            };
        }
        let n = y.dims().last().copied().unwrap_or(1);
        let rows = y.elem_count().checked_div(n).unwrap_or(0);
        let (g, y_c) = (self.contiguous(), y.contiguous());
        let (og, oy) = (g.layout().offset(), y_c.layout().offset());
        let storage = match (&*g.storage(), &*y_c.storage()) {
            (Storage::Cpu(gs), Storage::Cpu(ys)) => {
                Storage::Cpu(backward::softmax_backward(gs, ys, (og, oy), rows, n, op))
            }
            (Storage::Cuda(gs), Storage::Cuda(ys)) => {
                Storage::Cuda(cuda::softmax_backward((gs, og), (ys, oy), rows, n, op))
            }
            _ => unreachable!("{name}: checked to be on one device"),
        };
        Tensor::from_storage(storage, y.dims())
    }
}
