//! The CUDA kernels, both versions, against the CPU loop in f64 on the same low-precision
//! inputs: forward and backward, causal and key-padding masks, head dims 32, 64 and 128, f16 and
//! bf16, lengths that are not multiples of the tiles, L != S, queries that see no key, GPT-2's
//! strided q, k, v; and the second version's gradients the same on every run. Each test needs a
//! CUDA GPU.

use super::cuda::{with_kernels, Kernels};
use super::tests::random;
use super::FlashAttention;
use crate::testing::assert_close;
use crate::{DType, Device, Tensor};

const GPU: Device = Device::Cuda(0);

/// The largest |got - want| over the largest |want| (the error of a low-precision result), with
/// NaNs required at the same places in both. The range is at least 1e-3 (the inputs are of
/// order 1): a gradient that is zero in exact arithmetic (dq with one key: dS = dO.v - dO.out
/// = 0) comes out as rounding noise, which must not count as an error of 10^20.
fn error_in_range(got: &Tensor, want: &Tensor, what: &str) -> f64 {
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(a.len(), b.len(), "{what}: sizes differ");
    let (mut err, mut range) = (0.0f64, 1e-3f64);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.is_nan(), y.is_nan(), "{what}: element {i} is {x}, the reference {y}");
        if !y.is_nan() {
            err = err.max((x - y).abs());
            range = range.max(y.abs());
        }
    }
    err / range
}

/// `[q, k, v, dout]` of one case as they reach the op.
type Operands = [Tensor; 4];

/// `(B, H, L, S, D)`.
type Dims = (usize, usize, usize, usize, usize);

/// One case: `make` builds the operands on a device from `base` moved there (so views stay
/// views), with the masks of `causal` and `lens`.
struct Case<'a> {
    what: String,
    base: Vec<Tensor>,
    make: &'a dyn Fn(&[Tensor]) -> Operands,
    causal: bool,
    lens: Option<Vec<i64>>,
}

impl Case<'_> {
    fn opts(&self, dev: Device) -> FlashAttention {
        let lens = self.lens.as_ref().map(|l| Tensor::from_vec(l.clone(), [l.len()], dev).unwrap());
        FlashAttention { causal: self.causal, key_lengths: lens, scale: None }
    }

    /// Forward and backward of both kernel versions on the GPU against the CPU loop.
    fn check(&self) {
        let [q, k, v, g] = (self.make)(&self.base);
        let cpu = self.opts(Device::Cpu);
        let (out, lse) = q.flash_attention(&k, &v, &cpu);
        let (dq, dk, dv) = g.flash_attention_backward((&q, &k, &v), (&out, &lse), &cpu);
        let moved: Vec<Tensor> = self.base.iter().map(|t| t.to_device(GPU).unwrap()).collect();
        let [gq, gk, gv, gg] = (self.make)(&moved);
        let on_gpu = self.opts(GPU);
        for kernels in [Kernels::V1, Kernels::V2] {
            let what = format!("{kernels:?} {}", self.what);
            let ((gout, glse), (gdq, gdk, gdv)) = with_kernels(kernels, || {
                let (o, l) = gq.flash_attention(&gk, &gv, &on_gpu);
                let grads = gg.flash_attention_backward((&gq, &gk, &gv), (&o, &l), &on_gpu);
                ((o, l), grads)
            });
            assert_eq!(gout.dtype(), q.dtype(), "{what}");
            let err = error_in_range(&gout, &out, &format!("{what}: out"));
            assert!(err < 1e-2, "{what}: out off by {err:.2e} of its range");
            assert_close(&glse.to_device(Device::Cpu).unwrap(), &lse, 1e-3, 1e-3, &format!("{what}: lse"));
            for (name, got, want) in [("dq", gdq, &dq), ("dk", gdk, &dk), ("dv", gdv, &dv)] {
                assert_eq!(got.dims(), want.dims(), "{what}: {name}");
                let err = error_in_range(&got, want, &format!("{what}: {name}"));
                assert!(err < 2e-2, "{what}: {name} off by {err:.2e} of its range");
            }
        }
    }
}

