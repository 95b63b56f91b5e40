//! Shared by the models tests: the deterministic weights of `models/fixtures/make_fixtures.py`
//! and comparison helpers.
#![allow(dead_code)] // each test binary uses its own part

use oxtrain_nn::Module;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::{DType, Device, Tensor};

/// FNV-1a, 32-bit, of the name's UTF-8 bytes.
fn fnv1a(name: &str) -> u64 {
    let mut h: u32 = 0x811C9DC5;
    for b in name.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    h as u64
}

/// `u` in [0, 1) for each flat index, the integer hash of make_fixtures.py:
/// `x = (i * 2654435761 + fnv1a(name)) mod 2^32`, `x ^= x >> 16`, `x = x * 0x45d9f3b mod 2^32`,
/// `x ^= x >> 16`, `u = x / 2^32`.
pub fn uniform(name: &str, n: usize) -> Vec<f64> {
    let h = fnv1a(name);
    (0..n as u64)
        .map(|i| {
            let mut x = (i.wrapping_mul(2654435761).wrapping_add(h)) & 0xFFFF_FFFF;
            x ^= x >> 16;
            x = (x * 0x45D9F3B) & 0xFFFF_FFFF;
            x ^= x >> 16;
            x as f64 / 4294967296.0
        })
        .collect()
}

/// The value of make_fixtures.py's formula for a tensor `name` of `shape`, as f32:
/// `running_var` 1 + 0.5u, `running_mean` 0.1v, rank >= 2 v*sqrt(3/fan_in) (fan_in =
/// numel / shape[0]), rank-1 `weight` 1 + 0.1v, rank-1 `bias` 0.1v, with v = 2u - 1.
pub fn value(name: &str, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let u = uniform(name, n);
    let data: Vec<f32> = u
        .iter()
        .map(|&u| {
            let v = 2.0 * u - 1.0;
            let x = if name.ends_with("running_var") {
                1.0 + 0.5 * u
            } else if name.ends_with("running_mean") {
                0.1 * v
            } else if shape.len() >= 2 {
                v * (3.0 / (n / shape[0]) as f64).sqrt()
            } else if name.ends_with("weight") {
                1.0 + 0.1 * v
            } else {
                0.1 * v
            };
            x as f32
        })
        .collect();
    Tensor::from_vec(data, shape, Device::Cpu).unwrap()
}

/// Overwrites every parameter (tied ones once, under their first name) and every running
/// statistic of `model` with the formula, as `fill` in make_fixtures.py.
pub fn fill(model: &dyn Module) {
    for (name, p) in model.named_parameters() {
        p.tensor().copy_(&value(&name, p.dims()));
    }
    for (name, b) in model.named_buffers() {
        if name.ends_with("running_mean") || name.ends_with("running_var") {
            b.copy_(&value(&name, b.dims()));
        }
    }
}

/// Asserts `|a - e| <= rtol * max|e| + atol` elementwise: a relative error measured against
/// the tensor's scale, so entries near zero do not demand more than f32 can give.
#[track_caller]
pub fn assert_rel(actual: &Tensor, expected: &Tensor, rtol: f64, what: &str) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shapes differ");
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let scale = e.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    let worst = a.iter().zip(&e).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(
        worst <= rtol * scale,
        "{what}: largest difference {worst:e} is over {rtol:e} of the largest value {scale:e}"
    );
}

#[track_caller]
pub fn assert_scalar(actual: f64, expected: f64, rtol: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= rtol * expected.abs().max(1e-6),
        "{what}: {actual} but the reference is {expected}"
    );
}

/// The first `rows` rows of a gradient, flattened per row (make_fixtures.py's `grad_head`).
pub fn head(g: &Tensor, rows: usize) -> Tensor {
    g.reshape([g.dims()[0], g.elem_count() / g.dims()[0]]).narrow(0, 0, rows.min(g.dims()[0])).contiguous()
}

/// Checks the gradient norm and first rows of each named parameter against the fixture.
/// `rtol` bounds the norms relatively and each element relative to the largest value.
pub fn check_grads(model: &dyn Module, fx: &Fixtures, case: &str, names: &[&str], rows: usize, rtol: f64) {
    let params = model.named_parameters();
    for &name in names {
        let (_, p) = params.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no parameter {name}"));
        let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        let norm = g.to_dtype(DType::F64).square().sum_all().item().sqrt();
        assert_scalar(
            norm,
            fx.scalar(case, &format!("grad_norm:{name}")),
            rtol,
            &format!("{case} grad norm of {name}"),
        );
        let expected = fx.tensor(case, &format!("grad_head:{name}"), Device::Cpu);
        assert_rel(&head(&g, rows), &expected, rtol, &format!("{case} gradient of {name}"));
    }
}
