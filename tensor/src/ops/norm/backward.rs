//! Batch norm's backward in training mode on the CPU, fused: one pass over `dy` and `x` for
//! the per-channel sums of `dy` and `dy * (x - mean)` together (in f64, each (sample, channel)
//! plane summed in [`LANES`] lanes on its own and the planes added in a fixed order, so the
//! result is as close to f64 as the data allows and the same on every thread count), then one
//! elementwise pass for the input gradient. The composed version took five allocating passes
//! and recomputed `x_hat` as a tensor.
//!
//! When a ReLU followed batch norm, its mask (`y > 0` on its output `y`) is applied to `dy` as
//! each element is read, instead of a separate pass writing the masked gradient; when that
//! masked gradient is wanted too (the residual's gradient of a ResNet block), the sums' pass
//! writes it and the input-gradient pass reads it.

use super::cpu::Channels;
use super::planes::{per_plane, split, LANES};
use crate::dtype::Element;
use crate::ops::unary::cpu::{ComputeAs, Special};
use crate::storage::Storage;
use crate::strided::filled;
use crate::Tensor;
use std::mem::MaybeUninit;

/// The output gradient as batch norm's backward reads it: `dy`, masked by ReLU's output `y`
/// (`dy` where `y > 0`, else 0) when there is one.
#[derive(Clone, Copy)]
pub(super) struct Grad<'a, T> {
    pub dy: &'a [T],
    pub relu_out: Option<&'a [T]>,
}

/// `(sum g, sum g * (x - m))` over one plane piece, in f64 lanes; `g` masked per `mask` and,
/// when `keep` is given, written there.
#[inline(always)]
fn piece_sums<T: ComputeAs>(
    dy: &[T],
    mask: Option<&[T]>,
    x: &[T],
    m: f64,
    keep: Option<&mut [MaybeUninit<T>]>,
) -> (f64, f64) {
    let zero = T::down(T::C::of(0.0));
    let (mut s, mut sx) = ([0.0f64; LANES], [0.0f64; LANES]);
    let mut add = |j: usize, g: T, v: T| {
        let g = g.to_f64();
        s[j] += g;
        sx[j] += g * (v.to_f64() - m);
    };
    let masked = |g: T, y: T| if y.up() > T::C::of(0.0) { g } else { zero };
    match (mask, keep) {
        (None, None) => {
            for (g, v) in dy.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
                for j in 0..LANES {
                    add(j, g[j], v[j]);
                }
            }
            let done = dy.len() / LANES * LANES;
            for (j, (&g, &v)) in dy[done..].iter().zip(&x[done..]).enumerate() {
                add(j, g, v);
            }
        }
        (Some(y), None) => {
            let it = dy.chunks_exact(LANES).zip(y.chunks_exact(LANES)).zip(x.chunks_exact(LANES));
            for ((g, y), v) in it {
                for j in 0..LANES {
                    add(j, masked(g[j], y[j]), v[j]);
                }
            }
            let done = dy.len() / LANES * LANES;
            for (j, ((&g, &y), &v)) in dy[done..].iter().zip(&y[done..]).zip(&x[done..]).enumerate() {
                add(j, masked(g, y), v);
            }
        }
        (mask, Some(out)) => {
            let y = mask.unwrap_or(dy);
            let it = out.chunks_exact_mut(LANES).zip(dy.chunks_exact(LANES)).zip(y.chunks_exact(LANES));
            for (((o, g), y), v) in it.zip(x.chunks_exact(LANES)) {
                for j in 0..LANES {
                    let g = if mask.is_some() { masked(g[j], y[j]) } else { g[j] };
                    o[j].write(g);
                    add(j, g, v[j]);
                }
            }
            let done = dy.len() / LANES * LANES;
            let rest = out[done..].iter_mut().zip(&dy[done..]).zip(&y[done..]).zip(&x[done..]);
            for (j, (((o, &g), &y), &v)) in rest.enumerate() {
                let g = if mask.is_some() { masked(g, y) } else { g };
                o.write(g);
                add(j, g, v);
            }
        }
    }
    (s.iter().sum(), sx.iter().sum())
}

/// Per-channel `(sum g, sum g * (x - mean))` of contiguous `[outer, C, spatial]` data, `g` the
/// (masked) output gradient; plus that masked gradient itself when `keep_masked`.
pub(super) fn channel_grad_sums<T: ComputeAs>(
    grad: Grad<'_, T>,
    x: &[T],
    ch: Channels,
    mean: &[f64],
    keep_masked: bool,
) -> (Vec<f64>, Vec<f64>, Option<Vec<T>>) {
    let (channels, spatial) = (ch.channels, ch.spatial.max(1));
    let planes = x.len() / spatial;
    let plane = |p: usize| {
        let r = p * spatial..(p + 1) * spatial;
        let mask = grad.relu_out.map(|y| &y[r.clone()]);
        piece_sums(&grad.dy[r.clone()], mask, &x[r], mean[p % channels], None)
    };
    let (sums, masked) = if keep_masked {
        // Each plane's sums come with its piece of the masked gradient, written in place.
        let mut kept: Vec<T> = Vec::with_capacity(x.len());
        let spare = kept.spare_capacity_mut();
        let pieces: Vec<(usize, &mut [MaybeUninit<T>])> =
            spare[..x.len()].chunks_mut(spatial).enumerate().collect();
        let sums = super::planes::per_plane_mut(pieces, spatial, |(p, out)| {
            let r = p * spatial..(p + 1) * spatial;
            let mask = grad.relu_out.map(|y| &y[r.clone()]);
            piece_sums(&grad.dy[r.clone()], mask, &x[r], mean[p % channels], Some(out))
        });
        // SAFETY: the capacity is x.len(), and the planes (which cover it, planes * spatial =
        // x.len()) each wrote every element of their piece.
        unsafe { kept.set_len(x.len()) };
        (sums, Some(kept))
    } else {
        (per_plane(planes, spatial, plane), None)
    };
    let (mut sum_dy, mut sum_dyx) = (vec![0.0; channels], vec![0.0; channels]);
    for (p, (s, sx)) in sums.into_iter().enumerate() {
        sum_dy[p % channels] += s;
        sum_dyx[p % channels] += sx;
    }
    (sum_dy, sum_dyx, masked)
}

