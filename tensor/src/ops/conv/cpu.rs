//! CPU 2-D convolution as im2col + GEMM, one tile of output pixels at a time.
//!
//! A tile's input patches are unfolded into a column matrix `col [C*KH*KW, pixels]` (im2col),
//! and each group's output is one GEMM `weight_g [O/g, C/g*KH*KW] @ col_g`. A tile is a band of
//! output rows of one sample when a sample's output plane is large: unfolding band by band
//! keeps the column buffer small (a few hundred KB) so it is still in cache when GEMM reads it,
//! instead of the 7 MB a whole 56x56x64 sample would need (231 MB for a batch of 32). When the
//! plane is small (ResNet's last stages: 8x8 and 4x4 pixels), a tile is the whole planes of
//! several samples side by side, so that the GEMM is wide enough to run at speed and the
//! weight is packed once for all of them rather than once per sample; their outputs and output
//! gradients are copied between the tile's matrix and the tensors. Units of work (a sample, or
//! a group of samples) run in parallel, one per rayon task, each with its own buffers; when
//! there are fewer units than threads, GEMM gets the threads instead. A 1x1 convolution with
//! stride 1 and no padding needs no unfolding: the input itself is the column matrix.

use super::unfold::{col2im_add, gather, im2col, scatter};
use crate::ops::matmul::cpu::{gemm_into, GemmElement, Mat};
use rayon::prelude::*;
use std::cell::RefCell;
use std::thread::LocalKey;

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

/// Output pixels a GEMM should have at least: samples whose planes are smaller are put side by
/// side until their tile has this many (or the batch runs out).
const MIN_TILE_PIXELS: usize = 512;

/// How a pass cuts the batch: units of `samples` consecutive samples, each one tile of whole
/// planes when `samples > 1`, else one sample in bands of `rows` output rows.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    samples: usize,
    rows: usize,
}
impl Geometry {
    /// Rows of the column matrix per group: `C/groups * KH * KW`.
    fn patch(&self) -> usize {
        self.c / self.groups * self.kh * self.kw
    }

    pub(super) fn out_plane(&self) -> usize {
        self.oh * self.ow
    }

    pub(super) fn in_plane(&self) -> usize {
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

    /// The tiling of this convolution for `threads` threads: samples side by side when a plane
    /// has fewer than [`MIN_TILE_PIXELS`] pixels, as many as that takes, but no more than
    /// leaves each thread a unit.
    fn tiling<T>(&self, threads: usize) -> Tiling {
        let plane = self.out_plane().max(1);
        if plane >= MIN_TILE_PIXELS || self.n <= 1 {
            return Tiling { samples: 1, rows: self.band_rows::<T>() };
        }
        let samples = MIN_TILE_PIXELS.div_ceil(plane).min(self.n.div_ceil(threads.max(1))).max(1);
        Tiling { samples, rows: if samples > 1 { self.oh } else { self.band_rows::<T>() } }
    }

    /// The row ranges of a unit's tiles: bands of `t.rows` rows (all rows when samples sit
    /// side by side).
    fn bands(&self, t: Tiling) -> impl Iterator<Item = (usize, usize)> {
        let (step, oh) = (t.rows.max(1), self.oh);
        (0..oh).step_by(step).map(move |r| (r, (r + step).min(oh)))
    }

    /// Column-buffer elements a unit needs: the unfolded patches of its largest tile.
    fn col_len(&self, t: Tiling) -> usize {
        let pixels = t.samples * t.rows.min(self.oh) * self.ow;
        if self.is_pointwise() && t.samples == 1 {
            0
        } else {
            self.c * self.kh * self.kw * pixels
        }
    }

    /// The first and one-past-last output column whose input column `ox * s + k * d - p` lies
    /// inside `0..len`.
    pub(super) fn valid_cols(len: usize, out: usize, s: usize, offset: isize) -> (usize, usize) {
        // offset = k * d - p; ix = ox * s + offset.
        let lo = if offset >= 0 { 0 } else { ((-offset) as usize).div_ceil(s) };
        let hi = if (len as isize) <= offset { 0 } else { (len as isize - offset) as usize }.div_ceil(s);
        (lo.min(out), hi.min(out).max(lo.min(out)))
    }
}

/// Products of this many terms at most are summed in one run. gemm's microkernel adds a whole
/// product in one register, so an f32 sum over a long reduction (`C*KH*KW` = 2304 in
/// ResNet's 3x3 layers of 256 channels, `O` = 512 in an input gradient) drifts further from
/// f64 the longer it is. Summing blocks and adding the block sums (gemm's `dst +=`) keeps the
/// error of any convolution near that of a short product, as PyTorch's oneDNN convolution
/// does (2e-7 relative at any channel count, where one 2304-term run gave 3.4e-7). Each block
/// costs one more pass over the output tile, in cache. The weight gradient needs no blocks:
/// its reduction is cut by tiles (a band, or [`MIN_TILE_PIXELS`] pixels of side-by-side
/// samples) already, and blocks of 128 pixels cost it 3-7% over a ResNet-50 step's shapes
/// (most at the 32x32 planes, where its output is small and each block a GEMM call of its
/// own).
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

/// Scratch space of one unit of work: the column matrix and a `[channels, pixels]` matrix of
/// side-by-side samples (outputs before they are scattered, output gradients after they are
/// gathered).
struct Scratch<'a, T> {
    col: &'a mut [T],
    side: &'a mut [T],
}

