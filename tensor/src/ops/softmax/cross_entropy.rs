//! Cross-entropy over rows of logits, fused: the forward reads each row once and keeps only
//! its log-sum-exp, the backward reads the row again and writes `(softmax - q) * w` straight
//! into the logits' dtype. Composed from log_softmax, gather and scatter, the same loss wrote
//! and read back a `[rows, classes]` tensor in f32 three times over; at a language model's
//! vocabulary that was most of the loss's time and memory.
//!
//! With label smoothing `s` the target distribution is `q = (1 - s) one_hot(t) + s / C`, so
//! `loss = lse - (1 - s) x[t] - s / C * sum(x)`. A row whose target is `ignore_index` has loss
//! 0 and gradient 0.

use super::cuda;
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::storage::{CpuStorage, Storage};
use crate::vmath::vectorized;
use crate::{DType, Tensor};
use num_traits::{Float, Zero};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Logits whose row stride is at most their row rounded up to a multiple of this are taken to
/// be rows padded for alignment, whose layout the gradient keeps.
const PADDED_ROW_TILE: usize = 128;

/// The compute dtype: f64 for f64 logits, else f32.
fn compute_dtype(logits: DType) -> DType {
    if logits == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl Tensor {
    /// Per-row cross-entropy of `self` (logits `[rows, classes]`, float) against `target`
    /// (`[rows]`, int64 class indices): `(loss, lse)`, both `[rows]` in f32 (f64 for f64
    /// logits), `lse` the row's log-sum-exp that [`Tensor::cross_entropy_rows_backward`] takes.
    /// Rows whose target is `ignore_index` get loss 0. A target outside `0..classes` panics on
    /// the CPU; on CUDA its row's loss is NaN (checking would wait for the device).
    pub fn cross_entropy_rows(
        &self,
        target: &Tensor,
        ignore_index: i64,
        label_smoothing: f64,
    ) -> (Tensor, Tensor) {
        let (rows, classes) = self.check_rows("cross_entropy_rows", target);
        let ((x, ld), t) = (self.unit_rows(), target.contiguous());
        let cdt = compute_dtype(self.dtype());
        let (loss, lse) = match (&*x.storage(), &*t.storage()) {
            (Storage::Cpu(xs), Storage::Cpu(CpuStorage::I64(ts))) => {
                let ts = &ts[t.layout().offset()..][..rows];
                let (loss, lse) = with_float_storage!(xs, "cross_entropy_rows", v, T =>
                    forward_cpu::<T>(&v[x.layout().offset()..], ts, (classes, ld), ignore_index, label_smoothing));
                (Storage::Cpu(loss), Storage::Cpu(lse))
            }
            (Storage::Cuda(xs), Storage::Cuda(ts)) => {
                let (loss, lse) = cuda::cross_entropy_forward(
                    (xs, x.layout().offset()),
                    (ts, t.layout().offset()),
                    (rows, classes, ld),
                    ignore_index,
                    label_smoothing,
                    cdt,
                );
                (Storage::Cuda(loss), Storage::Cuda(lse))
            }
            _ => unreachable!("cross_entropy_rows: checked to be on one device with int64 targets"),
        };
        (Tensor::from_storage(loss, [rows]), Tensor::from_storage(lse, [rows]))
    }

    /// The gradient of [`Tensor::cross_entropy_rows`] with respect to the logits `self`:
    /// `(softmax(x) - q) * weight[row]`, 0 on ignored rows, in the logits' dtype. `lse` is the
    /// forward's log-sum-exp and `weight` the per-row factor (`[rows]`, the compute dtype):
    /// the loss's own gradient, times `1 / count` for a mean. On CUDA, logits whose row stride
    /// is their row rounded up to a multiple of at most 128 (a language model head's over a
    /// padded vocabulary) get a gradient with their row stride and zeros in the pad columns,
    /// so the head's backward products read whole aligned rows; every other result is
    /// contiguous.
    pub fn cross_entropy_rows_backward(
        &self,
        target: &Tensor,
        lse: &Tensor,
        weight: &Tensor,
        ignore_index: i64,
        label_smoothing: f64,
    ) -> Tensor {
        let name = "cross_entropy_rows_backward";
        self.rows_backward(name, target, (lse, weight), ignore_index, label_smoothing, false)
    }

    /// [`Tensor::cross_entropy_rows_backward`] without label smoothing for `self [rows, n]`,
    /// the logits of a block of `n` consecutive classes out of more: `lse` is the log-sum-exp
    /// over all the classes (from the forward), and `target` counts from the block's first
    /// class, so a target outside `0..n` is a class of another block and subtracts nothing
    /// here. A language model's loss computed block by block of its vocabulary (the chunked
    /// loss of `oxtrain-models`) never holds whole rows of logits.
    pub fn cross_entropy_block_backward(
        &self,
        target: &Tensor,
        lse: &Tensor,
        weight: &Tensor,
        ignore_index: i64,
    ) -> Tensor {
        let name = "cross_entropy_block_backward";
        self.rows_backward(name, target, (lse, weight), ignore_index, 0.0, true)
    }

    /// Both backwards; `in_block`: targets out of range are other blocks' classes.
    fn rows_backward(
        &self,
        name: &str,
        target: &Tensor,
        (lse, weight): (&Tensor, &Tensor),
        ignore_index: i64,
        label_smoothing: f64,
        in_block: bool,
    ) -> Tensor {
        let (rows, classes) = self.check_rows(name, target);
        let cdt = compute_dtype(self.dtype());
        for (what, v) in [("lse", lse), ("weight", weight)] {
            assert!(
                v.dims() == [rows] && v.dtype() == cdt && v.device() == self.device(),
                "{name}: {what} must be [{rows}] {cdt} on {:?}, got {:?} {} on {:?}",
                self.device(),
                v.dims(),
                v.dtype(),
                v.device()
            );
        }
        let ((x, ld), t, l, w) =
            (self.unit_rows(), target.contiguous(), lse.contiguous(), weight.contiguous());
        let storage = match (&*x.storage(), &*t.storage(), &*l.storage(), &*w.storage()) {
            (Storage::Cpu(xs), Storage::Cpu(CpuStorage::I64(ts)), Storage::Cpu(ls), Storage::Cpu(ws)) => {
                let ts = &ts[t.layout().offset()..][..rows];
                let grad = with_float_storage!(xs, name, v, T => {
                    let ls = &ls.as_slice::<<T as ComputeAs>::C>()[l.layout().offset()..][..rows];
                    let ws = &ws.as_slice::<<T as ComputeAs>::C>()[w.layout().offset()..][..rows];
                    let v = &v[x.layout().offset()..];
                    T::into_storage(backward_cpu::<T>(v, ts, (ls, ws), (classes, ld), (ignore_index, in_block), label_smoothing))
                });
                Storage::Cpu(grad)
            }
            (Storage::Cuda(xs), Storage::Cuda(ts), Storage::Cuda(ls), Storage::Cuda(ws)) => {
                let out_ld = if ld > classes && ld <= classes.next_multiple_of(PADDED_ROW_TILE) {
                    ld
                } else {
                    classes
                };
                let grad = cuda::cross_entropy_backward(
                    (xs, x.layout().offset(), ld),
                    (ts, t.layout().offset()),
                    (ls, l.layout().offset()),
                    (ws, w.layout().offset()),
                    (rows, classes, out_ld),
                    ignore_index,
                    label_smoothing,
                );
                return Tensor::from_storage(Storage::Cuda(grad), [rows, out_ld]).narrow(1, 0, classes);
            }
            _ => unreachable!("{name}: checked to be on one device"),
        };
        Tensor::from_storage(storage, [rows, classes])
    }

    /// `self` (2-d) as rows of unit-stride elements and the row stride: itself when it is
    /// already so (a narrowed view, such as a padded head's logits), else a contiguous copy.
    fn unit_rows(&self) -> (Tensor, usize) {
        let (classes, rs, cs) = (self.dims()[1], self.layout().strides()[0], self.layout().strides()[1]);
        if (cs == 1 || classes <= 1) && rs >= classes {
            (self.clone(), rs)
        } else {
            (self.contiguous(), classes)
        }
    }

    /// `(rows, classes)` after checking `self` is float `[rows, classes]` and `target` int64
    /// `[rows]` on the same device.
    fn check_rows(&self, name: &str, target: &Tensor) -> (usize, usize) {
        assert!(
            self.rank() == 2 && self.dtype().is_float(),
            "{name}: logits must be a float tensor [rows, classes], got {} {:?}",
            self.dtype(),
            self.dims()
        );
        let (rows, classes) = (self.dims()[0], self.dims()[1]);
        assert!(
            target.dtype() == DType::I64 && target.dims() == [rows],
            "{name}: logits {:?} need int64 targets of shape [{rows}], got {} {:?}",
            self.dims(),
            target.dtype(),
            target.dims()
        );
        self.same_device(target, name);
        (rows, classes)
    }
}

/// Rows per rayon task: enough work per task at small vocabularies.
fn rows_per_task(classes: usize) -> usize {
    (crate::strided::PAR_THRESHOLD / classes.max(1)).max(1)
}

fn check_target(t: i64, row: usize, classes: usize) -> usize {
    assert!(
        (0..classes as i64).contains(&t),
        "cross_entropy: target {t} of row {row} is out of range for {classes} classes \
         (targets are class indices in 0..{classes}, or ignore_index)"
    );
    t as usize
}

/// Elements per block of a row: its max is found, then (from L1) the sums of `exp(x - max)`
/// and of `x` in f32 lanes; the block totals add up in f64.
const BLOCK: usize = 1024;
/// Independent accumulators per sum: the compiler keeps them in vector registers.
const LANES: usize = 16;

fn f64_of<C: Float>(c: C) -> f64 {
    c.to_f64().unwrap_or(f64::NAN)
}

/// Max of a block, NaN-blind (a NaN still reaches the sums and makes them NaN).
#[inline(always)]
fn block_max<T: ComputeAs>(x: &[T]) -> T::C {
    let larger = |m: T::C, v: T::C| if v > m { v } else { m };
    let mut acc = [T::C::neg_infinity(); LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for (a, &v) in acc.iter_mut().zip(ch) {
            *a = larger(*a, v.up());
        }
    }
    let m = acc.into_iter().fold(T::C::neg_infinity(), larger);
    rest.iter().fold(m, |m, &v| larger(m, v.up()))
}

/// `(sum(exp(x - m)), sum(x))` of a block, in f64 from lanes of the compute type.
#[inline(always)]
fn block_sums<T: ComputeAs>(x: &[T], m: T::C) -> (f64, f64) {
    let zero = <T::C as Zero>::zero();
    let (mut ae, mut ax) = ([zero; LANES], [zero; LANES]);
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for j in 0..LANES {
            let v = ch[j].up();
            ae[j] = ae[j] + (v - m).exp_v();
            ax[j] = ax[j] + v;
        }
    }
    for &v in rest {
        let v = v.up();
        ae[0] = ae[0] + (v - m).exp_v();
        ax[0] = ax[0] + v;
    }
    (ae.iter().map(|&v| f64_of(v)).sum(), ax.iter().map(|&v| f64_of(v)).sum())
}

