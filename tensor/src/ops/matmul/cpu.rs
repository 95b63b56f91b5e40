//! CPU matrix products on top of the `gemm` crate, which takes any row and column strides for
//! its three operands: transposed, narrowed and broadcast (stride 0) matrices go in as they are,
//! without a copy. gemm packs blocks of the operands into its own buffers anyway, so a strided
//! operand costs no more than a contiguous one except for cache behaviour inside that packing.

use gemm::Parallelism;
use half::f16;
use rayon::prelude::*;

/// Element types the `gemm` crate multiplies natively. bf16 is not one of them: callers widen
/// it to f32.
pub(crate) trait GemmElement: Copy + Send + Sync + Default + 'static {
    fn zero() -> Self;
    fn one() -> Self;
    /// `a + b` where partial products may be summed in this type ([`split_k_product`]); None
    /// for f16, whose gemm accumulates in f32 and rounds once, which a sum of rounded f16
    /// partials would not match.
    const ADD: Option<fn(Self, Self) -> Self>;
}

impl GemmElement for f32 {
    fn zero() -> f32 {
        0.0
    }
    fn one() -> f32 {
        1.0
    }
    const ADD: Option<fn(f32, f32) -> f32> = Some(|a, b| a + b);
}
impl GemmElement for f64 {
    fn zero() -> f64 {
        0.0
    }
    fn one() -> f64 {
        1.0
    }
    const ADD: Option<fn(f64, f64) -> f64> = Some(|a, b| a + b);
}
impl GemmElement for f16 {
    fn zero() -> f16 {
        f16::ZERO
    }
    fn one() -> f16 {
        f16::ONE
    }
    const ADD: Option<fn(f16, f16) -> f16> = None;
}

/// A strided matrix inside a slice: element (i, j) is `data[offset + i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    pub fn new(data: &'a [T], offset: usize, rs: usize, cs: usize) -> Self {
        Mat { data, offset, rs, cs }
    }

    /// The matrix transposed (a view; strides swap).
    pub fn t(self) -> Self {
        Mat { rs: self.cs, cs: self.rs, ..self }
    }
}

/// Largest index touched by a `rows x cols` matrix, plus one (0 when empty).
fn extent(offset: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        offset + (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `dst[m x n] (+)= lhs[m x k] @ rhs[k x n]`, `dst` row-major with row stride `dst_rs` starting at
/// `dst[0]`. With `accumulate` the product is added to what `dst` holds, else it overwrites it.
/// `threads > 1` lets gemm split this one product over rayon threads (it stays single-threaded
/// when the product is small).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into<T: GemmElement>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    dst_rs: usize,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    accumulate: bool,
    threads: usize,
) {
    assert!(extent(0, m, n, dst_rs, 1) <= dst.len(), "gemm: destination too small");
    assert!(k == 0 || extent(lhs.offset, m, k, lhs.rs, lhs.cs) <= lhs.data.len(), "gemm: lhs out of bounds");
    assert!(k == 0 || extent(rhs.offset, k, n, rhs.rs, rhs.cs) <= rhs.data.len(), "gemm: rhs out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for row in dst.chunks_mut(dst_rs.max(1)).take(m) {
                row[..n].fill(T::zero());
            }
        }
        return;
    }
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: the asserts above keep every index gemm touches inside the three slices, `dst`
    // is borrowed mutably so nothing else aliases it, and T is one of gemm's native types.
    // gemm computes dst := alpha * dst + beta * lhs @ rhs (its alpha/beta are BLAS's swapped).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.cs as isize,
            rhs.rs as isize,
            if accumulate { T::one() } else { T::zero() },
            T::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The layout of a batched product: `batch` products of `lhs[m x k] @ rhs[k x n]`, the i-th
/// reading its operands at the given storage offsets (broadcast batch dims repeat offsets).
pub(crate) struct Batched {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lhs_offsets: Vec<usize>,
    pub lhs_strides: (usize, usize),
    pub rhs_offsets: Vec<usize>,
    pub rhs_strides: (usize, usize),
}

