//! Host kernels of the fused optimizer steps: plain loops over chunks of the buffers (the
//! compiler vectorises them), spread over rayon's threads for large parameters.

use super::{AdamWCoefs, SgdCoefs};
use crate::dtype::FloatElement;
use crate::CpuStorage;
use rayon::prelude::*;

/// Elements per chunk; parameters smaller than two chunks run on the calling thread.
const CHUNK: usize = 1 << 15;

/// Runs `f` on matching chunks of the buffers, in parallel when there are several.
fn for_chunks<J: Send>(jobs: Vec<J>, f: impl Fn(J) + Sync + Send) {
    if jobs.len() > 1 {
        jobs.into_par_iter().for_each(f)
    } else {
        jobs.into_iter().for_each(f)
    }
}

/// Chunks of an optional buffer, `None` per chunk when absent.
fn opt_chunks(buf: Option<&mut [f32]>, n: usize) -> Vec<Option<&mut [f32]>> {
    match buf {
        Some(b) => b.chunks_mut(CHUNK).map(Some).collect(),
        None => (0..n.div_ceil(CHUNK)).map(|_| None).collect(),
    }
}

pub(super) fn sgd(p: &mut [f32], g: &CpuStorage, goff: usize, buf: Option<&mut [f32]>, c: &SgdCoefs) {
    let n = p.len();
    match g {
        CpuStorage::F32(g) => sgd_typed(p, &g[goff..goff + n], buf, c),
        CpuStorage::BF16(g) => sgd_typed(p, &g[goff..goff + n], buf, c),
        CpuStorage::F16(g) => sgd_typed(p, &g[goff..goff + n], buf, c),
        other => unreachable!("sgd_step_: gradient dtype {} was checked", other.dtype()),
    }
}

fn sgd_typed<G: FloatElement>(p: &mut [f32], g: &[G], buf: Option<&mut [f32]>, c: &SgdCoefs) {
    let n = p.len();
    let jobs: Vec<_> = p.chunks_mut(CHUNK).zip(g.chunks(CHUNK)).zip(opt_chunks(buf, n)).collect();
    for_chunks(jobs, |((p, g), b)| sgd_chunk(p, g, b, c));
}

#[inline]
fn sgd_chunk<G: FloatElement>(p: &mut [f32], g: &[G], buf: Option<&mut [f32]>, c: &SgdCoefs) {
    let load = |i: usize, p: &[f32]| {
        let g = g[i].to_f32();
        let g = if c.maximize { -g } else { g };
        if c.weight_decay != 0.0 {
            g + c.weight_decay * p[i]
        } else {
            g
        }
    };
    match buf {
        None => {
            for i in 0..p.len() {
                let d = load(i, p);
                p[i] -= c.lr * d;
            }
        }
        Some(b) => {
            for i in 0..p.len() {
                let d = load(i, p);
                b[i] = if c.first { d } else { c.momentum * b[i] + c.keep * d };
                let d = if c.nesterov { d + c.momentum * b[i] } else { b[i] };
                p[i] -= c.lr * d;
            }
        }
    }
}

pub(super) fn adamw(
    p: &mut [f32],
    g: &CpuStorage,
    goff: usize,
    m: &mut [f32],
    v: &mut [f32],
    vmax: Option<&mut [f32]>,
    c: &AdamWCoefs,
) {
    let n = p.len();
    match g {
        CpuStorage::F32(g) => adamw_typed(p, &g[goff..goff + n], m, v, vmax, c),
        CpuStorage::BF16(g) => adamw_typed(p, &g[goff..goff + n], m, v, vmax, c),
        CpuStorage::F16(g) => adamw_typed(p, &g[goff..goff + n], m, v, vmax, c),
        other => unreachable!("adamw_step_: gradient dtype {} was checked", other.dtype()),
    }
}

fn adamw_typed<G: FloatElement>(
    p: &mut [f32],
    g: &[G],
    m: &mut [f32],
    v: &mut [f32],
    vmax: Option<&mut [f32]>,
    c: &AdamWCoefs,
) {
    let n = p.len();
    let jobs: Vec<_> = p
        .chunks_mut(CHUNK)
        .zip(g.chunks(CHUNK))
        .zip(m.chunks_mut(CHUNK))
        .zip(v.chunks_mut(CHUNK))
        .zip(opt_chunks(vmax, n))
        .collect();
    for_chunks(jobs, |((((p, g), m), v), vm)| adamw_chunk(p, g, m, v, vm, c));
}

#[inline]
fn adamw_chunk<G: FloatElement>(
    p: &mut [f32],
    g: &[G],
    m: &mut [f32],
    v: &mut [f32],
    mut vmax: Option<&mut [f32]>,
    c: &AdamWCoefs,
) {
    let (one_b1, one_b2) = (c.one_minus_beta1, c.one_minus_beta2);
    for i in 0..p.len() {
        let gi = g[i].to_f32();
        let gi = if c.maximize { -gi } else { gi };
        let pi = p[i] * c.decay;
        // torch's lerp for weights below 0.5: m + w * (g - m).
        let mi = m[i] + one_b1 * (gi - m[i]);
        let vi = v[i] * c.beta2 + one_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let second = match vmax.as_deref_mut() {
            Some(vm) => {
                // NaN propagates as in torch.maximum.
                let x = if vi.is_nan() || vi > vm[i] { vi } else { vm[i] };
                vm[i] = x;
                x
            }
            None => vi,
        };
        let denom = second.sqrt() / c.bc2_sqrt + c.eps;
        p[i] = pi + (-c.step_size) * (mi / denom);
    }
}
