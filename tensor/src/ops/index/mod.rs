//! Indexing by integer tensors, with PyTorch semantics: `index_select`, `gather`, `scatter_add`,
//! `index_add`, `embedding` and `one_hot`.
//!
//! Index tensors are int64 or uint32 and may be strided. Every index is checked before any
//! element moves: an out-of-range or negative index panics naming the op, the index, the dim and
//! its size (PyTorch rejects negative indices in all of these ops too). `scatter_add` and
//! `index_add` are out of place and accumulate every contribution of a repeated index, in the
//! order the indices appear, so results do not depend on the number of threads.

pub(crate) mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::shape::Dim;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Element, Layout, Tensor};

/// Like `with_cpu_storage!` for the dtypes that can be added to (all but bool).
macro_rules! with_addable_storage {
    ($storage:expr, $op:expr, $v:ident, $T:ident => $body:expr) => {
        match $storage {
            CpuStorage::F32($v) => {
                type $T = f32;
                $body
            }
            CpuStorage::F64($v) => {
                type $T = f64;
                $body
            }
            CpuStorage::F16($v) => {
                type $T = half::f16;
                $body
            }
            CpuStorage::BF16($v) => {
                type $T = half::bf16;
                $body
            }
            CpuStorage::I64($v) => {
                type $T = i64;
                $body
            }
            CpuStorage::U32($v) => {
                type $T = u32;
                $body
            }
            CpuStorage::U8($v) => {
                type $T = u8;
                $body
            }
            CpuStorage::Bool(_) => panic!("{}: not defined for bool tensors", $op),
        }
    };
}

/// The values of an int64/uint32 index tensor in row-major order.
fn index_values(op: &str, index: &Tensor) -> Vec<i64> {
    match index.dtype() {
        DType::I64 => index.to_vec::<i64>(),
        DType::U32 => index.to_vec::<u32>().into_iter().map(i64::from).collect(),
        other => panic!(
            "{op}: the index must be an int64 or uint32 tensor, got {other} with shape {:?}",
            index.dims()
        ),
    }
}

/// Panics unless `index` holds int64 or uint32 values (what the kernels take); on CUDA the
/// values themselves are checked by the kernels.
fn check_index_dtype(op: &str, index: &Tensor) {
    assert!(
        matches!(index.dtype(), DType::I64 | DType::U32),
        "{op}: the index must be an int64 or uint32 tensor, got {} with shape {:?}",
        index.dtype(),
        index.dims()
    );
}

/// The values of `index`, each checked to lie in `0..size` (`size` is the extent of `dim` in
/// the tensor of shape `target` that the indices point into).
fn checked_indices(op: &str, index: &Tensor, dim: usize, size: usize, target: &[usize]) -> Vec<usize> {
    index_values(op, index)
        .into_iter()
        .map(|v| {
            if v < 0 {
                panic!(
                    "{op}: index {v} is out of range for dim {dim} with size {size} (tensor shape {target:?}); \
                     negative indices are not supported"
                );
            }
            let i = v as usize;
            assert!(
                i < size,
                "{op}: index {v} is out of range for dim {dim} with size {size} (tensor shape {target:?})"
            );
            i
        })
        .collect()
}

/// The CUDA gather behind index_select, embedding and gather: `out[i] = src[view(i) +
/// index[index_view(i)] * dim_stride]`, both views having the output's shape.
fn gather_on_cuda(
    (src, view, dim_stride): (&Tensor, &Layout, usize),
    (index, index_view, bound): (&Tensor, &Layout, usize),
    op: &'static str,
) -> Storage {
    check_index_dtype(op, index);
    let (s, i) = (src.storage(), index.storage());
    match (&*s, &*i) {
        (Storage::Cuda(s), Storage::Cuda(i)) => {
            Storage::Cuda(cuda::gather((s, view, dim_stride), (i, index_view, bound), op))
        }
        _ => unreachable!("{op}: the tensors' devices were checked"),
    }
}

/// The layout of `index` (0-D or 1-D) spread over `shape`: each element sees the index entry of
/// its position along `dim`.
fn along_dim(index: &Tensor, shape: &[usize], dim: usize) -> Layout {
    let mut strides = vec![0; shape.len()];
    strides[dim] = index.strides().first().copied().unwrap_or(0);
    Layout::new(shape, strides, index.layout().offset())
}

