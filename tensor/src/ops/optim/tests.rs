//! Fused optimizer steps against the same formulas written in f64, over several steps, with
//! every option, reduced-precision gradients, offset views and a parameter large enough to be
//! split across threads.

use crate::{device_test, AdamWStep, DType, Device, Distribution, Generator, SgdStep, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Fresh normal values from a generator of their own: the default generator is left to the
/// tests that check its seeding, which other tests drawing from it meanwhile would disturb.
fn randn(n: usize, dev: Device) -> Tensor {
    static SEED: AtomicU64 = AtomicU64::new(7);
    let mut gen = Generator::new(SEED.fetch_add(1, Ordering::Relaxed));
    Distribution::STANDARD_NORMAL
        .sample_with(&mut gen, n, DType::F32, Device::Cpu)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

fn check(got: &Tensor, want: &[f64], what: &str) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs() + 1e-6, "{what}: element {i} is {g}, expected {w}");
    }
}

/// SGD in f64 on the f32-rounded inputs, as torch.optim.SGD documents it.
fn sgd_ref(p: &mut [f64], g: &[f64], buf: &mut [f64], first: bool, c: &SgdStep) {
    for i in 0..p.len() {
        let mut d = if c.maximize { -g[i] } else { g[i] };
        d += c.weight_decay * p[i];
        if c.momentum != 0.0 {
            buf[i] = if first { d } else { c.momentum * buf[i] + (1.0 - c.dampening) * d };
            d = if c.nesterov { d + c.momentum * buf[i] } else { buf[i] };
        }
        p[i] -= c.lr * d;
    }
}

fn run_sgd(dev: Device, n: usize, grad_dtype: DType, c: SgdStep) {
    let p = randn(n, dev);
    let buf = Tensor::zeros(n, DType::F32, dev).unwrap();
    let (mut rp, mut rb) = (f64s(&p), vec![0.0; n]);
    for step in 0..4 {
        let g = randn(n, dev).to_dtype(grad_dtype);
        sgd_ref(&mut rp, &f64s(&g), &mut rb, step == 0, &c);
        p.sgd_step_(&g, Some(&buf), step == 0, &c);
        check(&p, &rp, &format!("sgd param after step {step}"));
        if c.momentum != 0.0 {
            check(&buf, &rb, &format!("sgd momentum buffer after step {step}"));
        }
    }
}

const SGD: SgdStep =
    SgdStep { lr: 0.1, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0, maximize: false };

device_test! {
    fn sgd_plain_matches_the_f64_formula(dev: Device) {
        run_sgd(dev, 37, DType::F32, SGD);
    }
}

device_test! {
    fn sgd_momentum_dampening_weight_decay_match(dev: Device) {
        run_sgd(dev, 37, DType::F32, SgdStep { momentum: 0.9, dampening: 0.1, weight_decay: 1e-2, ..SGD });
    }
}

device_test! {
    fn sgd_nesterov_maximize_with_bf16_and_f16_grads_match(dev: Device) {
        let c = SgdStep { momentum: 0.8, nesterov: true, maximize: true, weight_decay: 5e-3, ..SGD };
        run_sgd(dev, 37, DType::BF16, c);
        run_sgd(dev, 37, DType::F16, c);
    }
}

device_test! {
    fn sgd_on_a_large_parameter_split_across_threads_matches(dev: Device) {
        run_sgd(dev, 100_003, DType::F32, SgdStep { momentum: 0.9, ..SGD });
    }
}

/// AdamW in f64, as torch.optim.AdamW documents it.
#[allow(clippy::too_many_arguments)]
fn adamw_ref(
    p: &mut [f64],
    g: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    vmax: Option<&mut [f64]>,
    c: &AdamWStep,
) {
    let t = c.step as f64;
    let (bc1, bc2) = (1.0 - c.beta1.powf(t), 1.0 - c.beta2.powf(t));
    let mut vmax = vmax;
    for i in 0..p.len() {
        let gi = if c.maximize { -g[i] } else { g[i] };
        p[i] *= 1.0 - c.lr * c.weight_decay;
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
        let second = match vmax.as_deref_mut() {
            Some(vm) => {
                vm[i] = vm[i].max(v[i]);
                vm[i]
            }
            None => v[i],
        };
        p[i] -= c.lr / bc1 * m[i] / (second.sqrt() / bc2.sqrt() + c.eps);
    }
}

