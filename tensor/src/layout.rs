//! How a tensor's elements sit in its storage: shape, strides (in elements) and a start offset.
//! Every view op is arithmetic on a `Layout`; no data moves.

use crate::shape::Shape;

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    strides: Vec<usize>,
    offset: usize,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Layout {{ shape: {:?}, strides: {:?}, offset: {} }}",
            self.shape, self.strides, self.offset
        )
    }
}

impl Layout {
    /// A row-major layout starting at offset 0.
    pub fn contiguous(shape: impl Into<Shape>) -> Layout {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Layout { shape, strides, offset: 0 }
    }

    /// A layout from raw parts; panics if the strides do not match the rank.
    pub fn new(shape: impl Into<Shape>, strides: Vec<usize>, offset: usize) -> Layout {
        let shape = shape.into();
        assert_eq!(shape.rank(), strides.len(), "Layout::new: shape {shape:?} with strides {strides:?}");
        Layout { shape, strides, offset }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }

    /// Whether two indices of this view reach one storage element: a dim of size > 1 with
    /// stride 0 (what `expand` makes). Writing through such a view would be ill-defined.
    pub fn has_internal_overlap(&self) -> bool {
        self.dims().iter().zip(&self.strides).any(|(&d, &s)| d > 1 && s == 0)
    }

    /// Row-major and gap-free (dims of size 1 may have any stride, as in PyTorch); the offset may be anything.
    pub fn is_contiguous(&self) -> bool {
        // With no elements there is nothing out of order (PyTorch agrees).
        if self.elem_count() == 0 {
            return true;
        }
        let mut expected = 1;
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The order of dims, outermost first, in which this view's elements lie packed in memory:
    /// a permutation `order` such that `self.permute(&order)` is contiguous, as for an NCHW
    /// tensor stored channels-last (`[0, 2, 3, 1]`). `None` when the elements have gaps,
    /// overlap or broadcast dims. A row-major layout gives the identity. Dims of size 1 keep
    /// their place, so they never make a layout look permuted.
    pub fn dense_order(&self) -> Option<Vec<usize>> {
        let dims = self.dims();
        let mut big: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        // Outermost (largest stride) first; ties only arise from stride-0 or overlapping dims,
        // which the check below rejects.
        big.sort_by(|&a, &b| self.strides[b].cmp(&self.strides[a]).then(a.cmp(&b)));
        let mut expected = 1;
        for &d in big.iter().rev() {
            if self.strides[d] != expected {
                return None;
            }
            expected *= dims[d];
        }
        let mut sorted = big.into_iter();
        Some(
            (0..dims.len())
                .map(|d| if dims[d] == 1 { d } else { sorted.next().expect("one per dim") })
                .collect(),
        )
    }

    /// When contiguous, the range of storage the elements occupy.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous().then(|| self.offset..self.offset + self.elem_count())
    }

    /// One past the largest storage offset this layout touches (0 when empty).
    pub fn storage_extent(&self) -> usize {
        if self.elem_count() == 0 {
            return 0;
        }
        self.offset + self.dims().iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }

    pub fn permute(&self, order: &[usize]) -> Layout {
        let shape = order.iter().map(|&i| self.dims()[i]).collect::<Vec<_>>();
        let strides = order.iter().map(|&i| self.strides[i]).collect();
        Layout { shape: shape.into(), strides, offset: self.offset }
    }

