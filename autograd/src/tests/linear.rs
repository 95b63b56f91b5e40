//! The fused linear ops (`matmul_bias`, `gelu_tanh_mlp`): gradients against finite
//! differences in f64, and values and every gradient against the composed ops (matmul, add,
//! gelu_tanh) on the CPU, in f32 and under bf16 autocast: on CUDA that compares the cuBLASLt
//! epilogues (aligned shapes) and their fallbacks (odd shapes) with an independent path.

use super::{check, randn};
use crate::{autocast, Var};
use oxtrain_tensor::testing::assert_close;
use oxtrain_tensor::{device_test, DType, Device, Tensor};

device_test! {
    fn matmul_bias_gradients(dev: Device) {
        let f = |v: &[Var]| v[0].matmul_bias(&v[1], &v[2]);
        let r = |shape: &[usize], seed| randn(shape, seed, dev);
        check("2-d", f, &[r(&[3, 4], 1), r(&[4, 5], 2), r(&[5], 3)]);
        check("3-d input", f, &[r(&[2, 3, 4], 4), r(&[4, 5], 5), r(&[5], 6)]);
        check("vector input", f, &[r(&[4], 7), r(&[4, 5], 8), r(&[5], 9)]);
        check("weight stored [out, in]", |v| v[0].matmul_bias(&v[1].t(), &v[2]), &[r(&[2, 3, 4], 10), r(&[5, 4], 11), r(&[5], 12)]);
        check("transposed input", |v| v[0].t().matmul_bias(&v[1], &v[2]), &[r(&[4, 3], 13), r(&[4, 5], 14), r(&[5], 15)]);
        check(
            "column slices of weight and bias",
            |v| v[0].matmul_bias(&v[1].narrow(1, 2, 3), &v[2].narrow(0, 2, 3)),
            &[r(&[3, 4], 16), r(&[4, 7], 17), r(&[7], 18)],
        );
    }
}

device_test! {
    fn gelu_tanh_mlp_gradients(dev: Device) {
        let r = |shape: &[usize], seed| randn(shape, seed, dev);
        check(
            "3-d input",
            |v| v[0].gelu_tanh_mlp(&v[1], &v[2], &v[3], &v[4]),
            &[r(&[2, 3, 4], 1), r(&[4, 6], 2), r(&[6], 3), r(&[6, 5], 4), r(&[5], 5)],
        );
        check(
            "weights stored [out, in]",
            |v| v[0].gelu_tanh_mlp(&v[1].t(), &v[2], &v[3].t(), &v[4]),
            &[r(&[3, 4], 6), r(&[6, 4], 7), r(&[6], 8), r(&[5, 6], 9), r(&[5], 10)],
        );
    }
}

type Op = dyn Fn(&[Var]) -> Var;

/// `f`'s output and the gradients of `sum(f(inputs) * weights)` for every input, on `dev`, in
/// f32 or in the autocast region of `low`; as f64 on the CPU.
fn run(
    f: &Op,
    inputs: &[Tensor],
    weights: &Tensor,
    dev: Device,
    low: Option<DType>,
) -> (Tensor, Vec<Tensor>) {
    let params: Vec<Var> =
        inputs.iter().map(|t| Var::parameter(t.to_dtype(DType::F32).to_device(dev).unwrap())).collect();
    let out = match low {
        Some(d) => autocast(d, || f(&params)),
        None => f(&params),
    };
    out.backward_with(weights.to_device(dev).unwrap().to_dtype(out.dtype()), false);
    let host = |t: &Tensor| t.to_device(Device::Cpu).unwrap().to_dtype(DType::F64);
    (
        host(out.tensor()),
        params.iter().map(|p| host(&p.grad().expect("every input gets a gradient"))).collect(),
    )
}

/// `fused` on `dev` against `composed` on the CPU, in f32 and under bf16 autocast: each value
/// within `rtol` of the reference plus a share of the reference's largest magnitude (the
/// rounding of a sum of many terms scales with the terms, not the result).
fn compare(what: &str, fused: &Op, composed: &Op, inputs: &[Tensor], dev: Device) {
    let probe: Vec<Var> = inputs.iter().map(|t| Var::constant(t.to_dtype(DType::F32))).collect();
    let weights = randn(composed(&probe).dims(), 99, Device::Cpu);
    // f32: cuBLASLt's GELU uses a fast tanh; bf16: 8 bits, rounded once fused and after each
    // op composed.
    for (low, rtol) in [(None, 2e-3), (Some(DType::BF16), 4e-2)] {
        let (got, got_grads) = run(fused, inputs, &weights, dev, low);
        let (want, want_grads) = run(composed, inputs, &weights, Device::Cpu, low);
        let pairs = std::iter::once((&got, &want)).chain(got_grads.iter().zip(&want_grads));
        for (i, (g, w)) in pairs.enumerate() {
            let name = if i == 0 { "output".to_string() } else { format!("gradient of input {}", i - 1) };
            let scale = w.abs().max_all().item();
            assert_close(g, w, rtol, rtol * scale, &format!("{what} ({low:?}): {name}"));
        }
    }
}

