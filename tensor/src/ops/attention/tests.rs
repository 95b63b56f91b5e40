//! Fused attention: the CPU loop against attention composed of matmul and softmax (forward) and
//! against finite differences (backward), all in f64. The CUDA kernels are checked against the
//! CPU loop in `cuda_tests.rs`.

use super::FlashAttention;
use crate::testing::assert_close;
use crate::{DType, Device, Tensor};

/// Pseudo-random values uniform in [-spread, spread) (a fixed LCG).
pub(super) fn random(shape: &[usize], seed: u64, spread: f64, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            spread * (((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0)
        })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap()
}

/// softmax(q k^T * scale + mask) v from matmul and softmax, the mask built as a dense tensor.
fn composed(q: &Tensor, k: &Tensor, v: &Tensor, opts: &FlashAttention) -> Tensor {
    let (b, l, s, d) = (q.dims()[0], q.dims()[2], k.dims()[2], q.dims()[3]);
    let scale = opts.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let lens = opts.key_lengths.as_ref().map(|t| t.to_vec::<i64>());
    let mask: Vec<f64> = (0..b * l * s)
        .map(|at| {
            let (bi, i, j) = (at / (l * s), (at / s) % l, at % s);
            let padded = lens.as_ref().is_some_and(|lens| j as i64 >= lens[bi]);
            if padded || (opts.causal && j > i) {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, [b, 1, l, s], Device::Cpu).unwrap();
    q.matmul(&k.transpose(-2, -1)).mul_scalar(scale).add(&mask).softmax(-1).matmul(v)
}

#[test]
fn the_cpu_loop_matches_composed_attention() {
    let dev = Device::Cpu;
    let (q, k, v) = (
        random(&[2, 3, 5, 4], 1, 1.5, dev),
        random(&[2, 3, 7, 4], 2, 1.5, dev),
        random(&[2, 3, 7, 4], 3, 1.0, dev),
    );
    let lens = Tensor::from_vec(vec![7i64, 3], [2], dev).unwrap();
    let cases = [
        FlashAttention::default(),
        FlashAttention { causal: true, ..Default::default() },
        FlashAttention { key_lengths: Some(lens.clone()), scale: Some(0.3), ..Default::default() },
        FlashAttention { causal: true, key_lengths: Some(lens), scale: None },
    ];
    for (n, opts) in cases.iter().enumerate() {
        let (out, lse) = q.flash_attention(&k, &v, opts);
        assert_close(&out, &composed(&q, &k, &v, opts), 1e-12, 1e-12, &format!("case {n}: out"));
        assert_eq!((lse.dims(), lse.dtype()), (&[2, 3, 5][..], DType::F32));
    }
    // A query that sees no key: NaN, as PyTorch.
    let none = Tensor::from_vec(vec![0i64, 7], [2], dev).unwrap();
    let (out, lse) =
        q.flash_attention(&k, &v, &FlashAttention { key_lengths: Some(none), ..Default::default() });
    assert!(
        out.to_f64_vec()[..60].iter().all(|x| x.is_nan())
            && out.to_f64_vec()[60..].iter().all(|x| x.is_finite())
    );
    assert!(lse.to_f64_vec()[0] == f64::NEG_INFINITY);
}

#[test]
fn the_cpu_backward_matches_finite_differences() {
    let dev = Device::Cpu;
    let (q, k, v) = (
        random(&[1, 2, 5, 4], 4, 1.0, dev),
        random(&[1, 2, 6, 4], 5, 1.0, dev),
        random(&[1, 2, 6, 4], 6, 1.0, dev),
    );
    let w = random(&[1, 2, 5, 4], 7, 1.0, dev);
    let lens = Tensor::from_vec(vec![5i64], [1], dev).unwrap();
    for opts in [
        FlashAttention { causal: true, ..Default::default() },
        FlashAttention { key_lengths: Some(lens), ..Default::default() },
    ] {
        let loss =
            |q: &Tensor, k: &Tensor, v: &Tensor| q.flash_attention(k, v, &opts).0.mul(&w).sum_all().item();
        let (out, lse) = q.flash_attention(&k, &v, &opts);
        let (dq, dk, dv) = w.flash_attention_backward((&q, &k, &v), (&out, &lse), &opts);
        for (name, which, grad) in [("dq", 0, dq), ("dk", 1, dk), ("dv", 2, dv)] {
            let base = [&q, &k, &v][which].to_f64_vec();
            let dims = [&q, &k, &v][which].dims().to_vec();
            let numeric: Vec<f64> = (0..base.len())
                .map(|i| {
                    let at = |delta: f64| {
                        let mut p = base.clone();
                        p[i] += delta;
                        let p = Tensor::from_vec(p, dims.as_slice(), dev).unwrap();
                        let mut t = [q.clone(), k.clone(), v.clone()];
                        t[which] = p;
                        loss(&t[0], &t[1], &t[2])
                    };
                    let h = 1e-6;
                    (at(h) - at(-h)) / (2.0 * h)
                })
                .collect();
            let numeric = Tensor::from_vec(numeric, dims.as_slice(), dev).unwrap();
            // lse travels in f32, so the probabilities of the backward carry ~1e-7 relative error.
            assert_close(&grad, &numeric, 1e-5, 1e-6, &format!("{name} (causal {})", opts.causal));
        }
    }
}