/// Element types with a scratch buffer per thread.
pub(crate) trait ConvElement: GemmElement + std::ops::AddAssign {
    fn scratch() -> &'static LocalKey<RefCell<Vec<Self>>>;
}

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

impl ConvElement for f32 {
    fn scratch() -> &'static LocalKey<RefCell<Vec<f32>>> {
        &SCRATCH_F32
    }
}

impl ConvElement for f64 {
    fn scratch() -> &'static LocalKey<RefCell<Vec<f64>>> {
        &SCRATCH_F64
    }
}

/// `f` with `col_len + side_len` elements of this thread's scratch buffer, which lives as long
/// as the thread: a convolution step would otherwise allocate and zero megabytes of column
/// matrices per call (every element is written before it is read, so old contents do no
/// harm). A nested call on the same thread (rayon may run another task while one waits) gets
/// a buffer of its own.
fn with_scratch<T: ConvElement, R>(
    (col_len, side_len): (usize, usize),
    f: impl FnOnce(Scratch<'_, T>) -> R,
) -> R {
    let split = |buf: &mut [T]| {
        let (col, side) = buf.split_at_mut(col_len);
        f(Scratch { col, side })
    };
    T::scratch().with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < col_len + side_len {
                buf.resize(col_len + side_len, T::zero());
            }
            split(&mut buf[..col_len + side_len])
        }
        Err(_) => split(&mut vec![T::zero(); col_len + side_len]),
    })
}

/// Runs `f(first_sample, samples, out_chunk, scratch, gemm_threads)` for every unit of `t`,
/// `out_chunk` being the units' part of `out` (`per_sample` elements a sample): in parallel
/// over units when there are enough of them, else one after another with GEMM using the
/// threads.
fn per_unit<T: ConvElement>(
    out: &mut [T],
    per_sample: usize,
    t: Tiling,
    lens: (usize, usize),
    f: impl Fn(usize, usize, &mut [T], &mut Scratch<'_, T>, usize) + Sync,
) {
    if per_sample == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    let chunk = per_sample * t.samples;
    let units = out.len().div_ceil(chunk);
    let run = |(i, o): (usize, &mut [T]), s: &mut Scratch<'_, T>, threads| {
        f(i * t.samples, o.len() / per_sample, o, s, threads)
    };
    if threads > 1 && units >= threads {
        out.par_chunks_mut(chunk).enumerate().for_each(|u| with_scratch(lens, |mut s| run(u, &mut s, 1)));
    } else {
        with_scratch(lens, |mut s| out.chunks_mut(chunk).enumerate().for_each(|u| run(u, &mut s, threads)));
    }
}