/// Bool tensors cannot be summed (the CPU kernels' `with_addable_storage!` says the same).
fn check_addable(t: &Tensor, op: &str) {
    assert!(t.dtype() != DType::Bool, "{op}: not defined for bool tensors");
}

/// The dtype check every index op makes on a tensor of values.
fn same_dtype_and_device(a: &Tensor, b: &Tensor, op: &str) {
    a.same_device(b, op);
    a.same_dtype(b, op);
}

impl Tensor {
    /// The slices of `self` along `dim` picked by a 0-D or 1-D `indices` tensor, in the order
    /// given (repeats allowed), as `torch.index_select`. The result has `self`'s shape with
    /// `dim` resized to the number of indices.
    pub fn index_select<D: Dim>(&self, dim: D, indices: &Tensor) -> Tensor {
        let op = "index_select";
        let d = dim.to_index(self.rank(), op);
        self.same_device(indices, op);
        assert!(
            indices.rank() <= 1,
            "{op}: the index must be 0-D or 1-D, got shape {:?} (input shape {:?})",
            indices.dims(),
            self.dims()
        );
        let mut shape = self.dims().to_vec();
        shape[d] = indices.elem_count();
        let storage = if self.device().is_cuda() {
            let view = cpu::without_dim(self.layout(), &shape, d);
            let (stride, index_view) = (self.strides()[d], along_dim(indices, &shape, d));
            gather_on_cuda((self, &view, stride), (indices, &index_view, self.dims()[d]), op)
        } else {
            let idx = checked_indices(op, indices, d, self.dims()[d], self.dims());
            let v = self.with_cpu(
                op,
                |s, l| with_cpu_storage!(s, v, T => T::into_storage(cpu::index_select(v, l, d, &idx))),
            );
            Storage::Cpu(v)
        };
        Tensor::from_storage(storage, shape)
    }