/// `dx = scale[c] * (g - shift[c] - (x - mean[c]) * k[c])` over contiguous `[outer, C,
/// spatial]` data, `g` the (masked) output gradient, in the dtype's compute precision.
pub(super) fn input_grad<T: ComputeAs>(
    grad: Grad<'_, T>,
    x: &[T],
    ch: Channels,
    (mean, scale, shift, k): (&[f64], &[f64], &[f64], &[f64]),
) -> Vec<T> {
    let spatial = ch.spatial.max(1);
    let c = |v: &[f64]| v.iter().map(|&x| T::C::of(x)).collect::<Vec<_>>();
    let means: Vec<(T::C, T::C)> = mean.iter().map(|&m| split(m)).collect();
    let (scale, shift, k) = (c(scale), c(shift), c(k));
    let zero = T::C::of(0.0);
    filled(x.len(), |start, out| {
        // Chunks may start inside a plane: walk plane pieces.
        let mut i = 0;
        while i < out.len() {
            let at = start + i;
            let channel = (at / spatial) % ch.channels;
            let take = (spatial - at % spatial).min(out.len() - i);
            let ((hi, lo), a, b, kk) = (means[channel], scale[channel], shift[channel], k[channel]);
            let f = |g: T::C, v: T| T::down(a * (g - b - ((v.up() - hi) - lo) * kk));
            let (o, dy, xs) = (&mut out[i..i + take], &grad.dy[at..at + take], &x[at..at + take]);
            match grad.relu_out {
                None => {
                    for ((o, &g), &v) in o.iter_mut().zip(dy).zip(xs) {
                        o.write(f(g.up(), v));
                    }
                }
                Some(y) => {
                    for (((o, &g), &y), &v) in o.iter_mut().zip(dy).zip(&y[at..at + take]).zip(xs) {
                        o.write(f(if y.up() > zero { g.up() } else { zero }, v));
                    }
                }
            }
            i += take;
        }
    })
}

/// Batch norm's statistics and weight on the host, in f64.
pub(super) struct HostStats {
    pub mean: Vec<f64>,
    pub var: Vec<f64>,
    pub weight: Option<Vec<f64>>,
    pub eps: f64,
}

/// The CPU side of `batch_norm_backward` and `batch_norm_relu_backward`: `(dx, dweight,
/// dbias, masked)` for the output gradient `dy` (masked by `relu_out > 0` when given).
pub(super) fn cpu_backward(
    dy: &Tensor,
    relu_out: Option<&Tensor>,
    x: &Tensor,
    ch: Channels,
    st: &HostStats,
    (want_dx, keep_masked): (bool, bool),
) -> (Option<Tensor>, Tensor, Tensor, Option<Tensor>) {
    let op = "batch_norm_backward";
    let (dy, xc, y) = (dy.contiguous(), x.contiguous(), relu_out.map(Tensor::contiguous));
    let (dy_s, x_s, y_s) = (dy.storage(), xc.storage(), y.as_ref().map(|y| y.storage()));
    let (Storage::Cpu(g), Storage::Cpu(v)) = (&*dy_s, &*x_s) else {
        unreachable!("{op}: checked on the CPU")
    };
    let y_cpu = y_s.as_deref().map(|s| match s {
        Storage::Cpu(s) => s,
        Storage::Cuda(_) => unreachable!("{op}: checked on the CPU"),
    });
    let count = (x.elem_count() / ch.channels.max(1)).max(1) as f64;
    let rstd: Vec<f64> = st.var.iter().map(|v| 1.0 / (v + st.eps).sqrt()).collect();
    let w = |c: usize| st.weight.as_ref().map_or(1.0, |w| w[c]);
    let (sum_dy, sum_dyx, dx, masked) = with_float_storage!(g, op, gv, T => {
        let grad = Grad { dy: gv, relu_out: y_cpu.map(|y| y.as_slice::<T>()) };
        let xv = v.as_slice::<T>();
        let (sum_dy, sum_dyx, masked) = channel_grad_sums(grad, xv, ch, &st.mean, keep_masked);
        let dx = want_dx.then(|| {
            let scale: Vec<f64> = (0..ch.channels).map(|c| w(c) * rstd[c]).collect();
            let shift: Vec<f64> = sum_dy.iter().map(|s| s / count).collect();
            let k: Vec<f64> = (0..ch.channels).map(|c| sum_dyx[c] / count * rstd[c] * rstd[c]).collect();
            // The kept masked gradient is read instead of masking again.
            let grad = match &masked {
                Some(m) => Grad { dy: m.as_slice(), relu_out: None },
                None => grad,
            };
            T::into_storage(input_grad(grad, xv, ch, (&st.mean, &scale, &shift, &k)))
        });
        (sum_dy, sum_dyx, dx, masked.map(T::into_storage))
    });
    let as_tensor = |s| Tensor::from_cpu(s, x.dims());
    let dweight: Vec<f64> = (0..ch.channels).map(|c| sum_dyx[c] * rstd[c]).collect();
    let per_channel = |v: Vec<f64>| Tensor::from_cpu(f64::into_storage(v), [ch.channels]).to_dtype(x.dtype());
    (dx.map(as_tensor), per_channel(dweight), per_channel(sum_dy), masked.map(as_tensor))
}
