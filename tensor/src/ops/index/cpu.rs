//! CPU kernels for the index ops. Indices arrive checked and in row-major order; values are
//! read through their layouts, so strided inputs need no copy. Accumulating kernels give each
//! rayon task a disjoint part of the output and add in index order, so they are deterministic.

use crate::dtype::Element;
use crate::ops::unary::cpu::ComputeAs;
use crate::strided::{chunk_len, offsets, Walk, PAR_THRESHOLD};
use crate::Layout;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements that scatter_add/index_add can accumulate: `acc + alpha * x`, where f16/bf16
/// compute in f32 and round once per addition (as PyTorch's CPU kernels), and integers wrap.
pub(crate) trait Accumulate: Element {
    type Alpha: Copy + Send + Sync;
    fn alpha(alpha: f64) -> Self::Alpha;
    fn add_scaled(self, x: Self, alpha: Self::Alpha) -> Self;
}

macro_rules! accumulate_float {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Alpha = <$t as ComputeAs>::C;
            fn alpha(alpha: f64) -> Self::Alpha {
                alpha as Self::Alpha
            }
            #[inline(always)]
            fn add_scaled(self, x: Self, alpha: Self::Alpha) -> Self {
                Self::down(self.up() + alpha * x.up())
            }
        }
    )*};
}
accumulate_float!(f32, f64, f16, bf16);

macro_rules! accumulate_int {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Alpha = $t;
            fn alpha(alpha: f64) -> $t {
                // Whole alphas outside the type's range wrap, as integer arithmetic does.
                alpha as i64 as $t
            }
            #[inline(always)]
            fn add_scaled(self, x: $t, alpha: $t) -> $t {
                self.wrapping_add(x.wrapping_mul(alpha))
            }
        }
    )*};
}
accumulate_int!(i64, u32, u8);

/// Splits a layout at `dim` into the part before it (with the layout's offset) and the part
/// after it (offset 0), so element `(o, i, n)` sits at `outer(o) + i * stride(dim) + inner(n)`.
fn split_at_dim(layout: &Layout, dim: usize) -> (Layout, Layout) {
    let (dims, strides) = (layout.dims(), layout.strides());
    let outer = Layout::new(&dims[..dim], strides[..dim].to_vec(), layout.offset());
    let inner = Layout::new(&dims[dim + 1..], strides[dim + 1..].to_vec(), 0);
    (outer, inner)
}

/// Storage offsets of the inner part, or `None` when it is gap-free (a plain slice copy).
fn inner_offsets(inner: &Layout) -> Option<Vec<usize>> {
    (!inner.is_contiguous()).then(|| offsets(inner))
}

/// Minimum rows of `row_len` elements per rayon task so none is tiny.
fn min_rows(row_len: usize) -> usize {
    (PAR_THRESHOLD / 4 / row_len.max(1)).max(1)
}

pub(super) fn index_select<T: Element>(src: &[T], layout: &Layout, dim: usize, idx: &[usize]) -> Vec<T> {
    let (outer, inner) = split_at_dim(layout, dim);
    let inner_len = inner.elem_count();
    let mut out = vec![T::default(); outer.elem_count() * idx.len() * inner_len];
    if out.is_empty() {
        return out;
    }
    let outer_offsets = offsets(&outer);
    let inner_offsets = inner_offsets(&inner);
    let stride = layout.strides()[dim];
    let fill_row = |row: usize, dst: &mut [T]| {
        let base = outer_offsets[row / idx.len()] + idx[row % idx.len()] * stride;
        match &inner_offsets {
            None => dst.copy_from_slice(&src[base..base + inner_len]),
            Some(offs) => dst.iter_mut().zip(offs).for_each(|(d, &o)| *d = src[base + o]),
        }
    };
    if out.len() < PAR_THRESHOLD {
        out.chunks_mut(inner_len).enumerate().for_each(|(r, dst)| fill_row(r, dst));
    } else {
        out.par_chunks_mut(inner_len)
            .with_min_len(min_rows(inner_len))
            .enumerate()
            .for_each(|(r, dst)| fill_row(r, dst));
    }
    out
}

/// `layout` seen with `shape` (no larger than its own in any dim) and stride 0 along `dim`:
/// the offset of element `p` plus `index * stride(dim)` is where `p`'s indexed element sits.
pub(super) fn without_dim(layout: &Layout, shape: &[usize], dim: usize) -> Layout {
    let mut strides = layout.strides().to_vec();
    strides[dim] = 0;
    Layout::new(shape, strides, layout.offset())
}

pub(super) fn gather<T: Element>(
    src: &[T],
    layout: &Layout,
    dim: usize,
    index_shape: &[usize],
    idx: &[usize],
) -> Vec<T> {
    let walk = Walk::new([&without_dim(layout, index_shape, dim)]);
    let stride = layout.strides()[dim];
    let mut out = vec![T::default(); idx.len()];
    let fill = |start: usize, chunk: &mut [T]| {
        let mut o = 0;
        walk.for_each_run(start, start + chunk.len(), |[b], [s], len| {
            let dst = &mut chunk[o..o + len];
            let ids = &idx[start + o..start + o + len];
            for (j, (d, &i)) in dst.iter_mut().zip(ids).enumerate() {
                *d = src[b + j * s + i * stride];
            }
            o += len;
        });
    };
    if out.len() < PAR_THRESHOLD {
        fill(0, &mut out);
    } else {
        let cl = chunk_len(out.len());
        out.par_chunks_mut(cl).enumerate().for_each(|(i, c)| fill(i * cl, c));
    }
    out
}

