//! Batch norm's forward on the CPU over contiguous `[N, C, spatial]` data, one (sample,
//! channel) plane at a time: the statistics in one pass, then one pass that normalises and,
//! fused, adds a residual and applies ReLU (the pattern of every ResNet block), writing each
//! output element once.
//!
//! Statistics are shifted sums `sum(x - k)` and `sum((x - k)^2)` with `k` the channel's first
//! element, accumulated in f64 in [`LANES`] independent lanes (so the loop vectorises instead
//! of waiting on one chain of additions). Each plane is summed on its own and the planes added
//! in a fixed order, so the result does not depend on the thread count. With `k` a sample of
//! the channel, `(x - k)` is of the order of the spread and the f64 sums lose nothing that a
//! two-pass mean-then-variance would keep.

use super::cpu::Channels;
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::strided::{filled, PAR_THRESHOLD};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Independent accumulators per sum: two AVX2 vectors of f64.
pub(super) const LANES: usize = 8;

/// Runs `f(plane)` for planes `0..planes` of `spatial` elements each, on rayon when the data
/// is large, and returns the results in plane order.
pub(super) fn per_plane<R: Send>(
    planes: usize,
    spatial: usize,
    f: impl Fn(usize) -> R + Sync + Send,
) -> Vec<R> {
    if planes * spatial < PAR_THRESHOLD {
        (0..planes).map(f).collect()
    } else {
        let min = (PAR_THRESHOLD / 4 / spatial.max(1)).max(1);
        (0..planes).into_par_iter().with_min_len(min).map(f).collect()
    }
}

/// `f` over `items` (one per plane of `spatial` elements, each owning its piece of an output),
/// on rayon when the data is large, the results in the items' order.
pub(super) fn per_plane_mut<I: Send, R: Send>(
    items: Vec<I>,
    spatial: usize,
    f: impl Fn(I) -> R + Sync + Send,
) -> Vec<R> {
    if items.len() * spatial < PAR_THRESHOLD {
        items.into_iter().map(f).collect()
    } else {
        let min = (PAR_THRESHOLD / 4 / spatial.max(1)).max(1);
        items.into_par_iter().with_min_len(min).map(f).collect()
    }
}

/// `(sum(x - k), sum((x - k)^2))` over `v`, in f64.
fn shifted_sums<T: Element>(v: &[T], k: f64) -> (f64, f64) {
    let (mut s, mut q) = ([0.0f64; LANES], [0.0f64; LANES]);
    let chunks = v.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            let d = c[j].to_f64() - k;
            s[j] += d;
            q[j] += d * d;
        }
    }
    for (j, &x) in rest.iter().enumerate() {
        let d = x.to_f64() - k;
        s[j] += d;
        q[j] += d * d;
    }
    (s.iter().sum(), q.iter().sum())
}

/// Per-channel mean and biased variance of contiguous `[outer, C, spatial]` data.
pub(super) fn channel_moments<T: Element>(x: &[T], ch: Channels) -> (Vec<f64>, Vec<f64>) {
    let (channels, spatial) = (ch.channels, ch.spatial.max(1));
    if x.is_empty() || channels == 0 {
        return (vec![f64::NAN; channels], vec![f64::NAN; channels]);
    }
    // The shift of channel c: its first element.
    let shift: Vec<f64> = (0..channels).map(|c| x[c * spatial].to_f64()).collect();
    let planes = x.len() / spatial;
    let sums =
        per_plane(planes, spatial, |p| shifted_sums(&x[p * spatial..][..spatial], shift[p % channels]));
    let (mut s, mut q) = (vec![0.0f64; channels], vec![0.0f64; channels]);
    for (p, (a, b)) in sums.into_iter().enumerate() {
        s[p % channels] += a;
        q[p % channels] += b;
    }
    let count = (planes / channels * spatial) as f64;
    let mean = (0..channels).map(|c| shift[c] + s[c] / count).collect();
    // sum((x - mean)^2) = sum((x - k)^2) - sum(x - k)^2 / n; never below 0 in exact arithmetic.
    let var = (0..channels).map(|c| ((q[c] - s[c] * s[c] / count) / count).max(0.0)).collect();
    (mean, var)
}

/// `m` as the sum of two compute-type values `hi + lo`: `(x - hi) - lo` is `x - m` to within
/// a rounding of the result, as `x - m` computed in f64, but in the compute type's vectors.
#[inline]
pub(super) fn split<C: Special>(m: f64) -> (C, C) {
    let hi = C::of(m);
    (hi, C::of(m - hi.to_f64().unwrap_or(m)))
}

/// What the normalisation adds after the affine map.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a, T> {
    /// Added before the ReLU, same layout as `x`.
    pub residual: Option<&'a [T]>,
    pub relu: bool,
}

/// `out = (x - mean[c]) * scale[c] + shift[c]`, plus the residual, then ReLU, per the
/// epilogue, over contiguous `[outer, C, spatial]` data, in the compute precision.
pub(super) fn normalize<T: ComputeAs>(
    x: &[T],
    ch: Channels,
    (mean, scale, shift): (&[f64], &[f64], &[f64]),
    epi: Epilogue<'_, T>,
) -> Vec<T> {
    let spatial = ch.spatial.max(1);
    let means: Vec<(T::C, T::C)> = mean.iter().map(|&m| split(m)).collect();
    let to_c = |v: &[f64]| v.iter().map(|&x| T::C::of(x)).collect::<Vec<_>>();
    let (scale, shift) = (to_c(scale), to_c(shift));
    filled(x.len(), |start, out| {
        // Chunks may start inside a plane: walk plane pieces.
        let mut i = 0;
        while i < out.len() {
            let at = start + i;
            let c = (at / spatial) % ch.channels;
            let take = (spatial - at % spatial).min(out.len() - i);
            let f = (means[c], scale[c], shift[c]);
            let (o, xs) = (&mut out[i..i + take], &x[at..at + take]);
            match (epi.residual.map(|r| &r[at..at + take]), epi.relu) {
                (None, false) => piece::<T, false>(o, xs, None, f),
                (None, true) => piece::<T, true>(o, xs, None, f),
                (Some(r), false) => piece::<T, false>(o, xs, Some(r), f),
                (Some(r), true) => piece::<T, true>(o, xs, Some(r), f),
            }
            i += take;
        }
    })
}

/// A channel's affine map as [`piece`] takes it: the mean split as `(hi, lo)` (see [`split`]),
/// the scale and the shift.
type Affine<C> = ((C, C), C, C);

/// One plane piece of [`normalize`]; `RELU` and the residual's presence are fixed per loop, so
/// each combination is its own vectorised loop.
#[inline(always)]
fn piece<T: ComputeAs, const RELU: bool>(
    out: &mut [MaybeUninit<T>],
    x: &[T],
    residual: Option<&[T]>,
    ((hi, lo), a, z): Affine<T::C>,
) {
    let zero = T::C::of(0.0);
    // NaN stays NaN (`NaN < 0` is false), as torch.relu.
    let relu = |y: T::C| if RELU && y < zero { zero } else { y };
    match residual {
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                o.write(T::down(relu(((v.up() - hi) - lo) * a + z)));
            }
        }
        Some(r) => {
            for ((o, &v), &r) in out.iter_mut().zip(x).zip(r) {
                o.write(T::down(relu(((v.up() - hi) - lo) * a + z + r.up())));
            }
        }
    }
}