/// `(max, sum(exp(x - max)), sum(x))` of a row in one read from memory: block by block, the
/// running sum is rescaled once whenever a block raises the max.
#[inline(always)]
fn row_stats<T: ComputeAs>(row: &[T]) -> (f64, f64, f64) {
    let (mut m, mut se, mut sx) = (T::C::neg_infinity(), 0.0f64, 0.0f64);
    for block in row.chunks(BLOCK) {
        let bm = block_max(block);
        if bm > m {
            se *= (f64_of(m) - f64_of(bm)).exp();
            m = bm;
        }
        let (e, s) = block_sums(block, m);
        se += e;
        sx += s;
    }
    (f64_of(m), se, sx)
}

fn forward_cpu<T: ComputeAs>(
    x: &[T],
    target: &[i64],
    (classes, ld): (usize, usize),
    ignore: i64,
    smoothing: f64,
) -> (CpuStorage, CpuStorage)
where
    T::C: Element,
{
    let rows = target.len();
    let mut loss = vec![<T::C as Zero>::zero(); rows];
    let mut lse = vec![<T::C as Zero>::zero(); rows];
    let per = rows_per_task(classes);
    loss.par_chunks_mut(per).zip(lse.par_chunks_mut(per)).enumerate().for_each(|(chunk, (lo, ls))| {
        for (i, (lo, ls)) in lo.iter_mut().zip(ls.iter_mut()).enumerate() {
            let r = chunk * per + i;
            let row = &x[r * ld..][..classes];
            let (m, se, sx) = vectorized(
                #[inline(always)]
                || row_stats(row),
            );
            let log_sum = se.ln();
            *ls = T::C::of(m + log_sum);
            if target[r] != ignore {
                let t = check_target(target[r], r, classes);
                // lse - (1 - s) x_t - (s / C) sum(x), from the max so nothing large cancels.
                let mut l = log_sum - (1.0 - smoothing) * (row[t].to_f64() - m);
                if smoothing > 0.0 {
                    l -= smoothing * (sx / classes as f64 - m);
                }
                *lo = T::C::of(l);
            }
        }
    });
    (<T::C as Element>::into_storage(loss), <T::C as Element>::into_storage(lse))
}

