//! Layer norm's backward on the CPU, fused: per row, one pass for the sums of `gy` and
//! `gy * x_hat` (`gy = dy * weight`) and one for the input gradient; the weight and bias
//! gradients are column sums over the rows, taken in fixed blocks of rows and added in order,
//! so the result is the same on every thread count. Everything accumulates in f64. The
//! composed version it replaces took eight allocating tensor passes.

use crate::dtype::Element;
use rayon::prelude::*;

/// Rows per partial column sum of the parameter gradients (fixed: the order of the sums must
/// not depend on the machine).
const PARAM_ROWS: usize = 64;

/// Per-row statistics and the weight, all f64, as the kernels take them.
pub(super) struct RowStats<'a> {
    pub mean: &'a [f64],
    pub rstd: &'a [f64],
    pub weight: Option<&'a [f64]>,
}

/// The input gradient of contiguous rows of `len`, in the dtype of `dy` (computed in f64,
/// rounded once).
pub(super) fn input_grad<T: Element>(dy: &[T], x: &[T], len: usize, st: &RowStats) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); dy.len()];
    if len == 0 {
        return out;
    }
    let row = |(r, dst): (usize, &mut [T])| {
        let (g, v) = (&dy[r * len..(r + 1) * len], &x[r * len..(r + 1) * len]);
        let (m, rs) = (st.mean[r], st.rstd[r]);
        let w = |j: usize| st.weight.map_or(1.0, |w| w[j]);
        let (mut s, mut sx) = (0.0f64, 0.0f64);
        for j in 0..len {
            let gy = g[j].to_f64() * w(j);
            s += gy;
            sx += gy * (v[j].to_f64() - m) * rs;
        }
        let (mean_gy, mean_gyx) = (s / len as f64, sx / len as f64);
        for j in 0..len {
            let xhat = (v[j].to_f64() - m) * rs;
            dst[j] = T::from_f64(rs * (g[j].to_f64() * w(j) - mean_gy - xhat * mean_gyx));
        }
    };
    if dy.len() < crate::strided::PAR_THRESHOLD {
        out.chunks_mut(len).enumerate().for_each(row);
    } else {
        out.par_chunks_mut(len).enumerate().for_each(row);
    }
    out
}

/// `(sum over rows of dy * x_hat, sum over rows of dy)`, each of `len` columns.
pub(super) fn param_grads<T: Element>(dy: &[T], x: &[T], len: usize, st: &RowStats) -> (Vec<f64>, Vec<f64>) {
    let rows = dy.len().checked_div(len).unwrap_or(0);
    let block = |b: usize| {
        let (mut dw, mut db) = (vec![0.0f64; len], vec![0.0f64; len]);
        for r in b * PARAM_ROWS..((b + 1) * PARAM_ROWS).min(rows) {
            let (g, v) = (&dy[r * len..(r + 1) * len], &x[r * len..(r + 1) * len]);
            let (m, rs) = (st.mean[r], st.rstd[r]);
            for j in 0..len {
                let gj = g[j].to_f64();
                dw[j] += gj * (v[j].to_f64() - m) * rs;
                db[j] += gj;
            }
        }
        (dw, db)
    };
    let blocks = rows.div_ceil(PARAM_ROWS);
    let partials: Vec<(Vec<f64>, Vec<f64>)> = if dy.len() < crate::strided::PAR_THRESHOLD {
        (0..blocks).map(block).collect()
    } else {
        (0..blocks).into_par_iter().map(block).collect()
    };
    let (mut dw, mut db) = (vec![0.0f64; len], vec![0.0f64; len]);
    for (pw, pb) in partials {
        dw.iter_mut().zip(pw).for_each(|(t, v)| *t += v);
        db.iter_mut().zip(pb).for_each(|(t, v)| *t += v);
    }
    (dw, db)
}
