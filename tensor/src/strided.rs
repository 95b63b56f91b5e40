//! Walking strided views on the CPU.
//!
//! [`Walk`] visits K layouts of one shape together in row-major order, one innermost *run* at
//! a time: a base offset per operand plus an inner stride and a length. Kernels loop over runs,
//! so a contiguous operand gets a plain slice loop the compiler vectorises, and a walk can start
//! at any linear index, so rayon can split the output into chunks.

use crate::Layout;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Below this many elements a kernel runs on one thread: spawning costs more than it saves.
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;

pub(crate) struct Walk<const K: usize> {
    dims: Vec<usize>,
    strides: [Vec<usize>; K],
    offsets: [usize; K],
    numel: usize,
}

impl<const K: usize> Walk<K> {
    /// `layouts` must all have the same shape (broadcast them first).
    pub fn new(layouts: [&Layout; K]) -> Self {
        let shape = layouts[0].dims();
        for l in &layouts[1..] {
            debug_assert_eq!(l.dims(), shape);
        }
        let numel = shape.iter().product();
        // Drop size-1 dims, then merge neighbours that are contiguous with each other in
        // every operand, so runs are as long as possible.
        let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
        let mut strides: [Vec<usize>; K] = std::array::from_fn(|_| Vec::with_capacity(shape.len()));
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let mergeable = !dims.is_empty()
                && (0..K).all(|k| *strides[k].last().unwrap() == layouts[k].strides()[i] * d);
            if mergeable {
                *dims.last_mut().unwrap() *= d;
                for k in 0..K {
                    *strides[k].last_mut().unwrap() = layouts[k].strides()[i];
                }
            } else {
                dims.push(d);
                for k in 0..K {
                    strides[k].push(layouts[k].strides()[i]);
                }
            }
        }
        let offsets = std::array::from_fn(|k| layouts[k].offset());
        Walk { dims, strides, offsets, numel }
    }

    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Calls `f(bases, inner_strides, len)` for each run covering linear indices `start..end`.
    #[inline]
    pub fn for_each_run(&self, start: usize, end: usize, mut f: impl FnMut([usize; K], [usize; K], usize)) {
        let end = end.min(self.numel);
        if start >= end {
            return;
        }
        let rank = self.dims.len();
        if rank == 0 {
            f(self.offsets, [0; K], 1);
            return;
        }
        let inner = self.dims[rank - 1];
        let inner_strides: [usize; K] = std::array::from_fn(|k| self.strides[k][rank - 1]);
        let mut index = vec![0usize; rank];
        let mut rest = start;
        for d in (0..rank).rev() {
            index[d] = rest % self.dims[d];
            rest /= self.dims[d];
        }
        let mut pos = start;
        while pos < end {
            let len = (inner - index[rank - 1]).min(end - pos);
            let bases: [usize; K] = std::array::from_fn(|k| {
                self.offsets[k] + index.iter().zip(&self.strides[k]).map(|(i, s)| i * s).sum::<usize>()
            });
            f(bases, inner_strides, len);
            pos += len;
            index[rank - 1] += len;
            let mut d = rank - 1;
            while index[d] == self.dims[d] && d > 0 {
                index[d] = 0;
                d -= 1;
                index[d] += 1;
            }
        }
    }
}

/// Storage offsets of a layout's elements in row-major order.
pub fn offsets(layout: &Layout) -> Vec<usize> {
    let walk = Walk::new([layout]);
    let mut out = Vec::with_capacity(walk.numel());
    walk.for_each_run(0, walk.numel(), |[b], [s], n| out.extend((0..n).map(|j| b + j * s)));
    out
}

/// Splits `0..n` into chunks for rayon: roughly four per thread, none tiny.
pub(crate) fn chunk_len(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n.div_ceil(threads * 4)).max(PAR_THRESHOLD / 4).max(1)
}