device_test! {
    fn matmul_bias_equals_the_composition(dev: Device) {
        let fused = |v: &[Var]| v[0].matmul_bias(&v[1], &v[2]);
        let composed = |v: &[Var]| v[0].matmul(&v[1]).add(&v[2].autocast_lower());
        let r = |shape: &[usize], seed| randn(shape, seed, Device::Cpu);
        compare("aligned", &fused, &composed, &[r(&[2, 24, 32], 1), r(&[32, 48], 2), r(&[48], 3)], dev);
        compare("odd dims", &fused, &composed, &[r(&[3, 5, 7], 4), r(&[7, 9], 5), r(&[9], 6)], dev);
        compare(
            "weight stored [out, in]",
            &|v: &[Var]| v[0].matmul_bias(&v[1].t(), &v[2]),
            &|v: &[Var]| v[0].matmul(&v[1].t()).add(&v[2].autocast_lower()),
            &[r(&[40, 32], 7), r(&[16, 32], 8), r(&[16], 9)],
            dev,
        );
        compare(
            "transposed input",
            &|v: &[Var]| v[0].t().matmul_bias(&v[1], &v[2]),
            &|v: &[Var]| v[0].t().matmul(&v[1]).add(&v[2].autocast_lower()),
            &[r(&[32, 48], 10), r(&[32, 24], 11), r(&[24], 12)],
            dev,
        );
    }
}

device_test! {
    fn gelu_tanh_mlp_equals_the_composition(dev: Device) {
        let fused = |v: &[Var]| v[0].gelu_tanh_mlp(&v[1], &v[2], &v[3], &v[4]);
        // The biases join the products' dtype under autocast, as the fused op (and addmm) has it.
        let composed = |v: &[Var]| {
            let h = v[0].matmul(&v[1]).add(&v[2].autocast_lower()).gelu_tanh();
            h.matmul(&v[3]).add(&v[4].autocast_lower())
        };
        let r = |shape: &[usize], seed| randn(shape, seed, Device::Cpu);
        let mlp = |e: usize, h: usize, n: usize, seed: u64| {
            // Weights scaled as GPT-2 initialises them, so pre-activations cover GELU's bend.
            let w = |shape: &[usize], s| r(shape, s).mul_scalar(0.3);
            [w(&[e, h], seed), r(&[h], seed + 1), w(&[h, n], seed + 2), r(&[n], seed + 3)]
        };
        let [w1, b1, w2, b2] = mlp(32, 64, 32, 10);
        compare("aligned", &fused, &composed, &[r(&[2, 24, 32], 1), w1, b1, w2, b2], dev);
        let [w1, b1, w2, b2] = mlp(5, 7, 3, 20);
        compare("odd dims", &fused, &composed, &[r(&[3, 4, 5], 2), w1, b1, w2, b2], dev);
        let [w1, b1, w2, b2] = mlp(32, 64, 32, 30);
        compare(
            "transposed input",
            &|v: &[Var]| v[0].t().gelu_tanh_mlp(&v[1], &v[2], &v[3], &v[4]),
            &move |v: &[Var]| composed(&[v[0].t(), v[1].clone(), v[2].clone(), v[3].clone(), v[4].clone()]),
            &[r(&[32, 48], 3), w1, b1, w2, b2],
            dev,
        );
    }
}

device_test! {
    fn fused_linear_ops_skip_the_gradients_nobody_needs(dev: Device) {
        // A constant input and a frozen first layer: only the parameters that require grad get
        // one, and they equal the composition's.
        let x = Var::constant(randn(&[4, 6], 1, dev));
        let w1 = Var::constant(randn(&[6, 8], 2, dev));
        let b1 = Var::constant(randn(&[8], 3, dev));
        let (w2, b2) = (Var::parameter(randn(&[8, 5], 4, dev)), Var::parameter(randn(&[5], 5, dev)));
        x.gelu_tanh_mlp(&w1, &b1, &w2, &b2).sum_all().backward();
        let (gw2, gb2) = (w2.grad().unwrap(), b2.grad().unwrap());
        w2.zero_grad();
        b2.zero_grad();
        x.matmul(&w1).add(&b1).gelu_tanh().matmul(&w2).add(&b2).sum_all().backward();
        assert_close(&gw2, &w2.grad().unwrap(), 1e-12, 1e-12, "w_proj's gradient");
        assert_close(&gb2, &b2.grad().unwrap(), 1e-12, 1e-12, "b_proj's gradient");
        // Only the bias of a product requires grad.
        let b = Var::parameter(randn(&[5], 6, dev));
        Var::constant(randn(&[3, 4], 7, dev)).matmul_bias(&Var::constant(randn(&[4, 5], 8, dev)), &b).sum_all().backward();
        assert_close(&b.grad().unwrap(), &Tensor::full([5], 3.0, DType::F64, dev).unwrap(), 1e-12, 1e-12, "bias gradient");
    }
}
