//! Memory-format propagation on CUDA, as PyTorch's TensorIterator does it. An elementwise op
//! whose leading operand lies packed in an order other than row-major (a channels-last
//! activation: NCHW dims over NHWC storage) runs over that order as if it were contiguous,
//! and its result comes back in the same order. So channels-last stays channels-last through
//! batch norm, ReLU and the residual add, every convolution gets the layout cuDNN is fastest
//! in, and the kernels take their flat, vectorised path instead of gathering through strides.
//! The CPU backend keeps returning row-major results.

use crate::Tensor;

/// The order an op over `shape` computes in (see the module doc).
pub(crate) struct MemoryOrder {
    shape: Vec<usize>,
    order: Vec<usize>,
    inverse: Vec<usize>,
}

impl MemoryOrder {
    /// The memory order of the first operand that has the output's full `shape` and lies
    /// packed, when that order is not row-major and the operands are on a GPU; `None` means
    /// "compute row-major as usual".
    pub(crate) fn of(shape: &[usize], operands: &[&Tensor]) -> Option<MemoryOrder> {
        let lead = operands.iter().find(|t| t.dims() == shape)?;
        if !lead.device().is_cuda() {
            return None;
        }
        let order = lead.layout().dense_order()?;
        if order.iter().enumerate().all(|(i, &d)| i == d) {
            return None;
        }
        let mut inverse = vec![0; order.len()];
        for (i, &d) in order.iter().enumerate() {
            inverse[d] = i;
        }
        Some(MemoryOrder { shape: shape.to_vec(), order, inverse })
    }

    /// An operand broadcast to the output's shape and seen in the memory order (the leading
    /// operand becomes contiguous).
    pub(crate) fn enter(&self, t: &Tensor) -> Tensor {
        let full =
            if t.dims() == self.shape.as_slice() { t.clone() } else { t.broadcast_as(self.shape.as_slice()) };
        full.permute(&self.order)
    }

    /// A result computed in the memory order, seen in the op's own dim order again.
    pub(crate) fn leave(&self, t: Tensor) -> Tensor {
        t.permute(&self.inverse)
    }
}