    /// Rows of the embedding table `weight` (`[num_embeddings, embedding_dim]`) for each id in
    /// `self`, as `torch.nn.functional.embedding(ids, weight)` (also callable as
    /// `Tensor::embedding(&ids, &weight)`). The result has shape `ids.shape + [embedding_dim]`.
    pub fn embedding(&self, weight: &Tensor) -> Tensor {
        let op = "embedding";
        assert_eq!(
            weight.rank(),
            2,
            "{op}: the weight must be 2-D [num_embeddings, embedding_dim], got shape {:?} (ids shape {:?})",
            weight.dims(),
            self.dims()
        );
        self.same_device(weight, op);
        let mut shape = self.dims().to_vec();
        shape.push(weight.dims()[1]);
        let storage = if weight.device().is_cuda() {
            // Output element (ids position, k) reads weight[id, k]: a gather over two views.
            let mut strides = vec![0; self.rank()];
            strides.push(weight.strides()[1]);
            let view = Layout::new(shape.as_slice(), strides, weight.layout().offset());
            let mut id_strides = self.strides().to_vec();
            id_strides.push(0);
            let id_view = Layout::new(shape.as_slice(), id_strides, self.layout().offset());
            gather_on_cuda((weight, &view, weight.strides()[0]), (self, &id_view, weight.dims()[0]), op)
        } else {
            let idx = checked_indices(op, self, 0, weight.dims()[0], weight.dims());
            // The rows in ids order are the result's memory, whatever the ids' shape.
            let v = weight.with_cpu(
                op,
                |s, l| with_cpu_storage!(s, v, T => T::into_storage(cpu::index_select(v, l, 0, &idx))),
            );
            Storage::Cpu(v)
        };
        Tensor::from_storage(storage, shape)
    }

    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim == 0` (and likewise for other dims),
    /// as `torch.gather`. `index` has `self`'s rank, and no larger extent than `self` in any
    /// dim but `dim`; the result has `index`'s shape.
    pub fn gather<D: Dim>(&self, dim: D, index: &Tensor) -> Tensor {
        let op = "gather";
        let d = dim.to_index(self.rank(), op);
        self.same_device(index, op);
        check_index_fits(op, index, d, self, "input", true);
        let storage = if self.device().is_cuda() {
            let view = cpu::without_dim(self.layout(), index.dims(), d);
            let bound = self.dims()[d];
            gather_on_cuda((self, &view, self.strides()[d]), (index, index.layout(), bound), op)
        } else {
            let idx = checked_indices(op, index, d, self.dims()[d], self.dims());
            let v = self.with_cpu(op, |s, l| with_cpu_storage!(s, v, T => T::into_storage(cpu::gather(v, l, d, index.dims(), &idx))));
            Storage::Cpu(v)
        };
        Tensor::from_storage(storage, index.dims())
    }

    /// A copy of `self` with `src[i][j][k]` added at `[index[i][j][k]][j][k]` (for `dim == 0`),
    /// as `torch.scatter_add` (out of place). Repeated indices accumulate all their
    /// contributions. `index` has `self`'s rank, fits inside `src` in every dim and inside
    /// `self` in every dim but `dim`.
    pub fn scatter_add<D: Dim>(&self, dim: D, index: &Tensor, src: &Tensor) -> Tensor {
        let op = "scatter_add";
        let d = dim.to_index(self.rank(), op);
        same_dtype_and_device(self, src, op);
        self.same_device(index, op);
        check_index_fits(op, index, d, self, "self", true);
        check_index_fits(op, index, d, src, "src", false);
        check_addable(self, op);
        let idx = checked_indices(op, index, d, self.dims()[d], self.dims());
        let storage = match (&*self.storage(), &*src.storage()) {
            (Storage::Cpu(s), Storage::Cpu(src_s)) => {
                Storage::Cpu(with_addable_storage!(s, op, v, T => T::into_storage(cpu::scatter_add(
                    (v, self.layout()),
                    (src_s.as_slice::<T>(), src.layout()),
                    d,
                    index.dims(),
                    &idx,
                ))))
            }
            (Storage::Cuda(s), Storage::Cuda(src_s)) => {
                // Each index position's element of the contiguous result.
                let out_layout = Layout::contiguous(self.dims());
                let out_stride = out_layout.strides()[d];
                let bases = crate::strided::offsets(&cpu::without_dim(&out_layout, index.dims(), d));
                let targets: Vec<usize> = bases.iter().zip(&idx).map(|(&b, &i)| b + i * out_stride).collect();
                let src_view = Layout::new(index.dims(), src.strides().to_vec(), src.layout().offset());
                Storage::Cuda(cuda::scatter_add((s, self.layout()), (src_s, &src_view), &targets))
            }
            _ => unreachable!("{op}: the tensors' devices were checked"),
        };
        Tensor::from_storage(storage, self.dims())
    }

    /// The gradient of [`Tensor::embedding`] with respect to its table: for `self`, the output
    /// gradient of shape `ids.shape + [dim]`, a `[num_embeddings, dim]` tensor of zeros with
    /// each row of `self` added at its id (`torch.ops.aten.embedding_dense_backward`). On the
    /// CPU only the rows the ids name are written; elsewhere it is `zeros.index_add(..)`.
    pub fn embedding_backward(&self, ids: &Tensor, num_embeddings: usize) -> Tensor {
        let op = "embedding_backward";
        let dim = self.dims().last().copied().unwrap_or(0);
        assert!(
            self.rank() == ids.rank() + 1 && self.dims()[..ids.rank()] == *ids.dims(),
            "{op}: the gradient {:?} must have the ids' shape {:?} plus the embedding dim",
            self.dims(),
            ids.dims()
        );
        let rows = self.reshape([ids.elem_count(), dim]);
        let flat_ids = ids.flatten_all();
        self.same_device(ids, op);
        if self.device().is_cuda() {
            check_index_dtype(op, ids);
            let rows = rows.contiguous();
            assert!(
                rows.dtype().is_float(),
                "{op}: the gradient must be a float tensor, got {}",
                rows.dtype()
            );
            let (n, offset) = (flat_ids.elem_count(), rows.layout().offset());
            let (g, i) = (rows.storage(), flat_ids.storage());
            let storage = match (&*g, &*i) {
                (Storage::Cuda(g), Storage::Cuda(i)) => {
                    cuda::embedding_backward((g, offset), (i, flat_ids.layout()), (n, dim, num_embeddings))
                }
                _ => unreachable!("{op}: the tensors' devices were checked"),
            };
            return Tensor::from_storage(Storage::Cuda(storage), [num_embeddings, dim]);
        }
        let idx = checked_indices(op, &flat_ids, 0, num_embeddings, &[num_embeddings, dim]);
        let rows = rows.contiguous();
        let off = rows.layout().offset();
        let storage = rows.with_cpu(op, |s, _| {
            with_float_storage!(s, op, v, T => T::into_storage(cpu::embedding_backward(
                &v[off..off + idx.len() * dim],
                &idx,
                num_embeddings,
                dim,
            )))
        });
        Tensor::from_storage(Storage::Cpu(storage), [num_embeddings, dim])
    }

    /// A copy of `self` with `alpha * source.select(dim, i)` added to
    /// `self.select(dim, index[i])` for each `i`, as `torch.index_add` (out of place).
    /// Repeated indices accumulate in index order. `alpha` must be a whole number for integer
    /// tensors.
    pub fn index_add<D: Dim>(&self, dim: D, index: &Tensor, source: &Tensor, alpha: f64) -> Tensor {
        let op = "index_add";
        let d = dim.to_index(self.rank(), op);
        same_dtype_and_device(self, source, op);
        self.same_device(index, op);
        assert!(
            index.rank() <= 1,
            "{op}: the index must be 0-D or 1-D, got shape {:?} (self shape {:?})",
            index.dims(),
            self.dims()
        );
        let mut expected = self.dims().to_vec();
        expected[d] = index.elem_count();
        assert!(
            source.dims() == expected,
            "{op}: source of shape {:?} must have shape {expected:?}: self's shape {:?} with dim {d} \
             resized to the {} indices",
            source.dims(),
            self.dims(),
            index.elem_count()
        );
        assert!(
            self.dtype().is_float() || alpha.fract() == 0.0,
            "{op}: alpha {alpha} must be a whole number for a {} tensor",
            self.dtype()
        );
        check_addable(self, op);
        let idx = checked_indices(op, index, d, self.dims()[d], self.dims());
        let storage = match (&*self.storage(), &*source.storage()) {
            (Storage::Cpu(s), Storage::Cpu(src_s)) => {
                Storage::Cpu(with_addable_storage!(s, op, v, T => T::into_storage(cpu::index_add(
                    (v, self.layout()),
                    (src_s.as_slice::<T>(), source.layout()),
                    d,
                    &idx,
                    alpha,
                ))))
            }
            (Storage::Cuda(s), Storage::Cuda(src_s)) => {
                let src_view = cpu::without_dim(source.layout(), self.dims(), d);
                let src_rows = (src_s, &src_view, source.strides()[d]);
                Storage::Cuda(cuda::index_add((s, self.layout()), src_rows, d, &idx, alpha))
            }
            _ => unreachable!("{op}: the tensors' devices were checked"),
        };
        Tensor::from_storage(storage, self.dims())
    }

    /// Class ids (int64 or uint32, any shape) as one-hot int64 vectors of length `num_classes`,
    /// as `torch.nn.functional.one_hot`; the result has shape `self.shape + [num_classes]`.
    pub fn one_hot(&self, num_classes: usize) -> Tensor {
        let op = "one_hot";
        let classes = index_values(op, self);
        for &class in &classes {
            assert!(
                (0..num_classes as i64).contains(&class),
                "{op}: class {class} is out of range for num_classes {num_classes} (ids shape {:?}){}",
                self.dims(),
                if class < 0 { "; negative classes are not supported" } else { "" }
            );
        }
        let mut shape = self.dims().to_vec();
        shape.push(num_classes);
        let storage = match &*self.storage() {
            Storage::Cpu(_) => {
                let mut data = vec![0i64; classes.len() * num_classes];
                for (row, &class) in classes.iter().enumerate() {
                    data[row * num_classes + class as usize] = 1;
                }
                Storage::Cpu(CpuStorage::I64(data))
            }
            Storage::Cuda(s) => Storage::Cuda(cuda::one_hot(s, self.layout(), num_classes)),
        };
        Tensor::from_storage(storage, shape)
    }
}

/// PyTorch's shape rule for gather/scatter: same rank, and `index` no larger than `other` in
/// every dim (every dim but `dim` when `except_dim`).
fn check_index_fits(op: &str, index: &Tensor, dim: usize, other: &Tensor, name: &str, except_dim: bool) {
    assert_eq!(
        index.rank(),
        other.rank(),
        "{op}: the index of shape {:?} must have as many dims as {name} of shape {:?}",
        index.dims(),
        other.dims()
    );
    for (d, (&i, &o)) in index.dims().iter().zip(other.dims()).enumerate() {
        assert!(
            (except_dim && d == dim) || i <= o,
            "{op}: the index of shape {:?} is larger than {name} of shape {:?} in dim {d}",
            index.dims(),
            other.dims()
        );
    }
}
