//! CPU kernels for pooling. Each output plane (one (n, c) pair) is independent, so rayon splits
//! the work by planes; inputs are read through their strides, outputs are written contiguously.
//! f16 and bf16 compute in f32, f64 in f64, as PyTorch's CPU kernels accumulate.

use super::{Window, Windows};
use crate::ops::unary::cpu::ComputeAs;
use crate::storage::CpuStorage;
use crate::strided::PAR_THRESHOLD;
use crate::{Element, Layout};
use num_traits::{Float, NumCast};
use rayon::prelude::*;

/// Where the (h, w) element of plane `p` of a strided `[N, C, H, W]` layout sits in storage.
#[derive(Clone, Copy)]
struct Planes {
    offset: usize,
    strides: [usize; 4],
    channels: usize,
}

impl Planes {
    fn new(layout: &Layout) -> Planes {
        let s = layout.strides();
        Planes { offset: layout.offset(), strides: [s[0], s[1], s[2], s[3]], channels: layout.dims()[1] }
    }

    #[inline(always)]
    fn base(&self, plane: usize) -> usize {
        self.offset + plane / self.channels * self.strides[0] + plane % self.channels * self.strides[1]
    }

    #[inline(always)]
    fn at(&self, base: usize, h: usize, w: usize) -> usize {
        base + h * self.strides[2] + w * self.strides[3]
    }
}

/// Runs `f(plane, out_plane)` over `out` cut into planes of `plane_len`, on rayon when the total
/// `work_per_plane * planes` is large enough to pay for it.
fn for_each_plane<U: Send>(
    out: &mut [U],
    plane_len: usize,
    work_per_plane: usize,
    f: impl Fn(usize, &mut [U]) + Sync + Send,
) {
    if plane_len == 0 || out.is_empty() {
        return;
    }
    let planes = out.len() / plane_len;
    if planes.saturating_mul(work_per_plane) < PAR_THRESHOLD {
        out.chunks_mut(plane_len).enumerate().for_each(|(p, o)| f(p, o));
    } else {
        let min_planes = (PAR_THRESHOLD / 4 / work_per_plane.max(1)).max(1);
        out.par_chunks_mut(plane_len).enumerate().with_min_len(min_planes).for_each(|(p, o)| f(p, o));
    }
}

#[inline(always)]
fn positions(win: &Window) -> std::iter::StepBy<std::ops::Range<usize>> {
    (win.start..win.end).step_by(win.step)
}

/// The max of each window and its flat index into the H*W plane; NaN wins over everything and
/// a later NaN over an earlier one, as in PyTorch's CPU kernel.
fn max_planes<T: ComputeAs>(src: &[T], layout: &Layout, win: &Windows) -> (Vec<T>, Vec<i64>) {
    let planes = Planes::new(layout);
    let [oh, ow] = win.output();
    let plane_len = oh * ow;
    let n = layout.dims()[0] * layout.dims()[1] * plane_len;
    let width = win.input[1];
    let mut values = vec![T::zero(); n];
    let mut indices = vec![0i64; n];
    // Rows of unit stride read their window as a slice, which the compiler keeps tight.
    let unit_cols = planes.strides[3] == 1 && win.cols.iter().all(|w| w.step == 1);
    let pool_plane = |p: usize, vals: &mut [T], idx: &mut [i64]| {
        let base = planes.base(p);
        for (r, rw) in win.rows.iter().enumerate() {
            for (c, cw) in win.cols.iter().enumerate() {
                let mut best = <T::C as Float>::neg_infinity();
                let mut best_at = rw.start * width + cw.start;
                for h in positions(rw) {
                    let row = base + h * planes.strides[2];
                    if unit_cols {
                        // Selects, not branches: whether an element beats the best so far
                        // depends on the data, and a mispredicted branch per element cost more
                        // than the comparisons.
                        let at = h * width + cw.start;
                        for (j, &x) in src[row + cw.start..row + cw.end].iter().enumerate() {
                            let v = x.up();
                            let take = v > best || v.is_nan();
                            best = if take { v } else { best };
                            best_at = if take { at + j } else { best_at };
                        }
                    } else {
                        for w in positions(cw) {
                            let v = src[row + w * planes.strides[3]].up();
                            if v > best || v.is_nan() {
                                best = v;
                                best_at = h * width + w;
                            }
                        }
                    }
                }
                vals[r * ow + c] = T::down(best);
                idx[r * ow + c] = best_at as i64;
            }
        }
    };
    if plane_len > 0 {
        let work = plane_len * window_area(win);
        if (n / plane_len).saturating_mul(work) < PAR_THRESHOLD {
            for (p, (v, i)) in values.chunks_mut(plane_len).zip(indices.chunks_mut(plane_len)).enumerate() {
                pool_plane(p, v, i);
            }
        } else {
            let min_planes = (PAR_THRESHOLD / 4 / work.max(1)).max(1);
            values
                .par_chunks_mut(plane_len)
                .zip(indices.par_chunks_mut(plane_len))
                .enumerate()
                .with_min_len(min_planes)
                .for_each(|(p, (v, i))| pool_plane(p, v, i));
        }
    }
    (values, indices)
}

/// A rough count of the input reads per output, to size parallel chunks.
fn window_area(win: &Windows) -> usize {
    let first = |ws: &[Window]| ws.first().map_or(1, |w| w.end.saturating_sub(w.start).max(1));
    first(&win.rows) * first(&win.cols)
}

