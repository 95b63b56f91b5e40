//! Joining and splitting along a dim: `cat`, `stack`, `split`, `split_sizes`, `chunk`.
//! `cat` and `stack` copy into a new tensor; the split family returns views.

mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::shape::Dim;
use crate::storage::Storage;
use crate::{Element, Tensor};
use std::borrow::Borrow;

impl Tensor {
    /// The tensors joined along `dim`, as `torch.cat`: all share dtype, device and every extent
    /// but `dim`'s. Takes `&[&Tensor]` or `&[Tensor]`. As in PyTorch, 1-D empty tensors (shape
    /// `[0]`) are skipped whatever the others' rank.
    pub fn cat<T: Borrow<Tensor>, D: Dim>(tensors: &[T], dim: D) -> Tensor {
        let op = "cat";
        assert!(!tensors.is_empty(), "{op}: expected a non-empty list of tensors");
        let all: Vec<&Tensor> = tensors.iter().map(Borrow::borrow).collect();
        let joined: Vec<&Tensor> = all.iter().copied().filter(|t| t.dims() != [0]).collect();
        let Some(&first) = joined.first() else {
            return all[0].copy();
        };
        let d = dim.to_index(first.rank(), op);
        for (i, t) in all.iter().enumerate() {
            first.same_device(t, op);
            assert!(
                t.dtype() == first.dtype(),
                "{op}: tensors must have the same dtype; tensor 0 is {} with shape {:?}, tensor {i} is {} \
                 with shape {:?}",
                all[0].dtype(),
                all[0].dims(),
                t.dtype(),
                t.dims()
            );
        }
        for (i, t) in all.iter().enumerate().filter(|(_, t)| t.dims() != [0]) {
            let fits = t.rank() == first.rank()
                && t.dims().iter().zip(first.dims()).enumerate().all(|(k, (a, b))| k == d || a == b);
            assert!(
                fits,
                "{op}: tensors must have the same shape except in dim {d}; got {:?} and {:?} (tensor {i})",
                first.dims(),
                t.dims()
            );
        }
        let mut shape = first.dims().to_vec();
        shape[d] = joined.iter().map(|t| t.dims()[d]).sum();
        if joined.len() == 1 {
            return first.copy();
        }
        let guards: Vec<_> = joined.iter().map(|t| t.storage()).collect();
        // Devices were checked to agree, so every guard holds the first one's kind of storage.
        let storage = match &*guards[0] {
            Storage::Cpu(s0) => Storage::Cpu(with_cpu_storage!(s0, _v, E => {
                let parts: Vec<(&[E], &crate::Layout)> = guards
                    .iter()
                    .zip(&joined)
                    .map(|(g, t)| match &**g {
                        Storage::Cpu(s) => (s.as_slice::<E>(), t.layout()),
                        Storage::Cuda(_) => unreachable!("{op}: devices were checked"),
                    })
                    .collect();
                E::into_storage(cpu::cat(&parts, d))
            })),
            Storage::Cuda(_) => {
                let parts: Vec<(&crate::cuda::CudaStorage, &crate::Layout)> = guards
                    .iter()
                    .zip(&joined)
                    .map(|(g, t)| match &**g {
                        Storage::Cuda(s) => (s, t.layout()),
                        Storage::Cpu(_) => unreachable!("{op}: devices were checked"),
                    })
                    .collect();
                Storage::Cuda(cuda::cat(&parts, d))
            }
        };
        Tensor::from_storage(storage, shape)
    }

    /// The tensors, all of one shape, joined along a new dim `dim` (in `-(rank+1)..=rank`), as
    /// `torch.stack`.
    pub fn stack<T: Borrow<Tensor>, D: Dim>(tensors: &[T], dim: D) -> Tensor {
        let op = "stack";
        assert!(!tensors.is_empty(), "{op}: expected a non-empty list of tensors");
        let first: &Tensor = tensors[0].borrow();
        for (i, t) in tensors.iter().enumerate() {
            let t: &Tensor = t.borrow();
            assert!(
                t.dims() == first.dims(),
                "{op}: expects each tensor to be of equal shape, but got {:?} at entry 0 and {:?} at entry {i}",
                first.dims(),
                t.dims()
            );
        }
        let d = dim.to_index(first.rank() + 1, op);
        let unsqueezed: Vec<Tensor> = tensors.iter().map(|t| t.borrow().unsqueeze(d)).collect();
        Tensor::cat(&unsqueezed, d)
    }

    /// Views of consecutive pieces of `split_size` along `dim`, the last one smaller when the
    /// size does not divide, as `torch.split(t, split_size, dim)`. A dim of size 0 gives one
    /// empty piece.
    pub fn split<D: Dim>(&self, split_size: usize, dim: D) -> Vec<Tensor> {
        let d = dim.to_index(self.rank(), "split");
        let size = self.dims()[d];
        assert!(
            split_size > 0 || size == 0,
            "split: split_size must be positive for dim {d} of size {size} (shape {:?})",
            self.dims()
        );
        if size == 0 {
            return vec![self.clone()];
        }
        (0..size)
            .step_by(split_size)
            .map(|start| self.narrow(d, start, split_size.min(size - start)))
            .collect()
    }

    /// Views of pieces with the given sizes along `dim`, which must add up to the dim's size,
    /// as `torch.split(t, [sizes], dim)`.
    pub fn split_sizes<D: Dim>(&self, sizes: &[usize], dim: D) -> Vec<Tensor> {
        let d = dim.to_index(self.rank(), "split_sizes");
        let total: usize = sizes.iter().sum();
        assert_eq!(
            total,
            self.dims()[d],
            "split_sizes: sizes {sizes:?} add up to {total}, but dim {d} has size {} (shape {:?})",
            self.dims()[d],
            self.dims()
        );
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                start += len;
                self.narrow(d, start - len, len)
            })
            .collect()
    }

    /// Views of `chunks` pieces of equal size along `dim`, the last smaller, as `torch.chunk`:
    /// pieces have `ceil(size / chunks)` entries, so fewer than `chunks` come back when that
    /// does not tile the dim (7 in 4 chunks gives 2, 2, 2, 1; 6 in 4 gives 2, 2, 2).
    pub fn chunk<D: Dim>(&self, chunks: usize, dim: D) -> Vec<Tensor> {
        let d = dim.to_index(self.rank(), "chunk");
        assert!(chunks > 0, "chunk: the number of chunks must be positive, got 0");
        let size = self.dims()[d];
        if size == 0 {
            // PyTorch gives `chunks` empty pieces here, not the single one `split` would.
            return vec![self.clone(); chunks];
        }
        self.split(size.div_ceil(chunks), d)
    }
}
