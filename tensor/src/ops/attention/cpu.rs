//! Attention as direct loops in f64: the CPU path of `flash_attention` and the reference of the
//! CUDA kernels. Every query row goes through its visible keys twice (the scores' maximum, then
//! the weighted sum), so no `[L, S]` matrix is kept.

use crate::Tensor;

/// Whether query `i` sees key `j` of a row with `key_len` real keys.
fn visible(i: usize, j: usize, key_len: usize, causal: bool) -> bool {
    j < key_len && !(causal && j > i)
}

struct Operands {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    h: usize,
    l: usize,
    s: usize,
    d: usize,
}

impl Operands {
    fn new(q: &Tensor, k: &Tensor, v: &Tensor) -> Operands {
        let (qd, kd) = (q.dims(), k.dims());
        Operands {
            q: q.kernel_f64_values(),
            k: k.kernel_f64_values(),
            v: v.kernel_f64_values(),
            h: qd[1],
            l: qd[2],
            s: kd[2],
            d: qd[3],
        }
    }
    fn q_row(&self, bh: usize, i: usize) -> &[f64] {
        &self.q[(bh * self.l + i) * self.d..][..self.d]
    }
    fn k_row(&self, bh: usize, j: usize) -> &[f64] {
        &self.k[(bh * self.s + j) * self.d..][..self.d]
    }
    fn v_row(&self, bh: usize, j: usize) -> &[f64] {
        &self.v[(bh * self.s + j) * self.d..][..self.d]
    }
    fn key_len(&self, bh: usize, lens: Option<&[i64]>) -> usize {
        lens.map_or(self.s, |lens| lens[bh / self.h].clamp(0, self.s as i64) as usize)
    }
    /// The scaled scores of query `i` against every key, `None` where it does not see the key.
    fn scores(&self, bh: usize, i: usize, key_len: usize, scale: f64, causal: bool) -> Vec<Option<f64>> {
        let q = self.q_row(bh, i);
        (0..self.s)
            .map(|j| visible(i, j, key_len, causal).then(|| scale * dot(q, self.k_row(bh, j))))
            .collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `(out [B, H, L, D], lse [B, H, L])` row-major.
pub(super) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    lens: Option<&[i64]>,
    scale: f64,
    causal: bool,
) -> (Vec<f64>, Vec<f32>) {
    let ops = Operands::new(q, k, v);
    let (l, d) = (ops.l, ops.d);
    let rows = q.dims()[0] * ops.h * l;
    let (mut out, mut lse) = (vec![0.0; rows * d], vec![0.0f32; rows]);
    for row in 0..rows {
        let (bh, i) = (row / l, row % l);
        let scores = ops.scores(bh, i, ops.key_len(bh, lens), scale, causal);
        let m = scores.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
        let o = &mut out[row * d..][..d];
        let mut sum = 0.0;
        for (j, s) in scores.iter().enumerate() {
            if let Some(s) = s {
                let p = (s - m).exp();
                sum += p;
                for (o, v) in o.iter_mut().zip(ops.v_row(bh, j)) {
                    *o += p * v;
                }
            }
        }
        // No visible key: 0 / 0 = NaN, as PyTorch; the log-sum-exp is -inf.
        o.iter_mut().for_each(|x| *x /= sum);
        lse[row] = (m + sum.ln()) as f32;
    }
    (out, lse)
}

/// `(dq, dk, dv)` row-major, from `p = exp(score - lse)`: dv = p^T dout,
/// ds = p * (dout v^T - delta) with delta = rowsum(dout * out), dq = scale ds k, dk = scale ds^T q.
pub(super) fn backward(
    dout: &Tensor,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&Tensor, &Tensor),
    lens: Option<&[i64]>,
    scale: f64,
    causal: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let ops = Operands::new(q, k, v);
    let (l, s, d) = (ops.l, ops.s, ops.d);
    let bhs = q.dims()[0] * ops.h;
    let (dout, out, lse) = (dout.kernel_f64_values(), out.kernel_f64_values(), lse.kernel_f64_values());
    let (mut dq, mut dk, mut dv) = (vec![0.0; bhs * l * d], vec![0.0; bhs * s * d], vec![0.0; bhs * s * d]);
    for row in 0..bhs * l {
        let (bh, i) = (row / l, row % l);
        let g = &dout[row * d..][..d];
        let delta = dot(g, &out[row * d..][..d]);
        let scores = ops.scores(bh, i, ops.key_len(bh, lens), scale, causal);
        for (j, sc) in scores.iter().enumerate() {
            let Some(sc) = sc else { continue };
            let p = (sc - lse[row]).exp();
            let at = (bh * s + j) * d;
            for (dv, g) in dv[at..][..d].iter_mut().zip(g) {
                *dv += p * g;
            }
            let ds = p * (dot(g, ops.v_row(bh, j)) - delta);
            for (dq, k) in dq[row * d..][..d].iter_mut().zip(ops.k_row(bh, j)) {
                *dq += scale * ds * k;
            }
            for (dk, q) in dk[at..][..d].iter_mut().zip(ops.q_row(bh, i)) {
                *dk += scale * ds * q;
            }
        }
    }
    (dq, dk, dv)
}