/// What a window's sum is divided by: the override, or the product of the axes' counts.
#[inline(always)]
fn divisor<C: Float>(win: &Windows, rw: &Window, cw: &Window) -> C {
    let d = win.divisor_override.unwrap_or(rw.count * cw.count);
    <C as NumCast>::from(d).expect("a window size fits a float")
}

/// The mean of each window; an empty window (wholly in the padding) gives 0, as in PyTorch.
fn avg_planes<T: ComputeAs>(src: &[T], layout: &Layout, win: &Windows) -> Vec<T> {
    let planes = Planes::new(layout);
    let [oh, ow] = win.output();
    let mut out = vec![T::zero(); layout.dims()[0] * layout.dims()[1] * oh * ow];
    for_each_plane(&mut out, oh * ow, oh * ow * window_area(win), |p, o| {
        let base = planes.base(p);
        for (r, rw) in win.rows.iter().enumerate() {
            for (c, cw) in win.cols.iter().enumerate() {
                if rw.start >= rw.end || cw.start >= cw.end {
                    o[r * ow + c] = T::zero();
                    continue;
                }
                let mut sum = <T::C as num_traits::Zero>::zero();
                for h in rw.start..rw.end {
                    for w in cw.start..cw.end {
                        sum = sum + src[planes.at(base, h, w)].up();
                    }
                }
                o[r * ow + c] = T::down(sum / divisor::<T::C>(win, rw, cw));
            }
        }
    });
    out
}

/// Spreads each output gradient evenly over its window, summing where windows overlap.
fn avg_backward_planes<T: ComputeAs>(grad: &[T], layout: &Layout, win: &Windows) -> Vec<T> {
    let planes = Planes::new(layout);
    let [h, w] = win.input;
    let mut out = vec![T::zero(); layout.dims()[0] * layout.dims()[1] * h * w];
    for_each_plane(&mut out, h * w, h * w + win.rows.len() * win.cols.len() * window_area(win), |p, o| {
        let base = planes.base(p);
        let mut acc = vec![<T::C as num_traits::Zero>::zero(); h * w];
        for (r, rw) in win.rows.iter().enumerate() {
            for (c, cw) in win.cols.iter().enumerate() {
                if rw.start >= rw.end || cw.start >= cw.end {
                    continue;
                }
                let share = grad[planes.at(base, r, c)].up() / divisor::<T::C>(win, rw, cw);
                for ih in rw.start..rw.end {
                    for a in &mut acc[ih * w + cw.start..ih * w + cw.end] {
                        *a = *a + share;
                    }
                }
            }
        }
        for (dst, &a) in o.iter_mut().zip(&acc) {
            *dst = T::down(a);
        }
    });
    out
}

/// Adds each output gradient to the input position its index names.
fn max_backward_planes<T: ComputeAs>(
    grad: &[T],
    grad_layout: &Layout,
    (indices, index_layout, none): (&[i64], &Layout, Option<i64>),
    input: [usize; 2],
    op: &str,
) -> Vec<T> {
    let (gp, ip) = (Planes::new(grad_layout), Planes::new(index_layout));
    let [oh, ow] = [grad_layout.dims()[2], grad_layout.dims()[3]];
    let plane = input[0] * input[1];
    let mut out = vec![T::zero(); grad_layout.dims()[0] * grad_layout.dims()[1] * plane];
    for_each_plane(&mut out, plane, plane + oh * ow, |p, o| {
        let (gb, ib) = (gp.base(p), ip.base(p));
        let mut acc = vec![<T::C as num_traits::Zero>::zero(); plane];
        for r in 0..oh {
            for c in 0..ow {
                let at = indices[ip.at(ib, r, c)];
                if Some(at) == none {
                    continue;
                }
                let slot = usize::try_from(at).ok().filter(|&i| i < plane).unwrap_or_else(|| {
                    panic!("{op}: index {at} is out of range for an input plane of {}x{}", input[0], input[1])
                });
                acc[slot] = acc[slot] + grad[gp.at(gb, r, c)].up();
            }
        }
        for (dst, &a) in o.iter_mut().zip(&acc) {
            *dst = T::down(a);
        }
    });
    out
}

pub(super) fn max_pool(s: &CpuStorage, layout: &Layout, win: &Windows, op: &str) -> (CpuStorage, CpuStorage) {
    with_float_storage!(s, op, v, T => {
        let (values, indices) = max_planes::<T>(v, layout, win);
        (T::into_storage(values), CpuStorage::I64(indices))
    })
}

pub(super) fn avg_pool(s: &CpuStorage, layout: &Layout, win: &Windows, op: &str) -> CpuStorage {
    with_float_storage!(s, op, v, T => T::into_storage(avg_planes::<T>(v, layout, win)))
}

pub(super) fn avg_pool_backward(grad: &CpuStorage, layout: &Layout, win: &Windows, op: &str) -> CpuStorage {
    with_float_storage!(grad, op, g, T => T::into_storage(avg_backward_planes::<T>(g, layout, win)))
}

/// The max-pooling gradient scattered to the indices; an index equal to `none` (a window with
/// no element) passes nothing.
pub(super) fn max_pool_backward(
    grad: &CpuStorage,
    grad_layout: &Layout,
    (indices, index_layout, none): (&CpuStorage, &Layout, Option<i64>),
    input: [usize; 2],
    op: &str,
) -> CpuStorage {
    let indices = indices.as_slice::<i64>();
    with_float_storage!(grad, op, g, T => T::into_storage(
        max_backward_planes::<T>(g, grad_layout, (indices, index_layout, none), input, op)
    ))
}