    /// Elements `start..start + len` of `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut shape = self.dims().to_vec();
        shape[dim] = len;
        Layout {
            shape: shape.into(),
            strides: self.strides.clone(),
            offset: self.offset + start * self.strides[dim],
        }
    }

    /// Every `step`-th element of `dim`, starting at `start`, `len` of them.
    pub fn slice_step(&self, dim: usize, start: usize, len: usize, step: usize) -> Layout {
        let mut l = self.narrow(dim, start, len);
        l.strides[dim] *= step;
        l
    }

    /// The layout seen through numpy broadcasting to `target` (new or size-1 dims get stride 0).
    /// Returns `None` when the shapes are incompatible.
    pub fn broadcast_as(&self, target: &[usize]) -> Option<Layout> {
        let rank = target.len();
        if rank < self.rank() {
            return None;
        }
        let lead = rank - self.rank();
        let mut strides = vec![0; rank];
        for i in 0..rank {
            if i < lead {
                continue;
            }
            let (d, s) = (self.dims()[i - lead], self.strides[i - lead]);
            if d == target[i] {
                strides[i] = s;
            } else if d != 1 {
                return None;
            }
        }
        Some(Layout { shape: target.into(), strides, offset: self.offset })
    }

    /// The strides that view these elements with `new_shape` without copying, when they exist
    /// (PyTorch's `view` rule: each group of merged dims must be contiguous among itself).
    pub fn reshaped(&self, new_shape: &[usize]) -> Option<Layout> {
        let old_dims = self.dims();
        debug_assert_eq!(old_dims.iter().product::<usize>(), new_shape.iter().product::<usize>());
        if self.elem_count() == 0 || self.is_contiguous() {
            return Some(Layout {
                shape: new_shape.into(),
                strides: Shape::from(new_shape).contiguous_strides(),
                offset: self.offset,
            });
        }
        // Drop size-1 dims: their strides are arbitrary and would break the chunk checks.
        let old: Vec<(usize, usize)> =
            old_dims.iter().zip(&self.strides).filter(|(&d, _)| d != 1).map(|(&d, &s)| (d, s)).collect();
        let mut new_strides = vec![0; new_shape.len()];
        let mut oi = 0; // index into `old`
        let mut ni = 0; // index into `new_shape`
        while ni < new_shape.len() {
            if new_shape[ni] == 1 {
                new_strides[ni] = 1;
                ni += 1;
                continue;
            }
            // Take a chunk of old dims that is contiguous among itself...
            let mut chunk_size = old[oi].0;
            while oi + 1 < old.len() && old[oi].1 == old[oi + 1].0 * old[oi + 1].1 {
                oi += 1;
                chunk_size *= old[oi].0;
            }
            let chunk_inner_stride = old[oi].1;
            oi += 1;
            // ...and cover it exactly with new dims.
            let mut covered = 1;
            let first_new = ni;
            while ni < new_shape.len() && covered < chunk_size {
                covered *= new_shape[ni];
                ni += 1;
            }
            if covered != chunk_size {
                return None;
            }
            let mut stride = chunk_inner_stride;
            for k in (first_new..ni).rev() {
                new_strides[k] = stride;
                stride *= new_shape[k];
            }
        }
        Some(Layout { shape: new_shape.into(), strides: new_strides, offset: self.offset })
    }

    /// Removes dim `dim` (which must have size 1).
    pub fn squeeze(&self, dim: usize) -> Layout {
        let mut shape = self.dims().to_vec();
        let mut strides = self.strides.clone();
        shape.remove(dim);
        strides.remove(dim);
        Layout { shape: shape.into(), strides, offset: self.offset }
    }

    /// Inserts a dim of size 1 at `dim` (`0..=rank`).
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut shape = self.dims().to_vec();
        let mut strides = self.strides.clone();
        let stride = if dim < shape.len() { strides[dim] * shape[dim] } else { 1 };
        shape.insert(dim, 1);
        strides.insert(dim, stride);
        Layout { shape: shape.into(), strides, offset: self.offset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_order_finds_the_memory_order_of_packed_views() {
        let nchw = Layout::contiguous([2, 3, 4, 5]);
        assert_eq!(nchw.dense_order(), Some(vec![0, 1, 2, 3]));
        // NHWC storage seen as NCHW: channels innermost.
        let nhwc = Layout::contiguous([2, 4, 5, 3]).permute(&[0, 3, 1, 2]);
        let order = nhwc.dense_order().unwrap();
        assert_eq!(order, vec![0, 2, 3, 1]);
        assert!(nhwc.permute(&order).is_contiguous());
        // Size-1 dims stay where they are.
        let pooled = Layout::contiguous([2, 1, 1, 3]).permute(&[0, 3, 1, 2]);
        assert_eq!(pooled.dense_order(), Some(vec![0, 1, 2, 3]));
        assert!(pooled.is_contiguous());
        let t = Layout::contiguous([4, 1, 3]).permute(&[2, 1, 0]);
        assert_eq!(t.dense_order(), Some(vec![2, 1, 0]));
        // Gaps, broadcasts and overlaps are not packed.
        assert_eq!(Layout::contiguous([4, 6]).narrow(1, 0, 3).dense_order(), None);
        assert_eq!(Layout::contiguous([1, 3]).broadcast_as(&[4, 3]).unwrap().dense_order(), None);
        assert_eq!(Layout::new([3, 3], vec![1, 1], 0).dense_order(), None);
        assert_eq!(Layout::contiguous([0, 3]).permute(&[1, 0]).dense_order().map(|o| o.len()), Some(2));
    }

    #[test]
    fn transposed_view_reshapes_only_where_pytorch_can() {
        // A (2,3,4) tensor transposed to (2,4,3): merging the last two dims needs a copy,
        // splitting the first does not.
        let l = Layout::contiguous([2, 3, 4]).permute(&[0, 2, 1]);
        assert!(l.reshaped(&[2, 12]).is_none());
        let split = l.reshaped(&[1, 2, 4, 3]).unwrap();
        assert_eq!(split.strides(), &[1, 12, 1, 4]);
    }

    #[test]
    fn narrowed_rows_merge() {
        let l = Layout::contiguous([4, 6]).narrow(0, 1, 2);
        let r = l.reshaped(&[12]).unwrap();
        assert_eq!((r.strides(), r.offset()), (&[1usize][..], 6));
        let cols = Layout::contiguous([4, 6]).narrow(1, 1, 2);
        assert!(cols.reshaped(&[8]).is_none());
        assert_eq!(cols.reshaped(&[2, 2, 2]).unwrap().strides(), &[12, 6, 1]);
    }
}
