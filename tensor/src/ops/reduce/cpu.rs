//! CPU kernels for reductions.
//!
//! A [`Plan`] splits the input layout into the kept dims (one output element each) and the
//! reduced dims, merges neighbouring dims that are contiguous with each other, and picks one
//! of two loops:
//! - *inner*: each output folds its reduced elements, as strided runs. Reducing the last
//!   (contiguous) dim makes these runs plain slices.
//! - *rows*: when the kept dims end in a stride-1 dim and the reduced ones do not (e.g. sum
//!   over dim 0 of a row-major `[N, C]`), a tile of outputs is updated from one contiguous
//!   slice of the input per reduced element, so the inner loop is contiguous in both.
//!
//! Work is split with rayon over outputs when there are many, else over the reduced range,
//! with per-chunk partial states merged in order (which keeps argmax's first-occurrence rule).

use super::ReduceOp;
use crate::dtype::Element;
use crate::storage::CpuStorage;
use crate::strided::{offsets, Walk, PAR_THRESHOLD};
use crate::Layout;
use half::{bf16, f16};
use rayon::prelude::*;

/// One reduction as a fold: `init`, then `step` per element (with its row-major index among
/// the reduced elements), `merge` of partial folds, and `finish` into the output value.
pub(crate) trait Reducer<T: Copy>: Sync {
    type State: Copy + Send + Sync;
    type Out: Copy + Send + Sync + Default;
    fn init(&self, first_index: usize) -> Self::State;
    fn step(&self, s: Self::State, x: T, index: usize) -> Self::State;
    /// Combines the fold of some elements with the fold of the elements that follow them.
    fn merge(&self, earlier: Self::State, later: Self::State) -> Self::State;
    fn finish(&self, s: Self::State, count: usize) -> Self::Out;

    /// Folds `len` elements at `base + i * stride`, the first having reduced index `index`.
    #[inline(always)]
    fn fold_run(
        &self,
        mut s: Self::State,
        src: &[T],
        base: usize,
        stride: usize,
        len: usize,
        index: usize,
    ) -> Self::State {
        if stride == 1 {
            for (i, &x) in src[base..base + len].iter().enumerate() {
                s = self.step(s, x, index + i);
            }
        } else {
            for i in 0..len {
                s = self.step(s, src[base + i * stride], index + i);
            }
        }
        s
    }
}

/// Folds a slice with 8 independent lanes, so order-insensitive folds (sum, max) vectorise;
/// blocks bound the f32 rounding error of long sums to that of a two-level cascade.
#[inline(always)]
fn fold_lanes<T: Copy, R: Reducer<T>>(r: &R, s: R::State, xs: &[T]) -> R::State {
    const LANES: usize = 8;
    let mut total = s;
    for block in xs.chunks(4096) {
        let mut lanes = [r.init(0); LANES];
        let mut chunks = block.chunks_exact(LANES);
        for c in &mut chunks {
            for k in 0..LANES {
                lanes[k] = r.step(lanes[k], c[k], 0);
            }
        }
        let mut acc = r.merge(
            r.merge(r.merge(lanes[0], lanes[4]), r.merge(lanes[1], lanes[5])),
            r.merge(r.merge(lanes[2], lanes[6]), r.merge(lanes[3], lanes[7])),
        );
        for &x in chunks.remainder() {
            acc = r.step(acc, x, 0);
        }
        total = r.merge(total, acc);
    }
    total
}

/// Elements a sum accumulates in a wider type: f32 for f16/bf16/f32, f64 for f64, and i64
/// (wrapping, as PyTorch) for integers and bool, whose sums are int64 tensors.
pub(crate) trait Summable: Element {
    type Acc: Copy + Send + Sync;
    type SumOut: Element;
    const ZERO: Self::Acc;
    fn widen(self) -> Self::Acc;
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn acc_to_f64(a: Self::Acc) -> f64;
    fn sum_out(a: Self::Acc) -> Self::SumOut;
}