/// Adds the index elements `start..end` (row-major over the index shape) into `out`, whose
/// first element is at offset `out_base` of the full output.
#[allow(clippy::too_many_arguments)]
fn scatter_add_range<T: Accumulate>(
    out: &mut [T],
    out_base: usize,
    walk: &Walk<2>,
    (start, end): (usize, usize),
    src: &[T],
    idx: &[usize],
    out_stride: usize,
) {
    let one = T::alpha(1.0);
    let mut pos = start;
    walk.for_each_run(start, end, |[bs, bo], [ss, so], len| {
        for (j, &i) in idx[pos..pos + len].iter().enumerate() {
            let o = bo + j * so + i * out_stride - out_base;
            out[o] = out[o].add_scaled(src[bs + j * ss], one);
        }
        pos += len;
    });
}

pub(super) fn scatter_add<T: Accumulate>(
    (dst, dst_layout): (&[T], &Layout),
    (src, src_layout): (&[T], &Layout),
    dim: usize,
    index_shape: &[usize],
    idx: &[usize],
) -> Vec<T> {
    let mut out = crate::strided::map(dst, dst_layout, |x| x);
    let out_layout = Layout::contiguous(dst_layout.dims());
    let walk = Walk::new([
        &Layout::new(index_shape, src_layout.strides().to_vec(), src_layout.offset()),
        &without_dim(&out_layout, index_shape, dim),
    ]);
    let out_stride = out_layout.strides()[dim];
    // Index elements that differ in dim 0 (when it is not the scatter dim) write to different
    // rows of dim 0 of the output: those rows are disjoint slices, one rayon task each.
    if idx.len() < PAR_THRESHOLD || dim == 0 {
        scatter_add_range(&mut out, 0, &walk, (0, idx.len()), src, idx, out_stride);
    } else {
        let row_len = out_layout.strides()[0];
        let index_row_len = idx.len() / index_shape[0];
        out.par_chunks_mut(row_len).take(index_shape[0]).enumerate().for_each(|(r, rows)| {
            let range = (r * index_row_len, (r + 1) * index_row_len);
            scatter_add_range(rows, r * row_len, &walk, range, src, idx, out_stride);
        });
    }
    out
}

pub(super) fn index_add<T: Accumulate>(
    (dst, dst_layout): (&[T], &Layout),
    (src, src_layout): (&[T], &Layout),
    dim: usize,
    idx: &[usize],
    alpha: f64,
) -> Vec<T> {
    let mut out = crate::strided::map(dst, dst_layout, |x| x);
    let (src_outer, src_inner) = split_at_dim(src_layout, dim);
    let inner_len = src_inner.elem_count();
    if out.is_empty() || inner_len == 0 {
        return out;
    }
    let (src_outer_offsets, src_inner_offsets) = (offsets(&src_outer), inner_offsets(&src_inner));
    let (src_stride, dim_size, alpha) = (src_layout.strides()[dim], dst_layout.dims()[dim], T::alpha(alpha));
    // Output rows are (outer, dim) pairs of `inner_len` elements. A task owns rows
    // `first_row..first_row + rows.len() / inner_len` and scans the indices in order, adding
    // those that land in its rows: all tasks read every index, none share an output element.
    let add_rows = |first_row: usize, rows: &mut [T]| {
        let end_row = first_row + rows.len() / inner_len;
        let outer_range = first_row / dim_size..end_row.div_ceil(dim_size);
        for (o, &outer_base) in
            src_outer_offsets.iter().enumerate().take(outer_range.end).skip(outer_range.start)
        {
            for (i, &v) in idx.iter().enumerate() {
                let row = o * dim_size + v;
                if row < first_row || row >= end_row {
                    continue;
                }
                let dst = &mut rows[(row - first_row) * inner_len..][..inner_len];
                let base = outer_base + i * src_stride;
                match &src_inner_offsets {
                    None => {
                        for (d, &x) in dst.iter_mut().zip(&src[base..base + inner_len]) {
                            *d = d.add_scaled(x, alpha);
                        }
                    }
                    Some(offs) => {
                        for (d, &off) in dst.iter_mut().zip(offs) {
                            *d = d.add_scaled(src[base + off], alpha);
                        }
                    }
                }
            }
        }
    };
    if src_outer_offsets.len() * idx.len() * inner_len < PAR_THRESHOLD {
        add_rows(0, &mut out);
    } else {
        let rows_per_task = (out.len() / inner_len).div_ceil(rayon::current_num_threads() * 4);
        let cl = rows_per_task.max(min_rows(inner_len)) * inner_len;
        out.par_chunks_mut(cl).enumerate().for_each(|(t, rows)| add_rows(t * cl / inner_len, rows));
    }
    out
}

/// The embedding table's gradient: `[num_embeddings, dim]` zeros with each `dim`-row of the
/// contiguous `grad` added at its id, in id order (deterministic). The zeros come from the
/// allocator's zeroed pages, so only the rows some id names are ever written; a copy of zeros
/// (what `zeros.index_add(..)` does) writes the whole table, 51 MB for GPT-2's.
pub(super) fn embedding_backward<T: Accumulate>(grad: &[T], ids: &[usize], num: usize, dim: usize) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); num * dim];
    let one = T::alpha(1.0);
    for (row, &id) in grad.chunks_exact(dim.max(1)).zip(ids) {
        for (d, &x) in out[id * dim..][..dim].iter_mut().zip(row) {
            *d = d.add_scaled(x, one);
        }
    }
    out
}