/// A vector of `n` elements written chunk by chunk by `fill(start, chunk)` (on rayon from
/// `PAR_THRESHOLD` elements), without zeroing it first: every kernel below writes each element
/// of its output exactly once, so a memset would only add a pass over memory.
///
/// `fill` must write every element of the chunk it is given.
pub(crate) fn filled<U: Copy + Send>(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync) -> Vec<U> {
    let mut out: Vec<U> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    if n < PAR_THRESHOLD {
        fill(0, spare);
    } else {
        let cl = chunk_len(n);
        spare.par_chunks_mut(cl).enumerate().for_each(|(i, c)| fill(i * cl, c));
    }
    // SAFETY: the capacity is `n`, and `fill` wrote each of the `n` elements (its contract;
    // the callers in this crate cover their chunk with the runs of a walk over it). `U: Copy`,
    // so a panic inside `fill` leaks nothing (the length stays 0).
    unsafe { out.set_len(n) };
    out
}

/// `out[i] = f(src[layout(i)])`: a new contiguous vector from a strided view.
///
/// `f` is a generic closure, so each op gets its own monomorphised loop; a contiguous run is
/// a slice loop the compiler vectorises.
#[inline]
pub(crate) fn map<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    layout: &Layout,
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    // An empty view may carry an offset past its (empty) storage: it gets no slice.
    if layout.elem_count() == 0 {
        return Vec::new();
    }
    if let Some(range) = layout.contiguous_range() {
        let src = &src[range];
        return filled(src.len(), |start, chunk| {
            let end = start + chunk.len();
            for (d, &x) in chunk.iter_mut().zip(&src[start..end]) {
                d.write(f(x));
            }
        });
    }
    let walk = Walk::new([layout]);
    filled(walk.numel(), |start, chunk| {
        let mut o = 0;
        walk.for_each_run(start, start + chunk.len(), |[b], [s], len| {
            let dst = &mut chunk[o..o + len];
            match s {
                1 => {
                    for (d, &x) in dst.iter_mut().zip(&src[b..b + len]) {
                        d.write(f(x));
                    }
                }
                0 => {
                    let y = f(src[b]);
                    dst.iter_mut().for_each(|d| {
                        d.write(y);
                    });
                }
                _ => {
                    for (j, d) in dst.iter_mut().enumerate() {
                        d.write(f(src[b + j * s]));
                    }
                }
            }
            o += len;
        });
    })
}