/// `y = conv2d(x, w) + bias`; `x [N, C, H, W]` and `w [O, C/g, KH, KW]` contiguous.
pub(crate) fn forward<T: ConvElement>(x: &[T], w: &[T], bias: Option<&[T]>, g: &Geometry) -> Vec<T> {
    let (l, patch, og) = (g.out_plane(), g.patch(), g.o / g.groups);
    let t = g.tiling::<T>(rayon::current_num_threads());
    let mut y = vec![T::zero(); g.n * g.o * l];
    let side_len = if t.samples > 1 { g.o * t.samples * l } else { 0 };
    let x_sample = |n: usize| &x[n * g.c * g.in_plane()..][..g.c * g.in_plane()];
    per_unit(&mut y, g.o * l, t, (g.col_len(t), side_len), |n0, ns, y_u, s, threads| {
        for (r0, r1) in g.bands(t) {
            let band = (r1 - r0) * g.ow;
            let cols = ns * band;
            // One sample writes its output rows in place; side-by-side samples into `side`.
            let (dst, dst_rs, dst_at) =
                if ns == 1 { (&mut *y_u, l, r0 * g.ow) } else { (&mut s.side[..], cols, 0) };
            if let Some(b) = bias {
                for (o, &bo) in b.iter().enumerate() {
                    dst[o * dst_rs + dst_at..][..cols].fill(bo);
                }
            }
            let direct = ns == 1 && g.is_pointwise();
            if g.is_pointwise() && !direct {
                gather(x, g.c, l, n0..n0 + ns, s.col);
            } else if !direct {
                for i in 0..ns {
                    im2col(x_sample(n0 + i), g, (r0, r1), s.col, (cols, i * band));
                }
            }
            for gi in 0..g.groups {
                let lhs = Mat::new(w, gi * og * patch, patch, 1);
                // Pointwise, one sample: the group's input channels at this band are the matrix.
                let rhs = if direct {
                    Mat::new(x_sample(n0), gi * patch * l + r0 * g.ow, l, 1)
                } else {
                    Mat::new(s.col, gi * patch * cols, cols, 1)
                };
                let dst = &mut dst[gi * og * dst_rs + dst_at..];
                gemm_k_blocked((og, cols, patch), dst, dst_rs, lhs, rhs, bias.is_some(), threads);
            }
            if ns > 1 {
                scatter(s.side, g.o, l, ns, y_u);
            }
        }
    });
    y
}

/// The gradient of [`forward`] with respect to its input: `grad_y [N, O, OH, OW]` contiguous.
pub(crate) fn backward_input<T: ConvElement>(grad_y: &[T], w: &[T], g: &Geometry) -> Vec<T> {
    let (l, patch, og, cg) = (g.out_plane(), g.patch(), g.o / g.groups, g.c / g.groups);
    let t = g.tiling::<T>(rayon::current_num_threads());
    let mut grad_x = vec![T::zero(); g.n * g.c * g.in_plane()];
    // Side by side: the gathered output gradient, then (pointwise) the input gradient's tile.
    let side_len = if t.samples > 1 { (g.o + g.c) * t.samples * l } else { 0 };
    per_unit(&mut grad_x, g.c * g.in_plane(), t, (g.col_len(t), side_len), |n0, ns, gx_u, s, threads| {
        for (r0, r1) in g.bands(t) {
            let band = (r1 - r0) * g.ow;
            let cols = ns * band;
            let (gy_side, gx_side) = s.side.split_at_mut(if ns > 1 { g.o * cols } else { 0 });
            let (gy, gy_rs, gy_at) = if ns == 1 {
                (&grad_y[n0 * g.o * l..][..g.o * l], l, r0 * g.ow)
            } else {
                gather(grad_y, g.o, l, n0..n0 + ns, gy_side);
                (&gy_side[..], cols, 0)
            };
            for gi in 0..g.groups {
                // weight_g^T [patch, O/g] @ grad_y_g [O/g, cols]
                let lhs = Mat::new(w, gi * og * patch, patch, 1).t();
                let rhs = Mat::new(gy, gi * og * gy_rs + gy_at, gy_rs, 1);
                let (dst, rs) = match (g.is_pointwise(), ns) {
                    (true, 1) => (&mut gx_u[gi * cg * l + r0 * g.ow..], l),
                    (true, _) => (&mut gx_side[gi * cg * cols..], cols),
                    (false, _) => (&mut s.col[gi * patch * cols..], cols),
                };
                gemm_k_blocked((patch, cols, og), dst, rs, lhs, rhs, false, threads);
            }
            if g.is_pointwise() && ns > 1 {
                scatter(gx_side, g.c, l, ns, gx_u);
            } else if !g.is_pointwise() {
                let per = g.c * g.in_plane();
                for (i, gx_n) in gx_u.chunks_exact_mut(per).enumerate() {
                    col2im_add(s.col, (cols, i * band), g, (r0, r1), gx_n);
                }
            }
        }
    });
    grad_x
}

