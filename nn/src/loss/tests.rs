//! Every loss's value and input gradient against PyTorch (fixtures.py), on each device.

use super::*;
use oxtrain_autograd::Var;
use oxtrain_tensor::testing::{assert_close, tolerance, Fixtures};
use oxtrain_tensor::{device_test, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "nn/src/loss/fixtures.json")
}

fn reduction(f: &Fixtures, case: &str) -> Reduction {
    match f.scalar(case, "reduction") as i64 {
        0 => Reduction::Mean,
        1 => Reduction::Sum,
        _ => Reduction::None,
    }
}

/// Backward with the fixture's output gradient, then compares loss and input gradient.
fn check(f: &Fixtures, case: &str, x: &Var, loss: &Var, dev: Device) {
    let (rtol, atol) = tolerance(x.dtype());
    assert_eq!(loss.dtype(), x.dtype(), "{case}: the loss has the input's dtype");
    let expected = f.tensor(case, "loss", dev);
    assert_close(&loss.tensor().to_dtype(expected.dtype()), &expected, rtol, atol, &format!("{case}: loss"));
    loss.backward_with(f.tensor(case, "grad_out", dev).to_dtype(loss.dtype()), false);
    let grad = x.grad().expect("the input gets a gradient");
    assert_eq!(grad.dtype(), x.dtype(), "{case}: the gradient has the input's dtype");
    let expected = f.tensor(case, "grad", dev);
    assert_close(&grad.to_dtype(expected.dtype()), &expected, rtol, atol, &format!("{case}: grad"));
}

device_test! {
    fn cross_entropy_matches_torch(dev: Device) {
        let f = fixtures();
        let names: Vec<String> = f.case_names().filter(|c| c.starts_with("ce_")).map(String::from).collect();
        assert!(names.len() >= 15, "fixture cases missing");
        for case in &names {
            let x = Var::parameter(f.tensor(case, "logits", dev));
            let opts = CrossEntropyOptions {
                ignore_index: f.scalar(case, "ignore_index") as i64,
                label_smoothing: f.scalar(case, "label_smoothing"),
                reduction: reduction(&f, case),
            };
            let loss = cross_entropy_with(&x, &f.tensor(case, "target", dev), &opts);
            check(&f, case, &x, &loss, dev);
        }
    }
}

device_test! {
    fn bce_with_logits_matches_torch(dev: Device) {
        let f = fixtures();
        let names: Vec<String> = f.case_names().filter(|c| c.starts_with("bce_")).map(String::from).collect();
        assert!(names.len() >= 7, "fixture cases missing");
        for case in &names {
            let x = Var::parameter(f.tensor(case, "x", dev));
            let has = |name: &str| case.contains(name);
            let opts = BceWithLogitsOptions {
                weight: (case == "bce_weight_pos_weight").then(|| f.tensor(case, "weight", dev)),
                pos_weight: has("pos_weight").then(|| f.tensor(case, "pos_weight", dev)),
                reduction: reduction(&f, case),
            };
            let loss = binary_cross_entropy_with_logits_with(&x, &f.tensor(case, "y", dev), &opts);
            check(&f, case, &x, &loss, dev);
        }
    }
}

device_test! {
    fn mse_matches_torch(dev: Device) {
        let f = fixtures();
        for case in ["mse_mean", "mse_sum", "mse_none"] {
            let x = Var::parameter(f.tensor(case, "x", dev));
            let loss = mse_loss(&x, &Var::constant(f.tensor(case, "y", dev)), reduction(&f, case));
            check(&f, case, &x, &loss, dev);
        }
    }
}

#[test]
fn the_default_cross_entropy_is_the_mean_over_all_targets() {
    let f = fixtures();
    let x = Var::parameter(f.tensor("ce_mean", "logits", Device::Cpu));
    let loss = cross_entropy(&x, &f.tensor("ce_mean", "target", Device::Cpu));
    assert_close(loss.tensor(), &f.tensor("ce_mean", "loss", Device::Cpu), 1e-5, 1e-6, "loss");
}

#[test]
#[should_panic(expected = "cross_entropy: logits of shape [2, 3] need a target of shape [2], got [3]")]
fn cross_entropy_names_the_shapes_of_a_mismatched_target() {
    let x = Var::parameter(Tensor::zeros((2, 3), oxtrain_tensor::DType::F32, Device::Cpu).unwrap());
    cross_entropy(&x, &Tensor::new(vec![0i64, 1, 2], Device::Cpu).unwrap());
}

/// The fused losses' own backwards against central finite differences in f64 (they compute in
/// f64 for f64 inputs), with ignored targets, label smoothing, a spatial dim and pos_weight.
#[test]
fn fused_loss_gradients_match_finite_differences() {
    use oxtrain_tensor::{DType, Distribution, Generator};
    let randn = |shape: &[usize], seed| {
        Distribution::STANDARD_NORMAL
            .sample_with(&mut Generator::new(seed), shape, DType::F64, Device::Cpu)
            .unwrap()
    };
    let target = Tensor::from_vec(vec![2i64, -100, 0, 4, 1, 3], 6, Device::Cpu).unwrap();
    for (smoothing, reduction) in [(0.0, Reduction::Mean), (0.2, Reduction::Sum), (0.1, Reduction::None)] {
        let opts = CrossEntropyOptions { label_smoothing: smoothing, reduction, ..Default::default() };
        let f = |v: &[Var]| {
            let l = cross_entropy_with(&v[0], &target, &opts);
            if l.rank() == 0 {
                l
            } else {
                l.mul(&Var::constant(randn(&[6], 9))).sum_all()
            }
        };
        oxtrain_autograd::gradcheck(f, &[randn(&[6, 5], 1)], 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("cross_entropy smoothing {smoothing}: {e}"));
    }
    let spatial = Tensor::from_vec(vec![0i64, 2, 1, -100, 2, 0], (2, 3), Device::Cpu).unwrap();
    let f = |v: &[Var]| cross_entropy(&v[0], &spatial);
    oxtrain_autograd::gradcheck(f, &[randn(&[2, 3, 3], 2)], 1e-6, 1e-6)
        .unwrap_or_else(|e| panic!("[N, C, d]: {e}"));

    let y = Tensor::from_vec(vec![0.0f64, 1.0, 1.0, 0.0, 0.5, 1.0], (2, 3), Device::Cpu).unwrap();
    let opts = BceWithLogitsOptions {
        pos_weight: Some(Tensor::from_vec(vec![0.5f64, 2.0, 3.0], 3, Device::Cpu).unwrap()),
        ..Default::default()
    };
    let f = |v: &[Var]| binary_cross_entropy_with_logits_with(&v[0], &y, &opts);
    oxtrain_autograd::gradcheck(f, &[randn(&[2, 3], 3)], 1e-6, 1e-6).unwrap_or_else(|e| panic!("bce: {e}"));
}