/// Below this many multiply-adds per product, one gemm call gains nothing from threads;
/// batches of such products are split across threads one product per task instead.
const SMALL_PRODUCT: usize = 64 * 64 * 64;

/// Runs the batched product into a new contiguous `[batch, m, n]` vector.
pub(crate) fn batched_matmul<T: GemmElement>(lhs: &[T], rhs: &[T], b: &Batched) -> Vec<T> {
    let (m, n, k) = (b.m, b.n, b.k);
    let batch = b.lhs_offsets.len();
    // Zeroed lazily by the OS (gemm overwrites it without reading), in huge pages when large:
    // a language model's logits are hundreds of MB, written once per step.
    let mut out = vec![T::default(); batch * m * n];
    crate::huge_pages::advise(&out);
    if out.is_empty() {
        return out;
    }
    let threads = rayon::current_num_threads();
    let product = |i: usize, dst: &mut [T], threads: usize| {
        let l = Mat::new(lhs, b.lhs_offsets[i], b.lhs_strides.0, b.lhs_strides.1);
        let r = Mat::new(rhs, b.rhs_offsets[i], b.rhs_strides.0, b.rhs_strides.1);
        gemm_into((m, n, k), dst, n, l, r, false, threads);
    };
    // Many products: one thread each, no synchronisation inside gemm. Few large products:
    // one after another, each split by gemm over all threads.
    let per_batch = batch >= 2 * threads || (batch > 1 && m * n * k <= SMALL_PRODUCT);
    if threads > 1 && per_batch {
        out.par_chunks_mut(m * n).enumerate().for_each(|(i, dst)| product(i, dst, 1));
    } else if let (true, Some(add)) = (threads > 1 && batch == 1 && splits_k(m, n, k, threads), T::ADD) {
        let l = Mat::new(lhs, b.lhs_offsets[0], b.lhs_strides.0, b.lhs_strides.1);
        let r = Mat::new(rhs, b.rhs_offsets[0], b.rhs_strides.0, b.rhs_strides.1);
        split_k_product((m, n, k), &mut out, l, r, threads, add);
    } else {
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            product(i, dst, threads);
        }
    }
    out
}

/// Whether a product's inner dim is long enough, next to its output, to be split over threads
/// ([`split_k_product`]) rather than handed whole to gemm.
pub(super) fn splits_k(m: usize, n: usize, k: usize, threads: usize) -> bool {
    k >= 8 * m.max(n) && m * n * k >= 4 * threads * SMALL_PRODUCT
}

/// `dst[m x n] = lhs @ rhs` for a product whose inner dim dwarfs its output, such as a
/// language model head's input gradient (`g [1024, 50257] @ w [50257, 256]`): gemm spreads a
/// product over blocks of its output, and for few output blocks its threads wait on each other
/// at every block of k. Here each thread multiplies its own range of k into its own `m x n`
/// partial (the first into `dst`), and the partials are then added into `dst`. The sum's order
/// depends on the thread count, as a blocked gemm's does on its block sizes.
fn split_k_product<T: GemmElement>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    parts: usize,
    add: fn(T, T) -> T,
) {
    let per = k.div_ceil(parts);
    let ranges: Vec<(usize, usize)> = (0..k).step_by(per).map(|k0| (k0, per.min(k - k0))).collect();
    let mut partials: Vec<Vec<T>> = (1..ranges.len()).map(|_| vec![T::zero(); m * n]).collect();
    let dsts: Vec<&mut [T]> =
        std::iter::once(&mut dst[..m * n]).chain(partials.iter_mut().map(|p| &mut p[..])).collect();
    dsts.into_par_iter().zip(ranges).for_each(|(d, (k0, kc))| {
        let l = Mat { offset: lhs.offset + k0 * lhs.cs, ..lhs };
        let r = Mat { offset: rhs.offset + k0 * rhs.rs, ..rhs };
        gemm_into((m, n, kc), d, n, l, r, false, 1);
    });
    for p in &partials {
        dst[..m * n].par_chunks_mut(n.max(1)).zip(p.par_chunks(n.max(1))).for_each(|(d, p)| {
            for (d, &x) in d.iter_mut().zip(p) {
                *d = add(*d, x);
            }
        });
    }
}
