//! CPU kernels for layer norm (batch norm's are in `planes.rs` and `backward.rs`). Row
//! statistics are two-pass (mean, then the mean of squared deviations) accumulated in f64, so
//! a large mean does not swamp a small variance. Outputs are computed in the dtype's compute
//! precision (f32 for f16/bf16) and rounded once.

use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::strided::PAR_THRESHOLD;
use rayon::prelude::*;

/// A tensor seen as `[outer, channels, spatial]` in row-major order: the channel of linear
/// index `i` is `(i / spatial) % channels`.
#[derive(Clone, Copy)]
pub(super) struct Channels {
    pub channels: usize,
    pub spatial: usize,
}

/// `x - mean` in f64 before rounding to the compute type: a large mean over a small spread
/// would otherwise lose the spread to the rounding of the mean itself.
#[inline(always)]
fn centered<T: ComputeAs>(x: T, mean: f64) -> T::C {
    T::C::of(x.to_f64() - mean)
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
