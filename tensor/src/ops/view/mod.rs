//! Views: new layouts over the same storage. None of these copies, except `reshape` of a view
//! whose elements cannot be regrouped (it copies, as `torch.reshape` does; `view` panics instead).

use crate::shape::{Dim, Shape};
use crate::Tensor;

#[cfg(test)]
mod tests;

/// A target shape for `reshape`/`view`: any shape, or signed dims where one `-1` is inferred
/// (`t.reshape([-1, 4])`).
pub trait ShapeArg {
    fn resolve(&self, elem_count: usize, op: &str, from: &[usize]) -> Shape;
}

fn resolve_signed(dims: &[i64], elem_count: usize, op: &str, from: &[usize]) -> Shape {
    let holes = dims.iter().filter(|&&d| d == -1).count();
    assert!(holes <= 1, "{op}: only one dim can be -1, got {dims:?}");
    assert!(
        dims.iter().all(|&d| d >= -1),
        "{op}: invalid dim in {dims:?}; dims must be >= 0, or -1 to infer one"
    );
    let known: usize = dims.iter().filter(|&&d| d != -1).map(|&d| d as usize).product();
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| {
            if d == -1 {
                assert!(
                    known != 0 && elem_count.is_multiple_of(known),
                    "{op}: shape {dims:?} is invalid for input of shape {from:?} ({elem_count} elements)"
                );
                elem_count / known
            } else {
                d as usize
            }
        })
        .collect();
    shape.into()
}

macro_rules! shape_arg_unsigned {
    ($($t:ty),*) => {$(
        impl ShapeArg for $t {
            fn resolve(&self, _: usize, _: &str, _: &[usize]) -> Shape {
                Shape::from(self.clone())
            }
        }
    )*};
}
shape_arg_unsigned!(
    Shape,
    &Shape,
    Vec<usize>,
    &Vec<usize>,
    &[usize],
    usize,
    (),
    (usize, usize),
    (usize, usize, usize),
    (usize, usize, usize, usize)
);
impl<const N: usize> ShapeArg for [usize; N] {
    fn resolve(&self, _: usize, _: &str, _: &[usize]) -> Shape {
        Shape::from(*self)
    }
}
impl<const N: usize> ShapeArg for [i32; N] {
    fn resolve(&self, n: usize, op: &str, from: &[usize]) -> Shape {
        resolve_signed(&self.map(|d| d as i64), n, op, from)
    }
}
impl<const N: usize> ShapeArg for [i64; N] {
    fn resolve(&self, n: usize, op: &str, from: &[usize]) -> Shape {
        resolve_signed(self, n, op, from)
    }
}
impl ShapeArg for &[i64] {
    fn resolve(&self, n: usize, op: &str, from: &[usize]) -> Shape {
        resolve_signed(self, n, op, from)
    }
}
impl ShapeArg for Vec<i64> {
    fn resolve(&self, n: usize, op: &str, from: &[usize]) -> Shape {
        resolve_signed(self, n, op, from)
    }
}

impl Tensor {
    fn target_shape(&self, shape: impl ShapeArg, op: &str) -> Shape {
        let shape = shape.resolve(self.elem_count(), op, self.dims());
        assert_eq!(
            shape.elem_count(),
            self.elem_count(),
            "{op}: shape {shape:?} is invalid for input of shape {:?} ({} elements)",
            self.dims(),
            self.elem_count()
        );
        shape
    }

    /// The same elements with another shape, sharing storage when the layout allows
    /// (as `torch.reshape`), else copied.
    pub fn reshape(&self, shape: impl ShapeArg) -> Tensor {
        let shape = self.target_shape(shape, "reshape");
        match self.layout().reshaped(&shape) {
            Some(l) => self.with_layout(l),
            None => self.copy().with_layout(crate::Layout::contiguous(shape)),
        }
    }

    /// The same elements with another shape, always sharing storage; panics when the layout
    /// cannot be regrouped without a copy (as `torch.Tensor.view`; use `reshape` then).
    pub fn view(&self, shape: impl ShapeArg) -> Tensor {
        let shape = self.target_shape(shape, "view");
        match self.layout().reshaped(&shape) {
            Some(l) => self.with_layout(l),
            None => panic!(
                "view: a tensor of shape {:?} with strides {:?} cannot be viewed as {:?} without a copy; use .reshape()",
                self.dims(),
                self.strides(),
                shape.dims()
            ),
        }
    }

    /// Reorders dims: `order[i]` is the source dim of result dim `i` (negative dims allowed).
    pub fn permute<D: Dim>(&self, order: impl AsRef<[D]>) -> Tensor {
        let order = order.as_ref();
        let rank = self.rank();
        assert_eq!(
            order.len(),
            rank,
            "permute: {} dims given for a tensor of shape {:?}",
            order.len(),
            self.dims()
        );
        let order: Vec<usize> = order.iter().map(|d| d.to_index(rank, "permute")).collect();
        let mut seen = vec![false; rank];
        for &d in &order {
            assert!(!seen[d], "permute: dim {d} repeats in {order:?}");
            seen[d] = true;
        }
        self.with_layout(self.layout().permute(&order))
    }

    /// Swaps two dims.
    pub fn transpose<D0: Dim, D1: Dim>(&self, d0: D0, d1: D1) -> Tensor {
        let rank = self.rank();
        let (a, b) = (d0.to_index(rank, "transpose"), d1.to_index(rank, "transpose"));
        let mut order: Vec<usize> = (0..rank).collect();
        order.swap(a, b);
        self.with_layout(self.layout().permute(&order))
    }