/// Contiguous `[B, H, T, D]` operands, rounded to `dtype` first so both sides start from the
/// same values.
fn plain_case(
    dtype: DType,
    (b, h, l, s, d): (usize, usize, usize, usize, usize),
    causal: bool,
) -> Case<'static> {
    let r = |shape: &[usize], seed| random(shape, seed, 1.0, Device::Cpu).to_dtype(dtype);
    Case {
        what: format!("{dtype} B{b} H{h} L{l} S{s} D{d} causal {causal}"),
        base: vec![r(&[b, h, l, d], 11), r(&[b, h, s, d], 12), r(&[b, h, s, d], 13), r(&[b, h, l, d], 14)],
        make: &|t| [t[0].clone(), t[1].clone(), t[2].clone(), t[3].clone()],
        causal,
        lens: None,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_kernels_match_the_cpu_loop() {
    for dtype in [DType::BF16, DType::F16] {
        for &(b, h, l, s, d) in
            &[(2, 3, 100, 130, 64), (1, 2, 64, 64, 32), (2, 1, 77, 50, 128), (1, 4, 200, 200, 64)]
        {
            for causal in [false, true] {
                for padded in [false, true] {
                    let mut case = plain_case(dtype, (b, h, l, s, d), causal);
                    if padded {
                        case.lens = Some((0..b).map(|i| (s - 17 * i - 9) as i64).collect());
                        case.what += " padded";
                    }
                    case.check();
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_kernels_match_the_cpu_loop_at_awkward_lengths() {
    use DType::{BF16, F16};
    let cases: [(DType, Dims, bool, Option<&[i64]>); 13] = [
        (BF16, (1, 1, 1, 1, 64), true, None),
        (BF16, (2, 1, 1, 130, 64), false, Some(&[130, 7])),
        (F16, (1, 2, 63, 63, 64), true, None),
        (BF16, (1, 2, 65, 65, 32), true, None),
        (BF16, (1, 1, 127, 129, 128), false, Some(&[100])),
        (F16, (1, 1, 129, 127, 128), true, None),
        (BF16, (1, 1, 1000, 1000, 64), true, None),
        (F16, (1, 1, 1000, 1000, 32), false, Some(&[999])),
        (BF16, (1, 2, 65, 200, 64), true, None),
        (BF16, (1, 2, 300, 70, 64), true, Some(&[50])),
        (F16, (2, 1, 300, 70, 128), false, Some(&[64, 1])),
        (BF16, (1, 1, 256, 256, 64), true, None),
        // Batch row 0 sees no key: NaN out and -inf lse there, zero gradients.
        (BF16, (2, 2, 70, 90, 64), true, Some(&[0, 90])),
    ];
    for (dtype, dims, causal, lens) in cases {
        let mut case = plain_case(dtype, dims, causal);
        if let Some(lens) = lens {
            case.lens = Some(lens.to_vec());
            case.what += &format!(" key lengths {lens:?}");
        }
        case.check();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_kernels_take_gpt2_strided_views() {
    // q, k, v as views of one [B, T, 3, H, D] projection, dout as a view of [B, T, H, D], as
    // GPT-2's attention passes them; forward and backward.
    let split = |t: &[Tensor]| -> Operands {
        let part = |i: usize| t[0].narrow(2, i, 1).squeeze(2).permute([0, 2, 1, 3]);
        [part(0), part(1), part(2), t[1].permute([0, 2, 1, 3])]
    };
    for &(b, t, h) in &[(2, 70, 4), (1, 1024, 2)] {
        let base = vec![
            random(&[b, t, 3, h, 64], 21, 1.0, Device::Cpu).to_dtype(DType::BF16),
            random(&[b, t, h, 64], 22, 1.0, Device::Cpu).to_dtype(DType::BF16),
        ];
        let case = Case {
            what: format!("GPT-2 views B{b} T{t} H{h}"),
            base,
            make: &split,
            causal: true,
            lens: None,
        };
        case.check();
    }
    // The output is a view of [B, L, H, D] memory: merging the heads copies nothing.
    let qkv = random(&[2, 70, 3, 4, 64], 23, 1.0, GPU).to_dtype(DType::BF16);
    let unused_dout = Tensor::zeros([2, 70, 4, 64], DType::BF16, GPU).unwrap();
    let [q, k, v, _] = split(&[qkv, unused_dout]);
    let (out, _) = q.flash_attention(&k, &v, &FlashAttention { causal: true, ..Default::default() });
    assert!(out.transpose(1, 2).is_contiguous());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_v2_gives_the_same_bits_on_every_run() {
    let case = plain_case(DType::BF16, (2, 3, 333, 333, 64), true);
    let t: Vec<Tensor> = case.base.iter().map(|t| t.to_device(GPU).unwrap()).collect();
    let opts = case.opts(GPU);
    let run = || {
        with_kernels(Kernels::V2, || {
            let (out, lse) = t[0].flash_attention(&t[1], &t[2], &opts);
            let (dq, dk, dv) = t[3].flash_attention_backward((&t[0], &t[1], &t[2]), (&out, &lse), &opts);
            [out, lse, dq, dk, dv].map(|x| x.to_f64_vec())
        })
    };
    let first = run();
    for _ in 0..3 {
        assert!(run() == first, "a second run of the same inputs gave other bits");
    }
}
