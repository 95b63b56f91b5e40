//! CPU 2-D convolution as im2col + GEMM, one sample (and one band of output rows) at a time.
//!
//! For each sample the input patches of a band of output rows are unfolded into a column matrix
//! `col [C*KH*KW, rows*OW]` (im2col), and each group's output is one GEMM
//! `weight_g [O/g, C/g*KH*KW] @ col_g`. Unfolding band by band keeps the column buffer small
//! (a few hundred KB) so it is still in cache when GEMM reads it, instead of the 7 MB a whole
//! 56x56x64 sample would need (231 MB for a batch of 32). Samples run in parallel, one per rayon
//! task, each with its own buffer; when there are fewer samples than threads, GEMM gets the
//! threads instead. A 1x1 convolution with stride 1 and no padding needs no unfolding: the
//! input itself is the column matrix.

use crate::ops::matmul::cpu::{gemm_into, GemmElement, Mat};
use rayon::prelude::*;

/// Shapes and hyper-parameters of one convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

/// Bytes of column buffer per band: small enough to stay in L2 between im2col and GEMM. On the
/// 2-core AVX-512 EPYC, 256 KB to 1 MB bands ran the 64-channel 56x56 benchmark a few percent
/// faster than 4 MB bands or whole samples, and about 12% faster than 64 KB bands.
const BAND_BYTES: usize = 512 * 1024;

impl Geometry {
    /// Rows of the column matrix per group: `C/groups * KH * KW`.
    fn patch(&self) -> usize {
        self.c / self.groups * self.kh * self.kw
    }

    fn out_plane(&self) -> usize {
        self.oh * self.ow
    }

    fn in_plane(&self) -> usize {
        self.h * self.w
    }

    /// A 1x1 kernel with unit stride and no padding reads the input as it lies.
    fn is_pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Output rows per band, at least one.
    fn band_rows<T>(&self) -> usize {
        let row_bytes = self.c * self.kh * self.kw * self.ow * std::mem::size_of::<T>();
        (BAND_BYTES / row_bytes.max(1)).clamp(1, self.oh.max(1))
    }

    fn bands<T>(&self) -> impl Iterator<Item = (usize, usize)> {
        let step = self.band_rows::<T>();
        let oh = self.oh;
        (0..oh).step_by(step).map(move |r| (r, (r + step).min(oh)))
    }

    /// The first and one-past-last output column whose input column `ox * s + k * d - p` lies
    /// inside `0..len`.
    fn valid_cols(len: usize, out: usize, s: usize, offset: isize) -> (usize, usize) {
        // offset = k * d - p; ix = ox * s + offset.
        let lo = if offset >= 0 { 0 } else { ((-offset) as usize).div_ceil(s) };
        let hi = if (len as isize) <= offset { 0 } else { (len as isize - offset) as usize }.div_ceil(s);
        (lo.min(out), hi.min(out).max(lo.min(out)))
    }
}

