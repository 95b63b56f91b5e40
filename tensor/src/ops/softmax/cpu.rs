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

/// Softmax down the columns of a row-major `[n, inner]` block.
fn softmax_columns<T: ComputeAs>(x: &[T], out: &mut [T], inner: usize, op: SoftmaxOp) {
    let mut max = vec![T::C::neg_infinity(); inner];
    for row in x.chunks(inner) {
        for (m, &v) in max.iter_mut().zip(row) {
            let v = v.up();
            if v > *m {
                *m = v;
            }
        }
    }
    let mut sum = vec![T::C::zero(); inner];
    for row in x.chunks(inner) {
        for ((s, &m), &v) in sum.iter_mut().zip(&max).zip(row) {
            *s = *s + (v.up() - m).exp();
        }
    }
    match op {
        SoftmaxOp::Softmax => {
            for (orow, row) in out.chunks_mut(inner).zip(x.chunks(inner)) {
                for (((o, &v), &m), &s) in orow.iter_mut().zip(row).zip(&max).zip(&sum) {
                    *o = T::down((v.up() - m).exp() / s);
                }
            }
        }
        SoftmaxOp::LogSoftmax => {
            let log_sum: Vec<T::C> = sum.iter().map(|s| s.ln()).collect();
            for (orow, row) in out.chunks_mut(inner).zip(x.chunks(inner)) {
                for (((o, &v), &m), &l) in orow.iter_mut().zip(row).zip(&max).zip(&log_sum) {
                    *o = T::down((v.up() - m) - l);
                }
            }
        }
    }
}
