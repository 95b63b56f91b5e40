//! Initialisation statistics against PyTorch's formulas (bounds, standard deviations), and the
//! layers' default initialisation.

use super::*;
use crate::{Conv2d, Conv2dConfig, Linear, Module};
use oxtrain_tensor::{manual_seed, DType, Device, Generator, Tensor};

fn stats(t: &Tensor) -> (f64, f64, f64) {
    let v = t.to_f64_vec();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let max_abs = v.iter().fold(0f64, |m, x| m.max(x.abs()));
    (mean, std, max_abs)
}

fn zeros(dims: &[usize]) -> Tensor {
    Tensor::zeros(dims, DType::F32, Device::Cpu).unwrap()
}

/// A uniform sample on (-b, b): inside, reaching close to b, with std b / sqrt(3).
fn assert_uniform(t: &Tensor, bound: f64, what: &str) {
    let (mean, std, max_abs) = stats(t);
    assert!(max_abs <= bound, "{what}: {max_abs} outside the bound {bound}");
    assert!(max_abs > 0.98 * bound, "{what}: the largest value {max_abs} is far inside the bound {bound}");
    assert!(mean.abs() < 0.02 * bound, "{what}: mean {mean}");
    let expected = bound / 3f64.sqrt();
    assert!((std - expected).abs() < 0.02 * expected, "{what}: std {std}, expected {expected}");
}

fn assert_normal(t: &Tensor, expected_std: f64, what: &str) {
    let (mean, std, _) = stats(t);
    assert!(mean.abs() < 0.02 * expected_std, "{what}: mean {mean}");
    assert!((std - expected_std).abs() < 0.02 * expected_std, "{what}: std {std}, expected {expected_std}");
}

#[test]
fn gains_and_fans_are_pytorchs() {
    assert_eq!(calculate_gain(Nonlinearity::Relu), 2f64.sqrt());
    assert_eq!(calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
    assert_eq!(calculate_gain(Nonlinearity::LeakyRelu(5f64.sqrt())), (1.0f64 / 3.0).sqrt());
    assert_eq!(calculate_fan_in_and_fan_out(&[64, 32, 3, 5]), (32 * 15, 64 * 15));
    assert_eq!(calculate_fan_in_and_fan_out(&[10, 20]), (20, 10));
}

#[test]
fn kaiming_and_xavier_have_the_documented_spread() {
    let dims = [256, 64, 3, 3]; // fan_in 576, fan_out 2304
    let t = zeros(&dims);
    kaiming_uniform_(&t, FanMode::FanIn, Nonlinearity::Relu, None);
    assert_uniform(&t, 2f64.sqrt() * (3.0 / 576.0f64).sqrt(), "kaiming_uniform_ fan_in relu");
    kaiming_normal_(&t, FanMode::FanOut, Nonlinearity::Relu, None);
    assert_normal(&t, 2f64.sqrt() / 2304f64.sqrt(), "kaiming_normal_ fan_out relu");
    xavier_uniform_(&t, 1.0, None);
    assert_uniform(&t, (6.0 / (576.0 + 2304.0f64)).sqrt(), "xavier_uniform_");
    xavier_normal_(&t, 2.0, None);
    assert_normal(&t, 2.0 * (2.0 / (576.0 + 2304.0f64)).sqrt(), "xavier_normal_ gain 2");
    normal_(&t, 0.0, 0.02, None);
    assert_normal(&t, 0.02, "normal_");
    uniform_(&t, -3.0, 3.0, None);
    assert_uniform(&t, 3.0, "uniform_");
    ones_(&t);
    assert_eq!(stats(&t), (1.0, 0.0, 1.0));
    zeros_(&t);
    assert_eq!(stats(&t), (0.0, 0.0, 0.0));
}

#[test]
fn linear_and_conv_defaults_are_bounded_by_one_over_sqrt_fan_in() {
    manual_seed(3);
    let linear = Linear::new(400, 300, Device::Cpu).unwrap();
    assert_uniform(&linear.weight.tensor(), 1.0 / 400f64.sqrt(), "Linear weight");
    let b = linear.bias.as_ref().unwrap().tensor();
    assert!(stats(&b).2 <= 1.0 / 400f64.sqrt() && stats(&b).1 > 0.0, "Linear bias");
    let config = Conv2dConfig { groups: 4, ..Default::default() };
    let conv = Conv2d::with_config(64, 128, [3, 3], config, Device::Cpu).unwrap();
    let fan_in = 16.0 * 9.0;
    assert_uniform(&conv.weight.tensor(), 1.0 / f64::sqrt(fan_in), "Conv2d weight (groups 4)");
    assert!(stats(&conv.bias.as_ref().unwrap().tensor()).2 <= 1.0 / f64::sqrt(fan_in));
    assert_eq!(conv.parameters().len(), 2);
}

#[test]
fn a_generator_makes_initialisation_reproducible() {
    let (a, b) = (zeros(&[8, 8]), zeros(&[8, 8]));
    kaiming_uniform_(&a, FanMode::FanIn, Nonlinearity::Relu, Some(&mut Generator::new(11)));
    kaiming_uniform_(&b, FanMode::FanIn, Nonlinearity::Relu, Some(&mut Generator::new(11)));
    assert_eq!(a.to_f64_vec(), b.to_f64_vec());
    // manual_seed's repeatability is checked in tests/default_generator.rs, a process of its
    // own: the other tests here draw from the default generator meanwhile.
}

#[test]
fn norm_and_embedding_defaults_are_pytorchs() {
    let emb = crate::Embedding::new(1000, 64, Device::Cpu).unwrap();
    assert_normal(&emb.weight.tensor(), 1.0, "Embedding weight");
    let bn = crate::BatchNorm2d::new(5, Device::Cpu).unwrap();
    let ln = crate::LayerNorm::new([5], Device::Cpu).unwrap();
    for (name, t) in bn.state_dict().into_iter().chain(ln.state_dict()) {
        let expected = if name.ends_with("weight") || name == "running_var" { 1.0 } else { 0.0 };
        assert!(t.to_f64_vec().iter().all(|&v| v == expected), "{name}: {:?}", t.to_f64_vec());
    }
}

#[test]
fn no_init_weights_leaves_layers_unfilled_on_this_thread_only() {
    let linear = no_init_weights(|| {
        assert!(is_init_skipped());
        let nested = no_init_weights(|| Linear::new(3, 2, Device::Cpu).unwrap());
        assert!(is_init_skipped(), "the inner scope must not end the outer one");
        assert!(nested.weight.tensor().to_f64_vec().iter().all(|&x| x == 0.0));
        Linear::new(8, 4, Device::Cpu).unwrap()
    });
    assert!(!is_init_skipped());
    assert!(linear.weight.tensor().to_f64_vec().iter().all(|&x| x == 0.0));
    // Deterministic fills still run inside the scope.
    let ones = no_init_weights(|| {
        let t = zeros(&[3]);
        ones_(&t);
        t
    });
    assert_eq!(ones.to_f64_vec(), [1.0; 3]);
    // Outside it the same constructor draws again.
    let drawn = Linear::new(8, 4, Device::Cpu).unwrap();
    assert!(drawn.weight.tensor().to_f64_vec().iter().any(|&x| x != 0.0));
}
