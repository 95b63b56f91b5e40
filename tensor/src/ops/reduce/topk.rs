//! `topk`: the k largest (or smallest) elements along one dim, with their indices.
//!
//! NaN ranks above every number, as in PyTorch: it comes first with `largest`, last without.
//! Equal values are ordered by index, so results are deterministic.

use crate::dtype::Element;
use crate::shape::Dim;
use crate::storage::{CpuStorage, Storage};
use crate::strided::{offsets, PAR_THRESHOLD};
use crate::{Layout, Tensor};
use rayon::prelude::*;
use std::cmp::Ordering;

impl Tensor {
    /// The `k` largest (`largest`) or smallest elements along `dim` and their int64 indices,
    /// as `torch.topk`. With `sorted` they come best first; without, in the order they appear
    /// along `dim`.
    pub fn topk<D: Dim>(&self, k: usize, dim: D, largest: bool, sorted: bool) -> (Tensor, Tensor) {
        if self.rank() == 0 {
            dim.to_index(1, "topk");
            let (v, i) = self.reshape([1usize]).topk(k, 0, largest, sorted);
            return (v.reshape(()), i.reshape(()));
        }
        let d = dim.to_index(self.rank(), "topk");
        let n = self.dims()[d];
        assert!(k <= n, "topk: k ({k}) is out of range for dim {d} of size {n} (shape {:?})", self.dims());
        // Move `dim` last: each lane is then one run of the permuted layout.
        let mut order: Vec<usize> = (0..self.rank()).filter(|&i| i != d).collect();
        order.push(d);
        let lanes = self.layout().permute(&order);
        let (values, indices) = match &*self.storage() {
            Storage::Cpu(s) => {
                let (v, i) = topk_cpu(s, &lanes, k, largest, sorted);
                (Storage::Cpu(v), Storage::Cpu(i))
            }
            Storage::Cuda(s) => {
                let (v, i) = super::cuda::topk(s, &lanes, k, largest, sorted);
                (Storage::Cuda(v), Storage::Cuda(i))
            }
        };
        let mut shape: Vec<usize> = order[..order.len() - 1].iter().map(|&i| self.dims()[i]).collect();
        shape.push(k);
        // Back from dim-last to the input's dim order.
        let mut back: Vec<usize> = (0..d).collect();
        back.push(self.rank() - 1);
        back.extend(d..self.rank() - 1);
        let restore = |s: Storage| Tensor::from_storage(s, shape.clone()).permute(&back).contiguous();
        (restore(values), restore(indices))
    }
}

/// Values and int64 indices of the top k of every lane of `lanes` (the searched dim last).
pub(super) fn topk_cpu(
    s: &CpuStorage,
    lanes: &Layout,
    k: usize,
    largest: bool,
    sorted: bool,
) -> (CpuStorage, CpuStorage) {
    with_cpu_storage!(s, v, T => {
        let (vals, idx) = topk_lanes(v, lanes, k, largest, sorted);
        (T::into_storage(vals), CpuStorage::I64(idx))
    })
}

#[allow(clippy::eq_op)]
fn is_nan<T: PartialEq + Copy>(x: T) -> bool {
    x != x
}

/// Ascending order with NaN above everything.
fn value_order<T: PartialOrd + Copy>(a: T, b: T) -> Ordering {
    match (is_nan(a), is_nan(b)) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Top-k of every lane of `layout` (whose last dim is the one to search), lane-major.
fn topk_lanes<T: Element>(
    src: &[T],
    layout: &Layout,
    k: usize,
    largest: bool,
    sorted: bool,
) -> (Vec<T>, Vec<i64>) {
    let rank = layout.rank();
    let (n, stride) = (layout.dims()[rank - 1], layout.strides()[rank - 1]);
    let outer =
        Layout::new(&layout.dims()[..rank - 1], layout.strides()[..rank - 1].to_vec(), layout.offset());
    let bases = offsets(&outer);
    let mut values = vec![T::zero(); bases.len() * k];
    let mut indices = vec![0i64; bases.len() * k];
    if k == 0 {
        return (values, indices);
    }
    let rank_order = |a: &(T, usize), b: &(T, usize)| {
        let by_value = value_order(a.0, b.0);
        let by_value = if largest { by_value.reverse() } else { by_value };
        by_value.then(a.1.cmp(&b.1))
    };
    let lanes_per_task = (PAR_THRESHOLD / n.max(1)).max(1);
    values
        .par_chunks_mut(k * lanes_per_task)
        .zip(indices.par_chunks_mut(k * lanes_per_task))
        .enumerate()
        .for_each(|(task, (vals, idxs))| {
            let mut lane: Vec<(T, usize)> = Vec::with_capacity(n);
            for (j, (v, ix)) in vals.chunks_mut(k).zip(idxs.chunks_mut(k)).enumerate() {
                let base = bases[task * lanes_per_task + j];
                lane.clear();
                lane.extend((0..n).map(|i| (src[base + i * stride], i)));
                if k < n {
                    lane.select_nth_unstable_by(k - 1, rank_order);
                    lane.truncate(k);
                }
                if sorted {
                    lane.sort_unstable_by(rank_order);
                } else {
                    lane.sort_unstable_by_key(|e| e.1);
                }
                for ((v, ix), &(x, i)) in v.iter_mut().zip(ix.iter_mut()).zip(&lane) {
                    *v = x;
                    *ix = i as i64;
                }
            }
        });
    (values, indices)
}
