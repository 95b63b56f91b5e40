//! CPU kernels for normalisation. Statistics are two-pass (mean, then the mean of squared
//! deviations) accumulated in f64, so a large mean does not swamp a small variance. Outputs
//! are computed in the dtype's compute precision (f32 for f16/bf16) and rounded once.

use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::strided::{chunk_len, Walk, PAR_THRESHOLD};
use crate::Layout;
use rayon::prelude::*;

/// Elements per partial sum of the channel statistics. Fixed, not derived from the thread
/// count, so the summation order (and so the result) is the same on every machine.
const STAT_CHUNK: usize = 1 << 14;

/// A tensor seen as `[outer, channels, spatial]` in row-major order: the channel of linear
/// index `i` is `(i / spatial) % channels`.
#[derive(Clone, Copy)]
pub(super) struct Channels {
    pub channels: usize,
    pub spatial: usize,
}

/// Calls `f(base, stride, len, channel)` for the pieces of the walk's runs over linear indices
/// `start..end`, cut where the channel changes.
#[inline]
fn channel_segments(
    walk: &Walk<1>,
    (start, end): (usize, usize),
    ch: Channels,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    let mut pos = start;
    walk.for_each_run(start, end, |[base], [stride], len| {
        let mut done = 0;
        while done < len {
            let at = pos + done;
            let take = (ch.spatial - at % ch.spatial).min(len - done);
            f(base + done * stride, stride, take, (at / ch.spatial) % ch.channels);
            done += take;
        }
        pos += len;
    });
}

/// `sum over elements x of channel c of g(x, c)`, per channel.
fn per_channel_sum<T: Element>(
    src: &[T],
    layout: &Layout,
    ch: Channels,
    g: impl Fn(f64, usize) -> f64 + Sync,
) -> Vec<f64> {
    let walk = Walk::new([layout]);
    let n = walk.numel();
    let partial = |k: usize| {
        let mut acc = vec![0.0f64; ch.channels];
        channel_segments(&walk, (k * STAT_CHUNK, (k + 1) * STAT_CHUNK), ch, |b, s, len, c| {
            acc[c] += if s == 1 {
                src[b..b + len].iter().map(|&x| g(x.to_f64(), c)).sum::<f64>()
            } else {
                (0..len).map(|j| g(src[b + j * s].to_f64(), c)).sum::<f64>()
            };
        });
        acc
    };
    let chunks = n.div_ceil(STAT_CHUNK);
    let partials: Vec<Vec<f64>> = if n < PAR_THRESHOLD {
        (0..chunks).map(partial).collect()
    } else {
        (0..chunks).into_par_iter().map(partial).collect()
    };
    let mut total = vec![0.0f64; ch.channels];
    for p in partials {
        total.iter_mut().zip(p).for_each(|(t, x)| *t += x);
    }
    total
}

/// Per-channel mean and biased variance.
pub(super) fn channel_moments<T: Element>(src: &[T], layout: &Layout, ch: Channels) -> (Vec<f64>, Vec<f64>) {
    let count = (layout.elem_count() / ch.channels.max(1)) as f64;
    let mean: Vec<f64> = per_channel_sum(src, layout, ch, |x, _| x).into_iter().map(|s| s / count).collect();
    let var = per_channel_sum(src, layout, ch, |x, c| (x - mean[c]) * (x - mean[c]))
        .into_iter()
        .map(|s| s / count)
        .collect();
    (mean, var)
}

/// `x - mean` in f64 before rounding to the compute type: a large mean over a small spread
/// would otherwise lose the spread to the rounding of the mean itself.
#[inline(always)]
fn centered<T: ComputeAs>(x: T, mean: f64) -> T::C {
    T::C::of(x.to_f64() - mean)
}

/// `(x - center[c]) * scale[c] + shift[c]` for each element `x` of channel `c`, as a
/// contiguous vector.
pub(super) fn channel_affine<T: ComputeAs>(
    src: &[T],
    layout: &Layout,
    ch: Channels,
    (center, scale, shift): (&[f64], &[f64], &[f64]),
) -> Vec<T> {
    let to_c = |v: &[f64]| v.iter().map(|&x| T::C::of(x)).collect::<Vec<_>>();
    let (scale, shift) = (to_c(scale), to_c(shift));
    let walk = Walk::new([layout]);
    let mut out = vec![T::default(); walk.numel()];
    let fill = |start: usize, chunk: &mut [T]| {
        let mut o = 0;
        channel_segments(&walk, (start, start + chunk.len()), ch, |b, s, len, c| {
            let (m, a, z) = (center[c], scale[c], shift[c]);
            let dst = &mut chunk[o..o + len];
            if s == 1 {
                for (d, &x) in dst.iter_mut().zip(&src[b..b + len]) {
                    *d = T::down(centered(x, m) * a + z);
                }
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = T::down(centered(src[b + j * s], m) * a + z);
                }
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

/// Layer norm over rows of `row_len` contiguous elements: the output, and each row's mean and
/// reciprocal standard deviation `1 / sqrt(biased var + eps)`.
pub(super) fn layer_norm<T: ComputeAs>(
    x: &[T],
    row_len: usize,
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
) -> (Vec<T>, Vec<f64>, Vec<f64>) {
    let rows = x.len().checked_div(row_len).unwrap_or(0);
    let mut out = vec![T::default(); x.len()];
    let (mut mean, mut rstd) = (vec![f64::NAN; rows], vec![f64::NAN; rows]);
    if out.is_empty() {
        return (out, mean, rstd);
    }
    let to_c = |v: Option<&[f64]>| v.map(|v| v.iter().map(|&x| T::C::of(x)).collect::<Vec<_>>());
    let (weight, bias) = (to_c(weight), to_c(bias));
    let norm_row = |dst: &mut [T], src: &[T], m: &mut f64, r: &mut f64| {
        let n = row_len as f64;
        let mu = src.iter().map(|x| x.to_f64()).sum::<f64>() / n;
        let var = src.iter().map(|x| (x.to_f64() - mu) * (x.to_f64() - mu)).sum::<f64>() / n;
        let rs = 1.0 / (var + eps).sqrt();
        (*m, *r) = (mu, rs);
        let rs = T::C::of(rs);
        match (&weight, &bias) {
            (Some(w), Some(b)) => {
                for (((d, &x), &w), &b) in dst.iter_mut().zip(src).zip(w).zip(b) {
                    *d = T::down(centered(x, mu) * rs * w + b);
                }
            }
            (Some(w), None) => {
                for ((d, &x), &w) in dst.iter_mut().zip(src).zip(w) {
                    *d = T::down(centered(x, mu) * rs * w);
                }
            }
            (None, Some(b)) => {
                for ((d, &x), &b) in dst.iter_mut().zip(src).zip(b) {
                    *d = T::down(centered(x, mu) * rs + b);
                }
            }
            (None, None) => {
                for (d, &x) in dst.iter_mut().zip(src) {
                    *d = T::down(centered(x, mu) * rs);
                }
            }
        }
    };
    if x.len() < PAR_THRESHOLD {
        out.chunks_mut(row_len)
            .zip(x.chunks(row_len))
            .zip(mean.iter_mut().zip(rstd.iter_mut()))
            .for_each(|((d, s), (m, r))| norm_row(d, s, m, r));
    } else {
        let min_rows = (PAR_THRESHOLD / 4 / row_len).max(1);
        out.par_chunks_mut(row_len)
            .zip(x.par_chunks(row_len))
            .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
            .with_min_len(min_rows)
            .for_each(|((d, s), (m, r))| norm_row(d, s, m, r));
    }
    (out, mean, rstd)
}
