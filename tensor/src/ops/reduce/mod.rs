//! Reductions over a set of dims: `sum`, `mean`, `max`, `min`, `argmax`, `argmin`, `var`,
//! `std`, their whole-tensor forms (`sum_all`, ...), and `topk`.
//!
//! Semantics follow PyTorch: dims may be negative, repeated dims panic, an empty dim list
//! reduces every dim (as `torch.sum(x, dim=[])`), a rank-0 tensor accepts dim 0 or -1, and
//! `keepdim` leaves the reduced dims in place with size 1. Sums of integer and bool tensors
//! are int64; float sums accumulate in f32 (f64 for f64 tensors).

pub(crate) mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
pub(crate) mod proptests;
#[cfg(test)]
pub(crate) mod tests;
mod topk;

use crate::shape::Dims;
use crate::storage::Storage;
use crate::{DType, Tensor};

/// A reduction; the CUDA backend maps each to a kernel by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    /// Index of the largest element along one dim: the first on ties, the first NaN if any.
    ArgMax,
    ArgMin,
    /// `sum((x - mean)^2) / max(0, n - correction)`; `correction: 1` is the unbiased estimate.
    Var {
        correction: usize,
    },
    /// The square root of [`ReduceOp::Var`].
    Std {
        correction: usize,
    },
}

impl ReduceOp {
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::Var { .. } => "var",
            ReduceOp::Std { .. } => "std",
        }
    }

    /// The dtype of the result for an input of `dtype` (panics, naming the op, when the op
    /// does not take `dtype`).
    pub fn out_dtype(&self, dtype: DType) -> DType {
        match self {
            ReduceOp::Sum if dtype.is_float() => dtype,
            ReduceOp::Sum | ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
            ReduceOp::Max | ReduceOp::Min => dtype,
            ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. } => {
                assert!(
                    dtype.is_float(),
                    "{}: expected a floating-point tensor, got dtype {dtype}; convert it with .to_dtype() first",
                    self.name()
                );
                dtype
            }
        }
    }

    /// Ops with no value for an empty reduction (PyTorch raises for these).
    fn needs_elements(&self) -> bool {
        matches!(self, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin)
    }
}

/// Sorted reduced-dim indices for `dims` on a tensor of shape `shape`, PyTorch's way: an empty
/// list means every dim; a scalar reduces nothing. Public so autograd reduces the same dims.
pub fn reduced_dims<D: Dims + ?Sized>(shape: &[usize], dims: &D, op: &str) -> Vec<usize> {
    if shape.is_empty() {
        // A scalar takes dim 0 or -1 and there is nothing to reduce.
        dims.to_indexes(1, op);
        return vec![];
    }
    let dims = dims.to_indexes(shape.len(), op);
    if dims.is_empty() {
        (0..shape.len()).collect()
    } else {
        dims
    }
}

/// The shape left after reducing `dims` (kept as size 1 with `keepdim`).
pub(crate) fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (dims.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

impl Tensor {
    /// Reduces `dims` with `op`. Prefer the named methods (`sum`, `mean`, ...).
    pub fn reduce<D: Dims + ?Sized>(&self, op: ReduceOp, dims: &D, keepdim: bool) -> Tensor {
        let name = op.name();
        let dims = reduced_dims(self.dims(), dims, name);
        op.out_dtype(self.dtype());
        if op.needs_elements() {
            for &d in &dims {
                assert!(
                    self.dims()[d] != 0,
                    "{name}: expected reduction dim {d} to have non-zero size (shape {:?})",
                    self.dims()
                );
            }
        }
        let out_shape = reduced_shape(self.dims(), &dims, keepdim);
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(cpu::reduce(s, self.layout(), &dims, op)),
            Storage::Cuda(s) => Storage::Cuda(cuda::reduce(s, self.layout(), &dims, op)),
        };
        Tensor::from_storage(storage, out_shape)
    }

    /// Sum over `dims`, as `torch.sum(x, dims, keepdim)`: int64 for integer and bool tensors.
    pub fn sum<D: Dims>(&self, dims: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Sum, &dims, keepdim)
    }

    /// Mean over `dims`; float tensors only. NaN for an empty reduction.
    pub fn mean<D: Dims>(&self, dims: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Mean, &dims, keepdim)
    }

    /// Largest values over `dims` (`torch.amax`): NaN if any element is NaN.
    pub fn max<D: Dims>(&self, dims: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Max, &dims, keepdim)
    }

    /// Smallest values over `dims` (`torch.amin`): NaN if any element is NaN.
    pub fn min<D: Dims>(&self, dims: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Min, &dims, keepdim)
    }

    /// Int64 index of the largest element along `dim`: the first on ties, the first NaN if any.
    pub fn argmax<D: crate::Dim>(&self, dim: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::ArgMax, &dim, keepdim)
    }

    /// Int64 index of the smallest element along `dim`: the first on ties, the first NaN if any.
    pub fn argmin<D: crate::Dim>(&self, dim: D, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::ArgMin, &dim, keepdim)
    }

    /// Variance over `dims` with `correction` (1: unbiased, 0: population), as `torch.var`.
    pub fn var<D: Dims>(&self, dims: D, correction: usize, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Var { correction }, &dims, keepdim)
    }

    /// Standard deviation over `dims`, the square root of [`Tensor::var`].
    pub fn std<D: Dims>(&self, dims: D, correction: usize, keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Std { correction }, &dims, keepdim)
    }

    /// Sum of every element, as a rank-0 tensor (`x.sum()` in PyTorch).
    pub fn sum_all(&self) -> Tensor {
        self.reduce(ReduceOp::Sum, &[] as &[usize], false)
    }

    /// Mean of every element, as a rank-0 tensor.
    pub fn mean_all(&self) -> Tensor {
        self.reduce(ReduceOp::Mean, &[] as &[usize], false)
    }

    /// Largest element, as a rank-0 tensor; panics on an empty tensor.
    pub fn max_all(&self) -> Tensor {
        self.reduce(ReduceOp::Max, &[] as &[usize], false)
    }

    /// Smallest element, as a rank-0 tensor; panics on an empty tensor.
    pub fn min_all(&self) -> Tensor {
        self.reduce(ReduceOp::Min, &[] as &[usize], false)
    }

    /// Index of the largest element in the flattened tensor (`torch.argmax(x)`), rank 0.
    pub fn argmax_all(&self) -> Tensor {
        // Row-major order over every dim is the flattened order, so no copy is needed.
        self.reduce(ReduceOp::ArgMax, &[] as &[usize], false)
    }

    /// Index of the smallest element in the flattened tensor (`torch.argmin(x)`), rank 0.
    pub fn argmin_all(&self) -> Tensor {
        self.reduce(ReduceOp::ArgMin, &[] as &[usize], false)
    }
}
