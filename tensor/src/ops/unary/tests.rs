//! Tests of the unary family against PyTorch fixtures (`fixtures.py` beside this file).

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{DType, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "unary/fixtures.json")
}

/// The op a fixture case names (`float32/gelu_tanh` -> `gelu_tanh`), applied through the public method.
fn apply(fx: &Fixtures, case: &str, x: &Tensor) -> Tensor {
    let op = case.split('/').nth(1).unwrap();
    match op {
        "neg" => x.neg(),
        "abs" => x.abs(),
        "exp" => x.exp(),
        "log" => x.log(),
        "log1p" => x.log1p(),
        "sqrt" => x.sqrt(),
        "rsqrt" => x.rsqrt(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tanh" => x.tanh(),
        "sigmoid" => x.sigmoid(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "gelu_tanh" => x.gelu_tanh(),
        "silu" => x.silu(),
        "square" => x.square(),
        "reciprocal" => x.recip(),
        "sign" => x.sign(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        "round" => x.round(),
        "affine" => x.affine(fx.scalar(case, "mul"), fx.scalar(case, "add")),
        "pow2" | "pow3" | "pow_half" | "pow_neg" => x.powf(fx.scalar(case, "exponent")),
        "clamp" | "clamp_min" => x.clamp(fx.scalar(case, "min"), fx.scalar(case, "max")),
        other => panic!("unary fixture names an unknown op {other}"),
    }
}

/// The same values as `x` in a layout with gaps: every other element of a wider copy.
fn strided_copy(x: &Tensor) -> Tensor {
    let mut wide: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
    wide.push(2);
    let s = x.unsqueeze(-1).expand(wide).copy().select(-1, 1);
    assert!(!s.is_contiguous() || s.elem_count() <= 1);
    s
}

fn check_all_cases(dev: Device, prefix: &str) {
    let fx = fixtures();
    let mut checked = 0;
    for case in fx.case_names().filter(|c| c.starts_with(prefix)) {
        let x = fx.tensor(case, "x", dev);
        let expected = fx.tensor(case, "y", dev);
        let (rtol, atol) = tolerance(x.dtype());
        let y = apply(&fx, case, &x);
        assert_eq!(y.dtype(), x.dtype(), "{case}: dtype changed");
        assert_close(&y, &expected, rtol, atol, case);
        assert_close(
            &apply(&fx, case, &strided_copy(&x)),
            &expected,
            rtol,
            atol,
            &format!("{case} (strided)"),
        );
        if x.rank() == 2 {
            let transposed = x.t().copy().t();
            assert_close(
                &apply(&fx, case, &transposed),
                &expected,
                rtol,
                atol,
                &format!("{case} (transposed)"),
            );
        }
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} fixture cases start with {prefix}");
}

crate::device_test! {
    fn float32_edge_values_match_torch(dev: Device) {
        check_all_cases(dev, "float32/");
    }
}

crate::device_test! {
    fn float64_matches_torch(dev: Device) {
        check_all_cases(dev, "float64/");
    }
}

crate::device_test! {
    fn half_types_compute_in_f32_and_round_once(dev: Device) {
        check_all_cases(dev, "float16/");
        check_all_cases(dev, "bfloat16/");
    }
}

crate::device_test! {
    fn integer_ops_are_exact_and_wrap(dev: Device) {
        check_all_cases(dev, "int64/");
        check_all_cases(dev, "uint8/");
    }
}

crate::device_test! {
    fn big_inputs_run_in_parallel_chunks(dev: Device) {
        // Above PAR_THRESHOLD and non-contiguous: the chunked walk must match a naive loop.
        let n = 300 * 257;
        let x = Tensor::from_vec((0..n).map(|i| (i as f32 * 0.37).sin() * 5.0).collect::<Vec<_>>(), [300, 257], dev)
            .unwrap()
            .t();
        let y = x.affine(2.0, -1.0).relu();
        let src = x.to_vec::<f32>();
        let expected: Vec<f32> = src.iter().map(|&v| (v * 2.0 - 1.0).max(0.0)).collect();
        assert_eq!(y.dims(), &[257, 300]);
        assert_eq!(y.to_vec::<f32>(), expected);
    }
}

crate::device_test! {
    fn scalar_helpers_are_affine(dev: Device) {
        let x = Tensor::new([1.5f64, -2.0, 4.0], dev).unwrap();
        let naive = |f: fn(f64) -> f64| x.to_vec::<f64>().into_iter().map(f).collect::<Vec<_>>();
        assert_eq!(x.add_scalar(2.0).to_vec::<f64>(), naive(|v| v + 2.0));
        assert_eq!(x.mul_scalar(-3.0).to_vec::<f64>(), naive(|v| v * -3.0));
        assert_eq!((&x + 1.0).to_vec::<f64>(), naive(|v| v + 1.0));
        assert_eq!((&x - 1.0).to_vec::<f64>(), naive(|v| v - 1.0));
        assert_eq!((&x * 0.5).to_vec::<f64>(), naive(|v| v * 0.5));
        assert_eq!((&x / 4.0).to_vec::<f64>(), naive(|v| v / 4.0));
        assert_eq!((-&x).to_vec::<f64>(), naive(|v| -v));
    }
}

crate::device_test! {
    fn clamp_with_a_nan_bound_gives_nan(dev: Device) {
        // PyTorch propagates a NaN bound into every element.
        let x = Tensor::new([1f32, -3.0], dev).unwrap();
        assert!(x.clamp(f64::NAN, 2.0).to_vec::<f32>().iter().all(|v| v.is_nan()));
        assert!(x.clamp(0.0, f64::NAN).to_vec::<f32>().iter().all(|v| v.is_nan()));
    }
}

crate::device_test! {
    #[should_panic(expected = "exp: not defined for integer tensors (dtype int64)")]
    fn float_only_op_on_integers_names_the_op(dev: Device) {
        Tensor::new([1i64, 2], dev).unwrap().exp();
    }
}

crate::device_test! {
    #[should_panic(expected = "clamp: min 3 is greater than max 1")]
    fn clamp_bounds_out_of_order(dev: Device) {
        Tensor::new([1f32], dev).unwrap().clamp(3.0, 1.0);
    }
}

crate::device_test! {
    #[should_panic(expected = "neg: not defined for bool tensors")]
    fn bool_tensors_have_no_arithmetic(dev: Device) {
        Tensor::new([true, false], dev).unwrap().neg();
    }
}

#[test]
fn every_op_has_a_distinct_name() {
    let ops = crate::testing::UNARY_OPS;
    let mut names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ops.len());
    let _ = DType::F32;
}