/// Unfolds output rows `r0..r1` of one sample `x [C, H, W]` into `col [C*KH*KW, (r1-r0)*OW]`.
fn im2col<T: GemmElement>(x: &[T], g: &Geometry, (r0, r1): (usize, usize), col: &mut [T]) {
    let band = (r1 - r0) * g.ow;
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let mut rows = col.chunks_exact_mut(band);
    for c in 0..g.c {
        let plane = &x[c * g.in_plane()..][..g.in_plane()];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = rows.next().expect("column buffer sized for every patch row");
                let x_off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = Geometry::valid_cols(g.w, g.ow, sw, x_off);
                for (oy, dst) in (r0..r1).zip(row.chunks_exact_mut(g.ow)) {
                    let iy = (oy * sh + ki * dh) as isize - ph as isize;
                    if iy < 0 || iy >= g.h as isize {
                        dst.fill(T::zero());
                        continue;
                    }
                    let src = &plane[iy as usize * g.w..][..g.w];
                    dst[..lo].fill(T::zero());
                    dst[hi..].fill(T::zero());
                    let start = (lo * sw) as isize + x_off;
                    if sw == 1 {
                        dst[lo..hi].copy_from_slice(&src[start as usize..][..hi - lo]);
                    } else {
                        for (j, d) in dst[lo..hi].iter_mut().enumerate() {
                            *d = src[start as usize + j * sw];
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: adds each column entry back onto the input pixel it came from.
fn col2im_add<T: GemmElement + std::ops::AddAssign>(
    col: &[T],
    g: &Geometry,
    (r0, r1): (usize, usize),
    x: &mut [T],
) {
    let band = (r1 - r0) * g.ow;
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let mut rows = col.chunks_exact(band);
    for c in 0..g.c {
        let plane = &mut x[c * g.in_plane()..][..g.in_plane()];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = rows.next().expect("column buffer sized for every patch row");
                let x_off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = Geometry::valid_cols(g.w, g.ow, sw, x_off);
                for (oy, src) in (r0..r1).zip(row.chunks_exact(g.ow)) {
                    let iy = (oy * sh + ki * dh) as isize - ph as isize;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    let dst = &mut plane[iy as usize * g.w..][..g.w];
                    let start = ((lo * sw) as isize + x_off) as usize;
                    if sw == 1 {
                        for (d, &s) in dst[start..][..hi - lo].iter_mut().zip(&src[lo..hi]) {
                            *d += s;
                        }
                    } else {
                        for (j, &s) in src[lo..hi].iter().enumerate() {
                            dst[start + j * sw] += s;
                        }
                    }
                }
            }
        }
    }
}

/// Products of this many terms at most are summed in one run. gemm's microkernel adds a whole
/// product in one register, so an f32 sum over a long reduction (`C*KH*KW` = 2304 in
/// ResNet's 3x3 layers of 256 channels, `O` = 512 in an input gradient) drifts further from
/// f64 the longer it is. Summing blocks and adding the block sums (gemm's `dst +=`) keeps the
/// error of any convolution near that of a short product, as PyTorch's oneDNN convolution
/// does (2e-7 relative at any channel count, where one 2304-term run gave 3.4e-7). Each block
/// costs one more pass over the output tile, in cache. The weight gradient needs no blocks:
/// its reduction is cut by bands and samples already, and it was closer to f64 than
/// PyTorch's.
const K_BLOCK: usize = 128;

/// `dst (+)= lhs[m x k] @ rhs[k x n]` as [`gemm_into`], the reduction cut into blocks of at
/// most [`K_BLOCK`] terms whose sums are added into `dst` one after another. Only for f32:
/// f64 needs no help, and an f16 `dst` would be rounded to f16 after every block, where gemm
/// alone rounds once from its f32 accumulators.
#[allow(clippy::too_many_arguments)]
fn gemm_k_blocked<T: GemmElement>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    dst_rs: usize,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    accumulate: bool,
    threads: usize,
) {
    if k <= K_BLOCK || std::any::TypeId::of::<T>() != std::any::TypeId::of::<f32>() {
        return gemm_into((m, n, k), dst, dst_rs, lhs, rhs, accumulate, threads);
    }
    for k0 in (0..k).step_by(K_BLOCK) {
        let kb = K_BLOCK.min(k - k0);
        let l = Mat { offset: lhs.offset + k0 * lhs.cs, ..lhs };
        let r = Mat { offset: rhs.offset + k0 * rhs.rs, ..rhs };
        gemm_into((m, n, kb), dst, dst_rs, l, r, accumulate || k0 > 0, threads);
    }
}

/// Runs `f(sample, out_chunk, col_buffer, gemm_threads)` for every sample, one output chunk of
/// `chunk` elements each: in parallel over samples when there are enough of them, else one
/// after another with GEMM using the threads.
fn per_sample<T: GemmElement>(
    out: &mut [T],
    chunk: usize,
    col_len: usize,
    f: impl Fn(usize, &mut [T], &mut Vec<T>, usize) + Sync,
) {
    let threads = rayon::current_num_threads();
    let samples = out.len() / chunk.max(1);
    if chunk == 0 {
        return;
    }
    if threads > 1 && samples >= threads {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each_init(|| vec![T::zero(); col_len], |col, (i, o)| f(i, o, col, 1));
    } else {
        let mut col = vec![T::zero(); col_len];
        for (i, o) in out.chunks_mut(chunk).enumerate() {
            f(i, o, &mut col, threads);
        }
    }
}

/// `y = conv2d(x, w) + bias`; `x [N, C, H, W]` and `w [O, C/g, KH, KW]` contiguous.
pub(crate) fn forward<T: GemmElement>(x: &[T], w: &[T], bias: Option<&[T]>, g: &Geometry) -> Vec<T> {
    let (l, patch, og) = (g.out_plane(), g.patch(), g.o / g.groups);
    let mut y = vec![T::zero(); g.n * g.o * l];
    let col_len = if g.is_pointwise() { 0 } else { g.c * g.kh * g.kw * g.band_rows::<T>() * g.ow };
    per_sample(&mut y, g.o * l, col_len, |n, y_n, col, threads| {
        if let Some(b) = bias {
            for (row, &bo) in y_n.chunks_exact_mut(l).zip(b) {
                row.fill(bo);
            }
        }
        let x_n = &x[n * g.c * g.in_plane()..][..g.c * g.in_plane()];
        for (r0, r1) in g.bands::<T>() {
            let band = (r1 - r0) * g.ow;
            if !g.is_pointwise() {
                im2col(x_n, g, (r0, r1), col);
            }
            for gi in 0..g.groups {
                let lhs = Mat::new(w, gi * og * patch, patch, 1);
                // Pointwise: the group's input channels at this band are the column matrix.
                let rhs = if g.is_pointwise() {
                    Mat::new(x_n, gi * patch * l + r0 * g.ow, l, 1)
                } else {
                    Mat::new(col, gi * patch * band, band, 1)
                };
                let dst = &mut y_n[gi * og * l + r0 * g.ow..];
                gemm_k_blocked((og, band, patch), dst, l, lhs, rhs, bias.is_some(), threads);
            }
        }
    });
    y
}

/// The gradient of [`forward`] with respect to its input: `grad_y [N, O, OH, OW]` contiguous.
pub(crate) fn backward_input<T: GemmElement + std::ops::AddAssign>(
    grad_y: &[T],
    w: &[T],
    g: &Geometry,
) -> Vec<T> {
    let (l, patch, og, cg) = (g.out_plane(), g.patch(), g.o / g.groups, g.c / g.groups);
    let mut grad_x = vec![T::zero(); g.n * g.c * g.in_plane()];
    let col_len = if g.is_pointwise() { 0 } else { g.c * g.kh * g.kw * g.band_rows::<T>() * g.ow };
    per_sample(&mut grad_x, g.c * g.in_plane(), col_len, |n, gx_n, col, threads| {
        let gy_n = &grad_y[n * g.o * l..][..g.o * l];
        for (r0, r1) in g.bands::<T>() {
            let band = (r1 - r0) * g.ow;
            for gi in 0..g.groups {
                // weight_g^T [patch, O/g] @ grad_y_g [O/g, band]
                let lhs = Mat::new(w, gi * og * patch, patch, 1).t();
                let rhs = Mat::new(gy_n, gi * og * l + r0 * g.ow, l, 1);
                if g.is_pointwise() {
                    let dst = &mut gx_n[gi * cg * l + r0 * g.ow..];
                    gemm_k_blocked((patch, band, og), dst, l, lhs, rhs, false, threads);
                } else {
                    let dst = &mut col[gi * patch * band..];
                    gemm_k_blocked((patch, band, og), dst, band, lhs, rhs, false, threads);
                }
            }
            if !g.is_pointwise() {
                col2im_add(&col[..g.c * g.kh * g.kw * band], g, (r0, r1), gx_n);
            }
        }
    });
    grad_x
}

/// The gradient of [`forward`] with respect to its weight: `[O, C/g, KH, KW]`, summed over the batch.
pub(crate) fn backward_weight<T: GemmElement + std::ops::AddAssign>(
    grad_y: &[T],
    x: &[T],
    g: &Geometry,
) -> Vec<T> {
    let (l, patch, og) = (g.out_plane(), g.patch(), g.o / g.groups);
    let col_len = if g.is_pointwise() { 0 } else { g.c * g.kh * g.kw * g.band_rows::<T>() * g.ow };
    // grad_w_g [O/g, patch] += grad_y_g [O/g, band] @ col_g^T [band, patch], over samples in `range`.
    let accumulate = |range: std::ops::Range<usize>, threads: usize| {
        let mut gw = vec![T::zero(); g.o * patch];
        let mut col = vec![T::zero(); col_len];
        for n in range {
            let x_n = &x[n * g.c * g.in_plane()..][..g.c * g.in_plane()];
            let gy_n = &grad_y[n * g.o * l..][..g.o * l];
            for (r0, r1) in g.bands::<T>() {
                let band = (r1 - r0) * g.ow;
                if !g.is_pointwise() {
                    im2col(x_n, g, (r0, r1), &mut col);
                }
                for gi in 0..g.groups {
                    let lhs = Mat::new(gy_n, gi * og * l + r0 * g.ow, l, 1);
                    let rhs = if g.is_pointwise() {
                        Mat::new(x_n, gi * patch * l + r0 * g.ow, l, 1).t()
                    } else {
                        Mat::new(&col, gi * patch * band, band, 1).t()
                    };
                    let dst = &mut gw[gi * og * patch..];
                    gemm_into((og, patch, band), dst, patch, lhs, rhs, true, threads);
                }
            }
        }
        gw
    };
    let threads = rayon::current_num_threads();
    if threads > 1 && g.n >= threads {
        // One partial sum per thread over a contiguous run of samples, then their sum.
        (0..threads)
            .into_par_iter()
            .map(|t| accumulate(t * g.n / threads..(t + 1) * g.n / threads, 1))
            .reduce_with(|mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    *x += y;
                }
                a
            })
            .expect("at least one thread")
    } else {
        accumulate(0..g.n, threads)
    }
}
