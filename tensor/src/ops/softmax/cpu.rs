//! CPU kernels for softmax over the middle dim of a row-major block `[outer, n, inner]`.
//! With `inner == 1` each slice is a contiguous row; otherwise the max and the sum are
//! vectors over `inner`, updated one contiguous row of the block at a time.

use super::SoftmaxOp;
use crate::dtype::Element;
use crate::ops::unary::cpu::ComputeAs;
use crate::storage::CpuStorage;
use crate::strided::PAR_THRESHOLD;
use num_traits::{Float, Zero};
use rayon::prelude::*;

pub(super) fn softmax(s: &CpuStorage, outer: usize, n: usize, inner: usize, op: SoftmaxOp) -> CpuStorage {
    with_float_storage!(s, op.name(), v, T => T::into_storage(softmax_block(&v[..outer * n * inner], n, inner, op)))
}

fn softmax_block<T: ComputeAs>(src: &[T], n: usize, inner: usize, op: SoftmaxOp) -> Vec<T> {
    let mut out = vec![T::zero(); src.len()];
    if src.is_empty() {
        return out;
    }
    let slice = n * inner;
    // Whole `[n, inner]` blocks per task, enough of them to be worth a thread.
    let per_task = slice * (PAR_THRESHOLD / slice).max(1);
    let work = |(o, x): (&mut [T], &[T])| {
        let mut scratch = Vec::new();
        for (ob, xb) in o.chunks_mut(slice).zip(x.chunks(slice)) {
            if inner == 1 {
                softmax_row(xb, ob, op, &mut scratch);
            } else {
                softmax_columns(xb, ob, inner, op);
            }
        }
    };
    if src.len() <= per_task {
        work((&mut out, src));
    } else {
        out.par_chunks_mut(per_task).zip(src.par_chunks(per_task)).for_each(work);
    }
    out
}

fn row_max<T: ComputeAs>(x: &[T]) -> T::C {
    x.iter().fold(T::C::neg_infinity(), |m, &v| {
        let v = v.up();
        if v > m {
            v
        } else {
            m
        }
    })
}

fn softmax_row<T: ComputeAs>(x: &[T], out: &mut [T], op: SoftmaxOp, exps: &mut Vec<T::C>) {
    let m = row_max(x);
    exps.clear();
    exps.extend(x.iter().map(|&v| (v.up() - m).exp()));
    let sum = exps.iter().fold(T::C::zero(), |a, &e| a + e);
    match op {
        SoftmaxOp::Softmax => {
            for (o, &e) in out.iter_mut().zip(exps.iter()) {
                *o = T::down(e / sum);
            }
        }
        SoftmaxOp::LogSoftmax => {
            let log_sum = sum.ln();
            for (o, &v) in out.iter_mut().zip(x) {
                *o = T::down((v.up() - m) - log_sum);
            }
        }
    }
}

/// Rows of one `[n, inner]` block per task when a big block is split across threads.
fn rows_per_task(inner: usize) -> usize {
    (PAR_THRESHOLD / inner).max(1)
}

/// `acc[j] = f(acc[j], x[row][j], j)` over the rows of a row-major `[n, inner]` block; a big
/// block is split into row ranges whose partial results `combine` merges.
fn fold_columns<T: Copy + Sync, C: Copy + Send + Sync>(
    x: &[T],
    inner: usize,
    init: C,
    f: impl Fn(C, T, usize) -> C + Sync,
    combine: impl Fn(C, C) -> C + Sync,
) -> Vec<C> {
    let fold = |rows: &[T]| {
        let mut acc = vec![init; inner];
        for row in rows.chunks(inner) {
            for (j, (a, &v)) in acc.iter_mut().zip(row).enumerate() {
                *a = f(*a, v, j);
            }
        }
        acc
    };
    if x.len() < PAR_THRESHOLD {
        return fold(x);
    }
    x.par_chunks(inner * rows_per_task(inner))
        .map(fold)
        .reduce_with(|a, b| a.iter().zip(&b).map(|(&p, &q)| combine(p, q)).collect())
        .unwrap_or_else(|| vec![init; inner])
}

/// Softmax down the columns of a row-major `[n, inner]` block.
fn softmax_columns<T: ComputeAs>(x: &[T], out: &mut [T], inner: usize, op: SoftmaxOp) {
    let larger = |m: T::C, v: T::C| if v > m { v } else { m };
    let max = fold_columns(x, inner, T::C::neg_infinity(), |m, v: T, _| larger(m, v.up()), larger);
    let sum = fold_columns(x, inner, T::C::zero(), |s, v: T, j| s + (v.up() - max[j]).exp(), |a, b| a + b);
    let log_sum: Vec<T::C> = sum.iter().map(|s| s.ln()).collect();
    let write = |(out, x): (&mut [T], &[T])| {
        for (orow, row) in out.chunks_mut(inner).zip(x.chunks(inner)) {
            let rows = orow.iter_mut().zip(row).zip(max.iter().zip(sum.iter().zip(&log_sum)));
            match op {
                SoftmaxOp::Softmax => {
                    for ((o, &v), (&m, (&s, _))) in rows {
                        *o = T::down((v.up() - m).exp() / s);
                    }
                }
                SoftmaxOp::LogSoftmax => {
                    for ((o, &v), (&m, (_, &l))) in rows {
                        *o = T::down((v.up() - m) - l);
                    }
                }
            }
        }
    };
    if x.len() < PAR_THRESHOLD {
        write((out, x));
    } else {
        let chunk = inner * rows_per_task(inner);
        out.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(write);
    }
}
