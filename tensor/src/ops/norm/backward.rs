//! Batch norm's backward in training mode on the CPU, fused: one pass over `dy` and `x` for
//! the per-channel sums of `dy` and `dy * (x - mean)` together (in f64, each (sample, channel)
//! plane summed on its own and the planes added in a fixed order, so the result is as close
//! to f64 as the data allows and the same on every thread count), then one elementwise pass
//! for the input gradient. The composed version took five allocating passes and recomputed
//! `x_hat` as a tensor.

use super::cpu::Channels;
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::strided::{filled, PAR_THRESHOLD};
use rayon::prelude::*;

/// Per-channel `(sum dy, sum dy * (x - mean))` of contiguous `[outer, C, spatial]` data.
pub(super) fn channel_grad_sums<T: Element>(
    dy: &[T],
    x: &[T],
    ch: Channels,
    mean: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (channels, spatial) = (ch.channels, ch.spatial.max(1));
    let planes = dy.len() / spatial;
    let plane = |p: usize| {
        let m = mean[p % channels];
        let (dy, x) = (&dy[p * spatial..(p + 1) * spatial], &x[p * spatial..(p + 1) * spatial]);
        let (mut s, mut sx) = (0.0f64, 0.0f64);
        for (&g, &v) in dy.iter().zip(x) {
            let g = g.to_f64();
            s += g;
            sx += g * (v.to_f64() - m);
        }
        (s, sx)
    };
    let sums: Vec<(f64, f64)> = if dy.len() < PAR_THRESHOLD {
        (0..planes).map(plane).collect()
    } else {
        let min = (PAR_THRESHOLD / 4 / spatial).max(1);
        (0..planes).into_par_iter().with_min_len(min).map(plane).collect()
    };
    let (mut sum_dy, mut sum_dyx) = (vec![0.0; channels], vec![0.0; channels]);
    for (p, (s, sx)) in sums.into_iter().enumerate() {
        sum_dy[p % channels] += s;
        sum_dyx[p % channels] += sx;
    }
    (sum_dy, sum_dyx)
}

/// `dx = scale[c] * (dy - shift[c] - (x - mean[c]) * k[c])` over contiguous `[outer, C,
/// spatial]` data, in the dtype's compute precision.
pub(super) fn input_grad<T: ComputeAs>(
    dy: &[T],
    x: &[T],
    ch: Channels,
    (mean, scale, shift, k): (&[f64], &[f64], &[f64], &[f64]),
) -> Vec<T> {
    let spatial = ch.spatial.max(1);
    let c = |v: &[f64]| v.iter().map(|&x| T::C::of(x)).collect::<Vec<_>>();
    let (mean, scale, shift, k) = (c(mean), c(scale), c(shift), c(k));
    filled(dy.len(), |start, out| {
        // Chunks may start inside a plane: walk plane pieces.
        let mut i = 0;
        while i < out.len() {
            let at = start + i;
            let channel = (at / spatial) % ch.channels;
            let take = (spatial - at % spatial).min(out.len() - i);
            let (m, a, b, kk) = (mean[channel], scale[channel], shift[channel], k[channel]);
            for ((o, &g), &v) in out[i..i + take].iter_mut().zip(&dy[at..at + take]).zip(&x[at..at + take]) {
                o.write(T::down(a * (g.up() - b - (v.up() - m) * kk)));
            }
            i += take;
        }
    })
}