    /// Transpose of a rank-2 tensor (`tensor.t()`).
    pub fn t(&self) -> Tensor {
        assert_eq!(self.rank(), 2, "t: expects a rank-2 tensor, got shape {:?}", self.dims());
        self.transpose(0, 1)
    }

    /// Elements `start..start + len` along `dim`.
    pub fn narrow<D: Dim>(&self, dim: D, start: usize, len: usize) -> Tensor {
        let d = dim.to_index(self.rank(), "narrow");
        let size = self.dims()[d];
        assert!(
            start + len <= size,
            "narrow: start {start} + length {len} exceeds size {size} of dim {d} (shape {:?})",
            self.dims()
        );
        self.with_layout(self.layout().narrow(d, start, len))
    }

    /// Another view of this tensor's storage with the given shape, strides and offset (in
    /// elements), as `torch.as_strided`: for a buffer that a narrowed view hides part of (the
    /// padded rows behind a language model head's logits). Panics when the view reaches
    /// outside the storage.
    pub fn as_strided(&self, dims: &[usize], strides: &[usize], offset: usize) -> Tensor {
        assert_eq!(
            dims.len(),
            strides.len(),
            "as_strided: {} dims and {} strides",
            dims.len(),
            strides.len()
        );
        let len = self.storage().len();
        let last = dims.iter().zip(strides).map(|(&d, &s)| d.saturating_sub(1) * s).sum::<usize>();
        assert!(
            dims.contains(&0) || offset + last < len,
            "as_strided: shape {dims:?} with strides {strides:?} from offset {offset} reaches element \
             {} of a storage of {len}",
            offset + last
        );
        self.with_layout(crate::Layout::new(dims, strides.to_vec(), offset))
    }

    /// Python's `t[..., start:end:step, ...]` along `dim`; `end` is clamped to the dim's size.
    pub fn slice<D: Dim>(&self, dim: D, start: usize, end: usize, step: usize) -> Tensor {
        assert!(step > 0, "slice: step must be positive, got {step}");
        let d = dim.to_index(self.rank(), "slice");
        let size = self.dims()[d];
        let end = end.min(size);
        let start = start.min(end);
        let len = (end - start).div_ceil(step);
        self.with_layout(self.layout().slice_step(d, start, len, step))
    }

    /// One index along `dim`, dropping that dim (`t[i]` for dim 0, `t.select(dim, i)`).
    pub fn select<D: Dim>(&self, dim: D, index: usize) -> Tensor {
        let d = dim.to_index(self.rank(), "select");
        let size = self.dims()[d];
        assert!(
            index < size,
            "select: index {index} is out of range for dim {d} of size {size} (shape {:?})",
            self.dims()
        );
        self.with_layout(self.layout().narrow(d, index, 1).squeeze(d))
    }

    /// A view broadcast to `shape` by numpy rules (size-1 dims repeat with stride 0).
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Tensor {
        let shape = shape.into();
        match self.layout().broadcast_as(&shape) {
            Some(l) => self.with_layout(l),
            None => panic!("broadcast_as: shape {:?} cannot be broadcast to {:?}", self.dims(), shape.dims()),
        }
    }

    /// `torch.Tensor.expand`: like `broadcast_as`, and `-1` keeps a dim's size.
    pub fn expand(&self, shape: impl AsRef<[i64]>) -> Tensor {
        let shape = shape.as_ref();
        let lead = shape.len().checked_sub(self.rank()).unwrap_or_else(|| {
            panic!("expand: cannot expand shape {:?} to fewer dims {shape:?}", self.dims())
        });
        let target: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                assert!(
                    s >= -1,
                    "expand: invalid size {s} in {shape:?}; sizes must be >= 0, or -1 to keep one"
                );
                if s == -1 {
                    assert!(i >= lead, "expand: -1 is not allowed for a new leading dim in {shape:?}");
                    self.dims()[i - lead]
                } else {
                    s as usize
                }
            })
            .collect();
        self.broadcast_as(target)
    }

    /// Removes `dim`, which must have size 1 (PyTorch leaves other sizes alone; we do too).
    pub fn squeeze<D: Dim>(&self, dim: D) -> Tensor {
        let d = dim.to_index(self.rank(), "squeeze");
        if self.dims()[d] != 1 {
            return self.clone();
        }
        self.with_layout(self.layout().squeeze(d))
    }

    /// Removes every dim of size 1.
    pub fn squeeze_all(&self) -> Tensor {
        let mut l = self.layout().clone();
        for d in (0..self.rank()).rev() {
            if self.dims()[d] == 1 {
                l = l.squeeze(d);
            }
        }
        self.with_layout(l)
    }

    /// Inserts a dim of size 1 at `dim` (in `-(rank+1)..=rank`).
    pub fn unsqueeze<D: Dim>(&self, dim: D) -> Tensor {
        let d = dim.to_index(self.rank() + 1, "unsqueeze");
        self.with_layout(self.layout().unsqueeze(d))
    }

    /// Merges dims `start..=end` into one (`torch.flatten(t, start, end)`).
    pub fn flatten<D0: Dim, D1: Dim>(&self, start: D0, end: D1) -> Tensor {
        if self.rank() == 0 {
            return self.reshape([1usize]);
        }
        let (s, e) = (start.to_index(self.rank(), "flatten"), end.to_index(self.rank(), "flatten"));
        assert!(s <= e, "flatten: start dim {s} comes after end dim {e}");
        let dims = self.dims();
        let mut shape = dims[..s].to_vec();
        shape.push(dims[s..=e].iter().product());
        shape.extend_from_slice(&dims[e + 1..]);
        self.reshape(shape)
    }

    /// All dims merged into one.
    pub fn flatten_all(&self) -> Tensor {
        self.reshape(self.elem_count())
    }
}