fn run_adamw(dev: Device, p: &Tensor, grad_dtype: DType, amsgrad: bool, base: AdamWStep) {
    let n = p.elem_count();
    let zeros = || Tensor::zeros(p.dims(), DType::F32, dev).unwrap();
    let (m, v, vm) = (zeros(), zeros(), zeros());
    let (mut rp, mut rm, mut rv, mut rvm) = (f64s(p), vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for step in 1..=5u64 {
        let c = AdamWStep { step, ..base };
        // Gradients of very different sizes per step so AMSGrad's max matters.
        let g = randn(n, dev)
            .mul_scalar(if step % 2 == 0 { 0.1 } else { 3.0 })
            .reshape(p.dims())
            .to_dtype(grad_dtype);
        adamw_ref(&mut rp, &f64s(&g), &mut rm, &mut rv, amsgrad.then_some(&mut rvm[..]), &c);
        p.adamw_step_(&g, &m, &v, amsgrad.then_some(&vm), &c);
        check(p, &rp, &format!("adamw param after step {step}"));
        check(&m, &rm, "exp_avg");
        check(&v, &rv, "exp_avg_sq");
        if amsgrad {
            check(&vm, &rvm, "max_exp_avg_sq");
        }
    }
}

const ADAMW: AdamWStep =
    AdamWStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 1, maximize: false };

device_test! {
    fn adamw_matches_the_f64_formula(dev: Device) {
        run_adamw(dev, &randn(37, dev), DType::F32, false, ADAMW);
    }
}

device_test! {
    fn adamw_amsgrad_maximize_with_half_grads_matches(dev: Device) {
        let c = AdamWStep { maximize: true, beta1: 0.8, beta2: 0.95, eps: 1e-6, ..ADAMW };
        run_adamw(dev, &randn(37, dev), DType::F32, true, c);
        run_adamw(dev, &randn(37, dev), DType::BF16, true, c);
        run_adamw(dev, &randn(37, dev), DType::F16, false, c);
    }
}

device_test! {
    fn adamw_on_an_offset_view_updates_only_that_view(dev: Device) {
        let whole = randn(3 * 50, dev).reshape((3, 50));
        let before = whole.to_vec2::<f32>();
        let row = whole.narrow(0, 1, 1);
        run_adamw(dev, &row, DType::F32, false, ADAMW);
        let after = whole.to_vec2::<f32>();
        assert_eq!(after[0], before[0], "row 0 untouched");
        assert_eq!(after[2], before[2], "row 2 untouched");
        assert_ne!(after[1], before[1], "row 1 stepped");
    }
}

device_test! {
    fn adamw_on_a_large_parameter_split_across_threads_matches(dev: Device) {
        run_adamw(dev, &randn(70_001, dev), DType::F32, true, ADAMW);
    }
}

#[test]
#[should_panic(expected = "adamw_step_: param must be f32")]
fn adamw_rejects_a_bf16_parameter() {
    let p = Tensor::zeros(4, DType::BF16, Device::Cpu).unwrap();
    let z = Tensor::zeros(4, DType::F32, Device::Cpu).unwrap();
    p.adamw_step_(&z, &z.copy(), &z.copy(), None, &ADAMW);
}

#[test]
#[should_panic(expected = "sgd_step_: gradient of shape [3] for a parameter of shape [4]")]
fn sgd_rejects_a_gradient_of_another_shape() {
    let p = Tensor::zeros(4, DType::F32, Device::Cpu).unwrap();
    let g = Tensor::zeros(3, DType::F32, Device::Cpu).unwrap();
    p.sgd_step_(&g, None, true, &SGD);
}