/// `out[i] = f(a[la(i)], b[lb(i)])`; `la` and `lb` must have the output's shape (broadcast first).
///
/// Runs whose inner strides are 0 or 1 (same shape, a per-channel or per-row operand) are
/// tight slice loops; only other strides index element by element.
#[inline]
pub(crate) fn zip_map<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    f: impl Fn(A, B) -> U + Sync,
) -> Vec<U> {
    if la.elem_count() == 0 {
        return Vec::new();
    }
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        return filled(a.len(), |start, chunk| {
            let end = start + chunk.len();
            for ((d, &x), &y) in chunk.iter_mut().zip(&a[start..end]).zip(&b[start..end]) {
                d.write(f(x, y));
            }
        });
    }
    let walk = Walk::new([la, lb]);
    filled(walk.numel(), |start, chunk| {
        let mut o = 0;
        walk.for_each_run(start, start + chunk.len(), |[ba, bb], [sa, sb], len| {
            let dst = &mut chunk[o..o + len];
            match (sa, sb) {
                (1, 1) => {
                    for ((d, &x), &y) in dst.iter_mut().zip(&a[ba..ba + len]).zip(&b[bb..bb + len]) {
                        d.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = b[bb];
                    for (d, &x) in dst.iter_mut().zip(&a[ba..ba + len]) {
                        d.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = a[ba];
                    for (d, &y) in dst.iter_mut().zip(&b[bb..bb + len]) {
                        d.write(f(x, y));
                    }
                }
                _ => {
                    for (j, d) in dst.iter_mut().enumerate() {
                        d.write(f(a[ba + j * sa], b[bb + j * sb]));
                    }
                }
            }
            o += len;
        });
    })
}

/// `out[i] = f(a[la(i)], b[lb(i)], c[lc(i)])`, all layouts of the output's shape.
pub(crate) fn zip3_map<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, U: Copy + Send>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    f: impl Fn(A, B, C) -> U + Sync,
) -> Vec<U> {
    let walk = Walk::new([la, lb, lc]);
    filled(walk.numel(), |start, chunk| {
        let mut o = 0;
        walk.for_each_run(start, start + chunk.len(), |[ba, bb, bc], [sa, sb, sc], len| {
            let dst = &mut chunk[o..o + len];
            if (sa, sb, sc) == (1, 1, 1) {
                for (((d, &x), &y), &z) in
                    dst.iter_mut().zip(&a[ba..ba + len]).zip(&b[bb..bb + len]).zip(&c[bc..bc + len])
                {
                    d.write(f(x, y, z));
                }
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    d.write(f(a[ba + j * sa], b[bb + j * sb], c[bc + j * sc]));
                }
            }
            o += len;
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_a_transposed_narrowed_view() {
        let l = Layout::contiguous([3, 4]).narrow(1, 1, 2).permute(&[1, 0]);
        assert_eq!(offsets(&l), vec![1, 5, 9, 2, 6, 10]);
    }

    #[test]
    fn runs_can_start_anywhere() {
        let l = Layout::contiguous([2, 3, 4]).permute(&[2, 0, 1]);
        let all = offsets(&l);
        let walk = Walk::new([&l]);
        for start in 0..24 {
            let mut got = vec![];
            walk.for_each_run(start, 24, |[b], [s], n| got.extend((0..n).map(|j| b + j * s)));
            assert_eq!(got, all[start..]);
        }
    }

    use proptest::prelude::*;

    /// A random layout: shape, strides (0 included, as for expanded dims) and offset.
    fn layout() -> impl Strategy<Value = Layout> {
        prop::collection::vec((0usize..5, 0usize..7), 0..5)
            .prop_flat_map(|dims| (Just(dims), 0usize..4))
            .prop_map(|(dims, offset)| {
                let (shape, strides): (Vec<usize>, Vec<usize>) = dims.into_iter().unzip();
                Layout::new(shape, strides, offset)
            })
    }

    fn naive_offsets(l: &Layout) -> Vec<usize> {
        let n = l.elem_count();
        (0..n)
            .map(|flat| {
                let mut rest = flat;
                let mut off = l.offset();
                for (&d, &s) in l.dims().iter().zip(l.strides()).rev() {
                    off += (rest % d) * s;
                    rest /= d;
                }
                off
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn offsets_match_multi_index_arithmetic(l in layout()) {
            prop_assert_eq!(offsets(&l), naive_offsets(&l));
        }

        #[test]
        fn runs_cover_any_range(l in layout(), other in layout(), a in 0usize..700, b in 0usize..700) {
            let expected = naive_offsets(&l);
            let n = expected.len();
            let (start, end) = (a.min(b) % (n + 1), a.max(b).min(n));
            // A second operand of the same shape (its own strides) must stay in step.
            let l2 = Layout::new(l.dims(), other.strides().iter().chain(std::iter::repeat(&3)).take(l.rank()).copied().collect(), 1);
            let expected2 = naive_offsets(&l2);
            let walk = Walk::new([&l, &l2]);
            prop_assert_eq!(walk.numel(), n);
            let (mut got, mut got2) = (vec![], vec![]);
            walk.for_each_run(start, end, |[b0, b1], [s0, s1], len| {
                got.extend((0..len).map(|j| b0 + j * s0));
                got2.extend((0..len).map(|j| b1 + j * s1));
            });
            let range = start.min(end)..end;
            prop_assert_eq!(&got[..], &expected[range.clone()]);
            prop_assert_eq!(&got2[..], &expected2[range]);
        }
    }
}
