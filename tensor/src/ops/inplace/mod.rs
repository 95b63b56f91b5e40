//! In-place updates (`copy_`, `fill_`, `add_`, ...): they write into a tensor's existing
//! storage, so every view and every clone of it sees the new values. Optimizers, running
//! statistics and `load_state_dict` need this: a parameter keeps its storage (and whatever
//! else refers to it) while its values change.
//!
//! The arithmetic forms compute out of place and copy the result back, which costs one extra
//! pass over memory, except on CUDA when both operands are contiguous float tensors of the same
//! shape and dtype (a gradient summed into another): there the kernel writes into `self`.
//! Hot loops that need more (optimizer steps) have fused kernels of their own.

mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::ops::binary::BinaryOp;
use crate::{Storage, Tensor};

impl Tensor {
    /// Writes `src` into this tensor's elements (`tensor.copy_(src)`): `src` is broadcast to
    /// this tensor's shape and converted to its dtype; this tensor may be any view (a column,
    /// a transposed matrix). Returns `self` for chaining.
    pub fn copy_(&self, src: &Tensor) -> &Tensor {
        self.same_device(src, "copy_");
        let mut src = src.to_dtype(self.dtype()).broadcast_as(self.dims());
        if src.same_storage(self) {
            // Reading and writing one storage through two layouts would read elements this
            // copy already overwrote; go through a fresh buffer.
            src = src.copy();
        }
        assert!(
            !self.layout().has_internal_overlap(),
            "copy_: the destination of shape {:?} with strides {:?} has elements that share memory \
             (an expanded view); write into a contiguous tensor instead",
            self.dims(),
            self.strides()
        );
        if self.elem_count() == 0 {
            return self;
        }
        let source = src.storage();
        let mut dest = self.storage_mut();
        match (&mut *dest, &*source) {
            (Storage::Cpu(d), Storage::Cpu(s)) => cpu::copy_into(d, self.layout(), s, src.layout()),
            (Storage::Cuda(d), Storage::Cuda(s)) => cuda::copy_into(d, self.layout(), s, src.layout()),
            _ => unreachable!("copy_: same_device checked that both tensors are on one device"),
        }
        self
    }

    /// Sets every element to `value` (`tensor.fill_(value)`).
    pub fn fill_(&self, value: f64) -> &Tensor {
        self.copy_(&self.scalar_like(value))
    }

    /// Sets every element to zero (`tensor.zero_()`).
    pub fn zero_(&self) -> &Tensor {
        self.fill_(0.0)
    }

    /// `self += other` (broadcast to this tensor's shape).
    pub fn add_(&self, other: &Tensor) -> &Tensor {
        if !self.binary_in_place(other, BinaryOp::Add) {
            self.copy_(&self.add(other));
        }
        self
    }

    /// `self -= other`.
    pub fn sub_(&self, other: &Tensor) -> &Tensor {
        if !self.binary_in_place(other, BinaryOp::Sub) {
            self.copy_(&self.sub(other));
        }
        self
    }

    /// `self *= other`.
    pub fn mul_(&self, other: &Tensor) -> &Tensor {
        if !self.binary_in_place(other, BinaryOp::Mul) {
            self.copy_(&self.mul(other));
        }
        self
    }

    /// `self /= other`.
    pub fn div_(&self, other: &Tensor) -> &Tensor {
        if !self.binary_in_place(other, BinaryOp::Div) {
            self.copy_(&self.div(other));
        }
        self
    }

    /// `self = self op other` written straight into `self` on CUDA when both are contiguous
    /// float tensors of one shape and dtype on one device and do not share storage; false
    /// (nothing done) otherwise.
    fn binary_in_place(&self, other: &Tensor, op: BinaryOp) -> bool {
        let fits = self.dims() == other.dims() && self.dtype() == other.dtype() && !self.same_storage(other);
        if !(fits && self.device().is_cuda() && self.device() == other.device()) {
            return false;
        }
        let source = other.storage();
        let mut dest = self.storage_mut();
        match (&mut *dest, &*source) {
            (Storage::Cuda(d), Storage::Cuda(s)) => {
                crate::ops::binary::cuda::binary_in_place(d, self.layout(), s, other.layout(), op)
            }
            _ => false,
        }
    }

    /// `self *= value`.
    pub fn mul_scalar_(&self, value: f64) -> &Tensor {
        self.copy_(&self.mul_scalar(value))
    }

    /// `self += value`.
    pub fn add_scalar_(&self, value: f64) -> &Tensor {
        self.copy_(&self.add_scalar(value))
    }
}