macro_rules! summable_float {
    ($t:ty, $acc:ty, |$x:ident| $widen:expr, |$a:ident| $out:expr) => {
        impl Summable for $t {
            type Acc = $acc;
            type SumOut = $t;
            const ZERO: $acc = 0.0;
            #[inline(always)]
            fn widen(self) -> $acc {
                let $x = self;
                $widen
            }
            #[inline(always)]
            fn add(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn acc_to_f64(a: $acc) -> f64 {
                a as f64
            }
            #[inline(always)]
            fn sum_out(a: $acc) -> $t {
                let $a = a;
                $out
            }
        }
    };
}
summable_float!(f32, f32, |x| x, |a| a);
summable_float!(f64, f64, |x| x, |a| a);
summable_float!(f16, f32, |x| x.to_f32(), |a| f16::from_f32(a));
summable_float!(bf16, f32, |x| x.to_f32(), |a| bf16::from_f32(a));

macro_rules! summable_int {
    ($t:ty) => {
        impl Summable for $t {
            type Acc = i64;
            type SumOut = i64;
            const ZERO: i64 = 0;
            #[inline(always)]
            fn widen(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn add(a: i64, b: i64) -> i64 {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn acc_to_f64(a: i64) -> f64 {
                a as f64
            }
            #[inline(always)]
            fn sum_out(a: i64) -> i64 {
                a
            }
        }
    };
}
summable_int!(i64);
summable_int!(u32);
summable_int!(u8);
summable_int!(bool);

/// The smallest and largest values of an element type (the identities of max and min).
pub(crate) trait Bounded: Element {
    const LOWEST: Self;
    const HIGHEST: Self;
}
macro_rules! bounded {
    ($($t:ty: $lo:expr, $hi:expr);*) => {
        $(impl Bounded for $t {
            const LOWEST: $t = $lo;
            const HIGHEST: $t = $hi;
        })*
    };
}
bounded!(f32: f32::NEG_INFINITY, f32::INFINITY; f64: f64::NEG_INFINITY, f64::INFINITY;
    f16: f16::NEG_INFINITY, f16::INFINITY; bf16: bf16::NEG_INFINITY, bf16::INFINITY;
    i64: i64::MIN, i64::MAX; u32: 0, u32::MAX; u8: 0, u8::MAX; bool: false, true);

#[allow(clippy::eq_op)]
#[inline(always)]
fn is_nan<T: PartialEq>(x: T) -> bool {
    x != x
}

pub(crate) struct Sum;

impl<T: Summable> Reducer<T> for Sum {
    type State = T::Acc;
    type Out = T::SumOut;
    #[inline(always)]
    fn init(&self, _: usize) -> T::Acc {
        T::ZERO
    }
    #[inline(always)]
    fn step(&self, s: T::Acc, x: T, _: usize) -> T::Acc {
        T::add(s, x.widen())
    }
    #[inline(always)]
    fn merge(&self, a: T::Acc, b: T::Acc) -> T::Acc {
        T::add(a, b)
    }
    fn finish(&self, s: T::Acc, _: usize) -> T::SumOut {
        T::sum_out(s)
    }
    #[inline(always)]
    fn fold_run(&self, s: T::Acc, src: &[T], base: usize, stride: usize, len: usize, i: usize) -> T::Acc {
        if stride == 1 && len >= 32 {
            return fold_lanes(self, s, &src[base..base + len]);
        }
        default_fold_run(self, s, src, base, stride, len, i)
    }
}

/// The trait's default `fold_run`, callable from overrides.
#[inline(always)]
fn default_fold_run<T: Copy, R: Reducer<T>>(
    r: &R,
    mut s: R::State,
    src: &[T],
    base: usize,
    stride: usize,
    len: usize,
    index: usize,
) -> R::State {
    for i in 0..len {
        s = r.step(s, src[base + i * stride], index + i);
    }
    s
}

/// The sum divided by the count, in the input's float dtype.
pub(crate) struct Mean;

impl<T: Summable> Reducer<T> for Mean {
    type State = T::Acc;
    type Out = T;
    #[inline(always)]
    fn init(&self, i: usize) -> T::Acc {
        <Sum as Reducer<T>>::init(&Sum, i)
    }
    #[inline(always)]
    fn step(&self, s: T::Acc, x: T, i: usize) -> T::Acc {
        Sum.step(s, x, i)
    }
    #[inline(always)]
    fn merge(&self, a: T::Acc, b: T::Acc) -> T::Acc {
        <Sum as Reducer<T>>::merge(&Sum, a, b)
    }
    fn finish(&self, s: T::Acc, count: usize) -> T {
        T::from_f64(T::acc_to_f64(s) / count as f64)
    }
    #[inline(always)]
    fn fold_run(&self, s: T::Acc, src: &[T], base: usize, stride: usize, len: usize, i: usize) -> T::Acc {
        Sum.fold_run(s, src, base, stride, len, i)
    }
}

/// `max` (LARGEST) or `min` values; a NaN, once seen, stays.
pub(crate) struct Extreme<const LARGEST: bool>;

impl<T: Bounded, const LARGEST: bool> Reducer<T> for Extreme<LARGEST> {
    type State = T;
    type Out = T;
    #[inline(always)]
    fn init(&self, _: usize) -> T {
        if LARGEST {
            T::LOWEST
        } else {
            T::HIGHEST
        }
    }
    #[inline(always)]
    fn step(&self, s: T, x: T, _: usize) -> T {
        let better = if LARGEST { x > s } else { x < s };
        if better || is_nan(x) {
            x
        } else {
            s
        }
    }
    #[inline(always)]
    fn merge(&self, a: T, b: T) -> T {
        Reducer::<T>::step(self, a, b, 0)
    }
    fn finish(&self, s: T, _: usize) -> T {
        s
    }
    #[inline(always)]
    fn fold_run(&self, s: T, src: &[T], base: usize, stride: usize, len: usize, i: usize) -> T {
        if stride == 1 && len >= 32 {
            return fold_lanes(self, s, &src[base..base + len]);
        }
        default_fold_run(self, s, src, base, stride, len, i)
    }
}

/// `argmax` (LARGEST) or `argmin`: the first best index; the first NaN beats everything.
pub(crate) struct Arg<const LARGEST: bool>;

impl<const LARGEST: bool> Arg<LARGEST> {
    #[inline(always)]
    fn beats<T: PartialOrd + Copy>(x: T, best: T) -> bool {
        if is_nan(best) {
            false
        } else if LARGEST {
            x > best || is_nan(x)
        } else {
            x < best || is_nan(x)
        }
    }
}

impl<T: Bounded, const LARGEST: bool> Reducer<T> for Arg<LARGEST> {
    type State = (T, usize);
    type Out = i64;
    #[inline(always)]
    fn init(&self, first_index: usize) -> (T, usize) {
        // The identity at the first index: an all-identity run (e.g. all -inf) answers its first element.
        (if LARGEST { T::LOWEST } else { T::HIGHEST }, first_index)
    }
    #[inline(always)]
    fn step(&self, s: (T, usize), x: T, index: usize) -> (T, usize) {
        if Self::beats(x, s.0) {
            (x, index)
        } else {
            s
        }
    }
    #[inline(always)]
    fn merge(&self, a: (T, usize), b: (T, usize)) -> (T, usize) {
        if Self::beats(b.0, a.0) {
            b
        } else {
            a
        }
    }
    fn finish(&self, s: (T, usize), _: usize) -> i64 {
        s.1 as i64
    }
}

/// Count, mean and sum of squared deviations in f64 (Welford per element, Chan to merge).
#[derive(Clone, Copy)]
pub(crate) struct Moments {
    n: f64,
    mean: f64,
    m2: f64,
}

/// Variance (or its square root) with Bessel-style `correction`, in the input's float dtype.
pub(crate) struct Var {
    pub correction: usize,
    pub sqrt: bool,
}

impl<T: Element> Reducer<T> for Var {
    type State = Moments;
    type Out = T;
    #[inline(always)]
    fn init(&self, _: usize) -> Moments {
        Moments { n: 0.0, mean: 0.0, m2: 0.0 }
    }
    #[inline(always)]
    fn step(&self, s: Moments, x: T, _: usize) -> Moments {
        let x = x.to_f64();
        let n = s.n + 1.0;
        let d = x - s.mean;
        let mean = s.mean + d / n;
        Moments { n, mean, m2: s.m2 + d * (x - mean) }
    }
    #[inline(always)]
    fn merge(&self, a: Moments, b: Moments) -> Moments {
        if a.n == 0.0 {
            return b;
        }
        if b.n == 0.0 {
            return a;
        }
        let n = a.n + b.n;
        let d = b.mean - a.mean;
        Moments { n, mean: a.mean + d * (b.n / n), m2: a.m2 + b.m2 + d * d * (a.n * b.n / n) }
    }
    fn finish(&self, s: Moments, count: usize) -> T {
        let dof = count.saturating_sub(self.correction) as f64;
        let var = s.m2 / dof;
        T::from_f64(if self.sqrt { var.sqrt() } else { var })
    }
    /// Two passes over a run (mean, then squared deviations), merged into `s`.
    fn fold_run(&self, s: Moments, src: &[T], base: usize, stride: usize, len: usize, _: usize) -> Moments {
        if len < 2 {
            return default_fold_run(self, s, src, base, stride, len, 0);
        }
        let at = |i: usize| src[base + i * stride].to_f64();
        let mean = (0..len).map(at).sum::<f64>() / len as f64;
        let m2 = (0..len).map(|i| (at(i) - mean).powi(2)).sum::<f64>();
        Reducer::<T>::merge(self, s, Moments { n: len as f64, mean, m2 })
    }
}

/// Drops size-1 dims and merges neighbours that are contiguous with each other.
fn merge_dims(dims: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut md, mut ms): (Vec<usize>, Vec<usize>) = (vec![], vec![]);
    for (&d, &s) in dims.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        match (md.last_mut(), ms.last_mut()) {
            (Some(ld), Some(ls)) if *ls == s * d => {
                *ld *= d;
                *ls = s;
            }
            _ => {
                md.push(d);
                ms.push(s);
            }
        }
    }
    (md, ms)
}

/// Outputs one rows-strategy task keeps in its accumulator tile.
const ROW_TILE: usize = 256;

/// How to walk one layout for one set of reduced dims.
pub(crate) struct Plan {
    /// The kept dims with their input strides and the input offset: output `o` sits at
    /// `offsets(out)[o]`.
    out: Layout,
    n_out: usize,
    /// The reduced elements are `run_len`-long runs with stride `run_stride`, starting at these
    /// offsets relative to an output's base, in row-major order.
    runs: Vec<usize>,
    run_len: usize,
    run_stride: usize,
    n_red: usize,
    /// Whether the rows loop applies (kept dims end with stride 1, reduced runs do not).
    rows: bool,
    /// The length of the innermost (merged) kept dim.
    row_len: usize,
}

impl Plan {
    pub fn new(layout: &Layout, reduced: &[usize]) -> Plan {
        let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
        for (i, (&d, &s)) in layout.dims().iter().zip(layout.strides()).enumerate() {
            if reduced.contains(&i) {
                rd.push(d);
                rs.push(s);
            } else {
                kd.push(d);
                ks.push(s);
            }
        }
        let n_red: usize = rd.iter().product();
        let (rd, rs) = merge_dims(&rd, &rs);
        let (run_len, run_stride, runs) = match rd.len() {
            0 => (1, 0, vec![0]),
            r => (rd[r - 1], rs[r - 1], offsets(&Layout::new(&rd[..r - 1], rs[..r - 1].to_vec(), 0))),
        };
        let (kept_dims, kept_strides) = merge_dims(&kd, &ks);
        let rows = kept_strides.last() == Some(&1) && (run_stride != 1 || n_red == 1);
        let row_len = if rows { kept_dims[kept_dims.len() - 1] } else { 1 };
        let out = Layout::new(kd, ks, layout.offset());
        Plan { n_out: out.elem_count(), out, runs, run_len, run_stride, n_red, rows, row_len }
    }

    /// Runs `r` for every output, in row-major order of the kept dims.
    pub fn run<T: Copy + Sync, R: Reducer<T>>(&self, src: &[T], r: &R) -> Vec<R::Out> {
        if self.n_red == 0 {
            return vec![r.finish(r.init(0), 0); self.n_out];
        }
        let finish = |s| r.finish(s, self.n_red);
        let work = self.n_out.saturating_mul(self.n_red);
        if work < PAR_THRESHOLD || self.n_out == 0 {
            return self.fold(src, r, 0..self.n_out, 0..self.n_red).into_iter().map(finish).collect();
        }
        let tasks = rayon::current_num_threads().max(1) * 4;
        // The rows loop wants whole rows of kept outputs per task; the inner loop any outputs.
        let row_len = self.row_len;
        let split_outputs = self.n_out / row_len >= tasks;
        if split_outputs {
            let per_task = self.n_out.div_ceil(tasks).max(PAR_THRESHOLD.div_ceil(self.n_red));
            let chunk = per_task.next_multiple_of(row_len);
            let mut out = vec![R::Out::default(); self.n_out];
            out.par_chunks_mut(chunk).enumerate().for_each(|(ci, c)| {
                let o0 = ci * chunk;
                let states = self.fold(src, r, o0..o0 + c.len(), 0..self.n_red);
                for (o, s) in c.iter_mut().zip(states) {
                    *o = finish(s);
                }
            });
            out
        } else {
            let chunk = self.n_red.div_ceil(tasks).max(PAR_THRESHOLD.div_ceil(self.n_out));
            let partials: Vec<Vec<R::State>> = (0..self.n_red.div_ceil(chunk))
                .into_par_iter()
                .map(|ci| self.fold(src, r, 0..self.n_out, ci * chunk..((ci + 1) * chunk).min(self.n_red)))
                .collect();
            let mut states = partials[0].clone();
            for p in &partials[1..] {
                for (s, &q) in states.iter_mut().zip(p) {
                    *s = r.merge(*s, q);
                }
            }
            states.into_iter().map(finish).collect()
        }
    }

    /// Partial states of outputs `outs` over the reduced elements `red` (row-major indices).
    fn fold<T: Copy, R: Reducer<T>>(
        &self,
        src: &[T],
        r: &R,
        outs: std::ops::Range<usize>,
        red: std::ops::Range<usize>,
    ) -> Vec<R::State> {
        let mut states = Vec::with_capacity(outs.len());
        let walk = Walk::new([&self.out]);
        walk.for_each_run(outs.start, outs.end, |[base], [stride], len| {
            if self.rows {
                debug_assert!(stride == 1 || len == 1);
                for t0 in (0..len).step_by(ROW_TILE) {
                    let first = states.len();
                    let tile = ROW_TILE.min(len - t0);
                    states.resize(first + tile, r.init(red.start));
                    self.fold_rows(src, r, &mut states[first..], base + t0, red.clone());
                }
            } else {
                for j in 0..len {
                    states.push(self.fold_one(src, r, base + j * stride, red.clone()));
                }
            }
        });
        states
    }

    /// Visits the reduced elements `red` as runs: `f(offset, len, index of the first)`.
    #[inline(always)]
    fn for_each_red_run(&self, red: std::ops::Range<usize>, mut f: impl FnMut(usize, usize, usize)) {
        let mut i = red.start;
        while i < red.end {
            let (k, j) = (i / self.run_len, i % self.run_len);
            let len = (self.run_len - j).min(red.end - i);
            f(self.runs[k] + j * self.run_stride, len, i);
            i += len;
        }
    }

    fn fold_one<T: Copy, R: Reducer<T>>(
        &self,
        src: &[T],
        r: &R,
        base: usize,
        red: std::ops::Range<usize>,
    ) -> R::State {
        let mut s = r.init(red.start);
        if self.runs.len() == 1 {
            // One run (e.g. the last dim): skip the run arithmetic, which costs more than a
            // short run's elements.
            let len = red.end - red.start;
            return r.fold_run(
                s,
                src,
                base + self.runs[0] + red.start * self.run_stride,
                self.run_stride,
                len,
                red.start,
            );
        }
        self.for_each_red_run(red, |off, len, i| s = r.fold_run(s, src, base + off, self.run_stride, len, i));
        s
    }

    /// `acc[j]` folds the element at `base + j + reduced offset`, one contiguous slice per
    /// reduced element.
    fn fold_rows<T: Copy, R: Reducer<T>>(
        &self,
        src: &[T],
        r: &R,
        acc: &mut [R::State],
        base: usize,
        red: std::ops::Range<usize>,
    ) {
        let n = acc.len();
        self.for_each_red_run(red, |off, len, i| {
            for e in 0..len {
                let start = base + off + e * self.run_stride;
                for (a, &x) in acc.iter_mut().zip(&src[start..start + n]) {
                    *a = r.step(*a, x, i + e);
                }
            }
        });
    }
}

pub(super) fn reduce(s: &CpuStorage, layout: &Layout, dims: &[usize], op: ReduceOp) -> CpuStorage {
    let plan = Plan::new(layout, dims);
    let name = op.name();
    match op {
        ReduceOp::Sum => {
            with_cpu_storage!(s, v, T => <<T as Summable>::SumOut as Element>::into_storage(plan.run(v, &Sum)))
        }
        ReduceOp::Mean => with_float_storage!(s, name, v, T => T::into_storage(plan.run(v, &Mean))),
        ReduceOp::Max => with_cpu_storage!(s, v, T => T::into_storage(plan.run(v, &Extreme::<true>))),
        ReduceOp::Min => with_cpu_storage!(s, v, T => T::into_storage(plan.run(v, &Extreme::<false>))),
        ReduceOp::ArgMax => with_cpu_storage!(s, v, T => CpuStorage::I64(plan.run(v, &Arg::<true>))),
        ReduceOp::ArgMin => with_cpu_storage!(s, v, T => CpuStorage::I64(plan.run(v, &Arg::<false>))),
        ReduceOp::Var { correction } | ReduceOp::Std { correction } => {
            let var = Var { correction, sqrt: matches!(op, ReduceOp::Std { .. }) };
            with_float_storage!(s, name, v, T => T::into_storage(plan.run(v, &var)))
        }
    }
}