fn backward_cpu<T: ComputeAs>(
    x: &[T],
    target: &[i64],
    (lse, weight): (&[T::C], &[T::C]),
    (classes, ld): (usize, usize),
    (ignore, in_block): (i64, bool),
    smoothing: f64,
) -> Vec<T> {
    let rows = target.len();
    let mut grad: Vec<T> = Vec::with_capacity(rows * classes);
    crate::huge_pages::advise(&grad);
    let (keep, spread) = (T::C::of(1.0 - smoothing), T::C::of(smoothing / classes as f64));
    let per = rows_per_task(classes);
    let fill = |(chunk, g): (usize, &mut [MaybeUninit<T>])| {
        for (i, g) in g.chunks_mut(classes).enumerate() {
            let r = chunk * per + i;
            if target[r] == ignore {
                // Exactly zero, whatever the row's logits hold (inf or NaN included).
                g.fill(MaybeUninit::new(T::zero()));
                continue;
            }
            let t = if in_block {
                usize::try_from(target[r]).ok().filter(|&t| t < classes)
            } else {
                Some(check_target(target[r], r, classes))
            };
            let (l, w) = (lse[r], weight[r]);
            let row = &x[r * ld..][..classes];
            let sw = spread * w;
            vectorized(
                #[inline(always)]
                || {
                    for (g, &v) in g.iter_mut().zip(row) {
                        g.write(T::down((v.up() - l).exp_v() * w - sw));
                    }
                },
            );
            if let Some(t) = t {
                g[t].write(T::down(((row[t].up() - l).exp_v() - spread - keep) * w));
            }
        }
    };
    if rows * classes > 0 {
        grad.spare_capacity_mut()[..rows * classes].par_chunks_mut(per * classes).enumerate().for_each(fill);
    }
    // SAFETY: the chunks cover all `rows * classes` elements and `fill` writes every one of
    // them (a whole row of zeros, or each element of the row); T is Copy.
    unsafe { grad.set_len(rows * classes) };
    grad
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    /// (loss, dlogits) of one row in f64, straight from the definition: `-sum(q * log_softmax(x))`
    /// and `(softmax(x) - q) * w`.
    fn naive_row(x: &[f64], t: usize, s: f64, w: f64) -> (f64, Vec<f64>) {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        let c = x.len() as f64;
        let q = |j: usize| if j == t { 1.0 - s + s / c } else { s / c };
        let loss = -(0..x.len()).map(|j| q(j) * (x[j] - lse)).sum::<f64>();
        (loss, (0..x.len()).map(|j| ((x[j] - lse).exp() - q(j)) * w).collect())
    }

    crate::device_test! {
        fn cross_entropy_rows_match_the_definition_in_f64(dev: Device) {
            // Class counts around a warp, odd ones (rows start off every 16-byte boundary) and
            // a language model's vocabulary; an ignored row; with and without smoothing.
            for (rows, classes) in [(5usize, 3usize), (7, 37), (4, 1000), (3, 50257)] {
                for dtype in [DType::F64, DType::F32, DType::BF16] {
                    for s in [0.0, 0.1] {
                        // Rows 3 apart from a wider block when s > 0: logits read in place
                        // through their row stride, from an unaligned start.
                        let pad = if s > 0.0 { 3 } else { 0 };
                        let xs: Vec<f64> = (0..rows * (classes + pad))
                            .map(|i| ((i * 7919) % 997) as f64 / 60.0 - 8.0)
                            .collect();
                        let wide = Tensor::from_vec(xs, [rows, classes + pad], dev).unwrap().to_dtype(dtype);
                        let x = wide.narrow(1, pad, classes);
                        // What the kernel reads: the logits rounded to their dtype.
                        let xr = x.to_dtype(DType::F64).to_vec::<f64>();
                        let ts: Vec<i64> = (0..rows).map(|r| if r == 1 { -100 } else { ((r * 31) % classes) as i64 }).collect();
                        let t = Tensor::from_vec(ts.clone(), [rows], dev).unwrap();
                        let (loss, lse) = x.cross_entropy_rows(&t, -100, s);
                        let cdt = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
                        assert_eq!((loss.dtype(), lse.dtype()), (cdt, cdt));
                        let ws: Vec<f64> = (0..rows).map(|r| 0.5 + r as f64).collect();
                        let w = Tensor::from_vec(ws.clone(), [rows], dev).unwrap().to_dtype(cdt);
                        let grad = x.cross_entropy_rows_backward(&t, &lse, &w, -100, s);
                        assert_eq!((grad.dtype(), grad.dims()), (dtype, &[rows, classes][..]));
                        let (loss, grad) = (loss.to_dtype(DType::F64).to_vec::<f64>(), grad.to_dtype(DType::F64).to_vec::<f64>());
                        // (loss relative, gradient absolute per unit of weight, gradient
                        // relative): f32 arithmetic, then the gradient's rounding to its dtype.
                        let (tol_l, tol_g, rel_g) = match dtype {
                            DType::F64 => (1e-12, 1e-14, 0.0),
                            DType::F32 => (2e-5, 1e-6, 1e-5),
                            _ => (2e-5, 1e-6, 4e-3),
                        };
                        for r in 0..rows {
                            let row = &xr[r * classes..][..classes];
                            let what = format!("{dtype} {rows}x{classes} s={s} row {r}");
                            if ts[r] == -100 {
                                assert_eq!(loss[r], 0.0, "{what}: ignored row's loss");
                                assert!(grad[r * classes..][..classes].iter().all(|&g| g == 0.0), "{what}: ignored row's gradient");
                                continue;
                            }
                            let (l, g) = naive_row(row, ts[r] as usize, s, ws[r]);
                            assert!((loss[r] - l).abs() <= tol_l * l.abs().max(1.0), "{what}: loss {} vs {l}", loss[r]);
                            for (j, (a, b)) in grad[r * classes..][..classes].iter().zip(&g).enumerate() {
                                assert!((a - b).abs() <= tol_g * ws[r] + rel_g * b.abs(),
                                    "{what}: gradient at {j}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
    }

    crate::device_test! {
        fn block_backward_pieces_make_the_rows_backward(dev: Device) {
            // Blocks of columns with the targets counted from each block's first class give,
            // side by side, the whole rows' gradient: the same formula, element for element.
            for (rows, classes, block) in [(5usize, 37usize, 8usize), (3, 50257, 4096)] {
                for dtype in [DType::F64, DType::F32, DType::BF16] {
                    let xs: Vec<f64> = (0..rows * classes).map(|i| ((i * 7919) % 997) as f64 / 60.0 - 8.0).collect();
                    let x = Tensor::from_vec(xs, [rows, classes], dev).unwrap().to_dtype(dtype);
                    let ts: Vec<i64> = (0..rows).map(|r| if r == 1 { -100 } else { ((r * 31) % classes) as i64 }).collect();
                    let t = Tensor::from_vec(ts, [rows], dev).unwrap();
                    let (_, lse) = x.cross_entropy_rows(&t, -100, 0.0);
                    let cdt = lse.dtype();
                    let w = Tensor::from_vec((0..rows).map(|r| 0.5 + r as f64).collect::<Vec<_>>(), [rows], dev)
                        .unwrap()
                        .to_dtype(cdt);
                    let whole = x.cross_entropy_rows_backward(&t, &lse, &w, -100, 0.0);
                    let pieces: Vec<Tensor> = (0..classes)
                        .step_by(block)
                        .map(|start| {
                            let len = block.min(classes - start);
                            let shifted = t.add_scalar(-(start as f64));
                            x.narrow(1, start, len).contiguous().cross_entropy_block_backward(&shifted, &lse, &w, -100 - start as i64)
                        })
                        .collect();
                    let joined = Tensor::cat(&pieces, 1);
                    let bits = |g: &Tensor| g.to_dtype(DType::F64).to_vec::<f64>();
                    assert_eq!(bits(&joined), bits(&whole), "{dtype} {rows}x{classes} in blocks of {block}");
                }
            }
        }
    }

    crate::device_test! {
        fn cross_entropy_rows_keep_minus_infinity_and_nan_apart(dev: Device) {
            // A masked class (-inf) has probability 0 and adds nothing; a NaN logit makes its
            // row's loss NaN, as log_softmax would.
            let x = Tensor::from_vec(vec![0.0, f64::NEG_INFINITY, 1.0, 0.5, f64::NAN, 2.0], [2, 3], dev).unwrap()
                .to_dtype(DType::F32);
            let t = Tensor::from_vec(vec![2i64, 0], [2], dev).unwrap();
            let (loss, _) = x.cross_entropy_rows(&t, -100, 0.0);
            let loss = loss.to_vec::<f32>();
            let want = (1.0f64.exp() + 1.0).ln() - 1.0;
            assert!((loss[0] as f64 - want).abs() < 1e-6, "{} vs {want}", loss[0]);
            assert!(loss[1].is_nan(), "a NaN logit must give a NaN loss, got {}", loss[1]);
        }
    }

    crate::device_test! {
        fn cross_entropy_rows_leave_an_ignored_row_exactly_zero_whatever_it_holds(dev: Device) {
            let x = Tensor::from_vec(vec![f32::NAN, 1.0, f32::INFINITY, 0.5, 2.0, -1.0], [2, 3], dev).unwrap();
            let t = Tensor::from_vec(vec![-1i64, 1], [2], dev).unwrap();
            let (loss, lse) = x.cross_entropy_rows(&t, -1, 0.0);
            let l = loss.to_vec::<f32>();
            assert_eq!(l[0], 0.0);
            assert!(l[1].is_finite() && l[1] > 0.0, "{l:?}");
            let w = Tensor::from_vec(vec![1.0f32, 1.0], [2], dev).unwrap();
            let g = x.cross_entropy_rows_backward(&t, &lse, &w, -1, 0.0).to_vec::<f32>();
            assert_eq!(&g[..3], &[0.0, 0.0, 0.0]);
            assert!(g[3..].iter().sum::<f32>().abs() < 1e-6, "a row's gradient sums to zero: {g:?}");
        }
    }

    #[test]
    #[should_panic(expected = "target 3 of row 0 is out of range for 3 classes")]
    fn cross_entropy_rows_name_a_target_out_of_range() {
        let x = Tensor::zeros([1, 3], DType::F32, Device::Cpu).unwrap();
        let t = Tensor::from_vec(vec![3i64], [1], Device::Cpu).unwrap();
        let _ = x.cross_entropy_rows(&t, -100, 0.0);
    }
}
