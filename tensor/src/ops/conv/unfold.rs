//! Moving data between a convolution's tensors and the column matrices its GEMMs read: im2col
//! and its adjoint, and the copies that put several samples side by side in one matrix.
//!
//! A column matrix has one row per patch entry `(c, ki, kj)` (or per channel, for a plain
//! copy) and `ld` columns; one tile of output pixels (a band of rows of one sample, or whole
//! planes of several samples) owns `cols` of them starting at column `c0`.

use super::cpu::Geometry;
use crate::ops::matmul::cpu::GemmElement;

/// Unfolds output rows `r0..r1` of one sample `x [C, H, W]` into the columns `c0..c0 +
/// (r1-r0)*OW` of `col [C*KH*KW, ld]`.
pub(super) fn im2col<T: GemmElement>(
    x: &[T],
    g: &Geometry,
    (r0, r1): (usize, usize),
    col: &mut [T],
    (ld, c0): (usize, usize),
) {
    let band = (r1 - r0) * g.ow;
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let mut r = 0;
    for c in 0..g.c {
        let plane = &x[c * g.in_plane()..][..g.in_plane()];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &mut col[r * ld + c0..][..band];
                r += 1;
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

/// The adjoint of [`im2col`]: adds each entry of the columns `c0..` of `col [C*KH*KW, ld]`
/// back onto the pixel of `x [C, H, W]` it came from.
pub(super) fn col2im_add<T: GemmElement + std::ops::AddAssign>(
    col: &[T],
    (ld, c0): (usize, usize),
    g: &Geometry,
    (r0, r1): (usize, usize),
    x: &mut [T],
) {
    let band = (r1 - r0) * g.ow;
    let [sh, sw] = g.stride;
    let [ph, pw] = g.padding;
    let [dh, dw] = g.dilation;
    let mut r = 0;
    for c in 0..g.c {
        let plane = &mut x[c * g.in_plane()..][..g.in_plane()];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &col[r * ld + c0..][..band];
                r += 1;
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

/// Copies the `rows` planes of `plane` elements of each of the samples `samples` of `src`
/// (`[N, rows, plane]`) side by side into `dst [rows, samples.len() * plane]`.
pub(super) fn gather<T: Copy>(
    src: &[T],
    rows: usize,
    plane: usize,
    samples: std::ops::Range<usize>,
    dst: &mut [T],
) {
    let ld = samples.len() * plane;
    for (s, n) in samples.enumerate() {
        let sample = &src[n * rows * plane..][..rows * plane];
        for (r, piece) in sample.chunks_exact(plane).enumerate() {
            dst[r * ld + s * plane..][..plane].copy_from_slice(piece);
        }
    }
}

/// The inverse of [`gather`]: `src [rows, samples.len() * plane]` back into the samples'
/// planes of `dst` (`[samples.len(), rows, plane]`, the group's part of the output).
pub(super) fn scatter<T: Copy>(src: &[T], rows: usize, plane: usize, samples: usize, dst: &mut [T]) {
    let ld = samples * plane;
    for (s, sample) in dst.chunks_exact_mut(rows * plane).take(samples).enumerate() {
        for (r, piece) in sample.chunks_exact_mut(plane).enumerate() {
            piece.copy_from_slice(&src[r * ld + s * plane..][..plane]);
        }
    }
}