/// The gradient of [`forward`] with respect to its weight: `[O, C/g, KH, KW]`, summed over the batch.
pub(crate) fn backward_weight<T: ConvElement>(grad_y: &[T], x: &[T], g: &Geometry) -> Vec<T> {
    let (l, patch, og) = (g.out_plane(), g.patch(), g.o / g.groups);
    let threads = rayon::current_num_threads();
    let t = g.tiling::<T>(threads);
    let side_len = if t.samples > 1 { g.o * t.samples * l } else { 0 };
    let units = g.n.div_ceil(t.samples);
    let x_sample = |n: usize| &x[n * g.c * g.in_plane()..][..g.c * g.in_plane()];
    // grad_w_g [O/g, patch] += grad_y_g [O/g, cols] @ col_g^T [cols, patch], over the units in `range`.
    let accumulate = |range: std::ops::Range<usize>, threads: usize| {
        let mut gw = vec![T::zero(); g.o * patch];
        with_scratch((g.col_len(t), side_len), |s| {
            for u in range.clone() {
                let (n0, ns) = (u * t.samples, t.samples.min(g.n - u * t.samples));
                for (r0, r1) in g.bands(t) {
                    let band = (r1 - r0) * g.ow;
                    let cols = ns * band;
                    let (gy, gy_rs, gy_at) = if ns == 1 {
                        (&grad_y[n0 * g.o * l..][..g.o * l], l, r0 * g.ow)
                    } else {
                        gather(grad_y, g.o, l, n0..n0 + ns, s.side);
                        (&s.side[..], cols, 0)
                    };
                    let direct = ns == 1 && g.is_pointwise();
                    if g.is_pointwise() && !direct {
                        gather(x, g.c, l, n0..n0 + ns, s.col);
                    } else if !direct {
                        for i in 0..ns {
                            im2col(x_sample(n0 + i), g, (r0, r1), s.col, (cols, i * band));
                        }
                    }
                    for gi in 0..g.groups {
                        let lhs = Mat::new(gy, gi * og * gy_rs + gy_at, gy_rs, 1);
                        let rhs = if direct {
                            Mat::new(x_sample(n0), gi * patch * l + r0 * g.ow, l, 1).t()
                        } else {
                            Mat::new(s.col, gi * patch * cols, cols, 1).t()
                        };
                        let dst = &mut gw[gi * og * patch..];
                        gemm_into((og, patch, cols), dst, patch, lhs, rhs, true, threads);
                    }
                }
            }
        });
        gw
    };
    if threads > 1 && units >= threads {
        // One partial sum per thread over a contiguous run of units, then their sum.
        (0..threads)
            .into_par_iter()
            .map(|i| accumulate(i * units / threads..(i + 1) * units / threads, 1))
            .reduce_with(|mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    *x += y;
                }
                a
            })
            .expect("at least one thread")
    } else {
        accumulate(0..units, threads)
    }
}
