//! Tests of the binary family: PyTorch fixtures (`fixtures.py` beside this file), a property
//! test of broadcasting against explicit index arithmetic, and the panics' messages.

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{BinaryOp, CmpOp, DType, Device, Tensor};
use proptest::prelude::*;

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "binary/fixtures.json")
}

/// The same values as `x` with reversed strides (a permuted copy, permuted back).
fn reversed_strides(x: &Tensor) -> Tensor {
    let rev: Vec<usize> = (0..x.rank()).rev().collect();
    x.permute(&rev).copy().permute(&rev)
}

fn arith(a: &Tensor, b: &Tensor, op: &str) -> Tensor {
    match op {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "maximum" => a.maximum(b),
        "minimum" => a.minimum(b),
        "pow" => a.pow(b),
        "eq" => a.eq(b),
        "ne" => a.ne(b),
        "lt" => a.lt(b),
        "le" => a.le(b),
        "gt" => a.gt(b),
        "ge" => a.ge(b),
        other => panic!("binary fixture names an unknown op {other}"),
    }
}

/// Runs every case under `prefix`, on contiguous inputs and on inputs with reversed strides.
fn check_cases(dev: Device, prefix: &str, min_cases: usize) {
    let fx = fixtures();
    let mut checked = 0;
    for case in fx.case_names().filter(|c| c.starts_with(prefix)) {
        let op = case.split('/').nth(2).unwrap();
        let (a, b) = (fx.tensor(case, "a", dev), fx.tensor(case, "b", dev));
        let expected = fx.tensor(case, "y", dev);
        let (rtol, atol) = tolerance(a.dtype());
        for (a, b, how) in
            [(a.clone(), b.clone(), ""), (reversed_strides(&a), reversed_strides(&b), " (strided)")]
        {
            let y = arith(&a, &b, op);
            assert_close(&y, &expected, rtol, atol, &format!("{case}{how}"));
        }
        checked += 1;
    }
    assert!(checked >= min_cases, "only {checked} fixture cases start with {prefix}");
}

crate::device_test! {
    fn arithmetic_broadcasts_like_torch(dev: Device) {
        for dtype in ["float32", "float64", "float16", "bfloat16"] {
            check_cases(dev, &format!("arith/{dtype}/"), 50);
        }
    }
}

crate::device_test! {
    fn special_values_propagate_like_torch(dev: Device) {
        // Includes NaN on either side of maximum/minimum, inf - inf, 0 / 0, pow(0, -x).
        check_cases(dev, "edges/", 7);
    }
}

crate::device_test! {
    fn comparisons_give_bool_masks(dev: Device) {
        check_cases(dev, "cmp/", 18);
        let x = Tensor::new([1f32, f32::NAN, 3.0], dev).unwrap();
        let y = x.cmp_scalar(1.0, CmpOp::Ge);
        assert_eq!(y.dtype(), DType::Bool);
        let naive: Vec<bool> = x.to_vec::<f32>().iter().map(|&v| v >= 1.0).collect();
        assert_eq!(y.to_vec::<bool>(), naive);
    }
}

crate::device_test! {
    fn integer_arithmetic_wraps(dev: Device) {
        let fx = fixtures();
        let mut checked = 0;
        for case in fx.case_names().filter(|c| c.starts_with("int/")) {
            let op = case.split('/').nth(2).unwrap();
            let (a, b) = (fx.tensor(case, "a", dev), fx.tensor(case, "b", dev));
            let keep = fx.tensor(case, "keep", dev);
            let y = arith(&a, &b, op);
            assert_eq!(y.dtype(), a.dtype(), "{case}");
            // Results beyond 2^53 do not survive JSON; the fixture zeroes them and marks them.
            let got = y.masked_fill(&keep.eq(&keep.scalar_like(0.0)), 0.0);
            assert_close(&got, &fx.tensor(case, "y", dev), 0.0, 0.0, case);
            checked += 1;
        }
        assert_eq!(checked, 10);
        // Wrapping beyond 2^53 checked with Rust's own wrapping arithmetic.
        let big = [i64::MAX, i64::MIN, 1 << 62, -(1 << 62) - 12345];
        let (a, b) = (Tensor::new(big, dev).unwrap(), Tensor::new([3i64, -1, 5, 7], dev).unwrap());
        let mul: Vec<i64> = big.iter().zip([3i64, -1, 5, 7]).map(|(x, y)| x.wrapping_mul(y)).collect();
        let add: Vec<i64> = big.iter().zip([3i64, -1, 5, 7]).map(|(x, y)| x.wrapping_add(y)).collect();
        assert_eq!((&a * &b).to_vec::<i64>(), mul);
        assert_eq!((&a + &b).to_vec::<i64>(), add);
    }
}

crate::device_test! {
    fn bool_add_is_or_and_mul_is_and(dev: Device) {
        let a = Tensor::new([true, true, false, false], dev).unwrap();
        let b = Tensor::new([true, false, true, false], dev).unwrap();
        let (va, vb) = (a.to_vec::<bool>(), b.to_vec::<bool>());
        let or: Vec<bool> = va.iter().zip(&vb).map(|(x, y)| x | y).collect();
        let and: Vec<bool> = va.iter().zip(&vb).map(|(x, y)| x & y).collect();
        assert_eq!((&a + &b).to_vec::<bool>(), or);
        assert_eq!((&a * &b).to_vec::<bool>(), and);
        assert_eq!(a.maximum(&b).to_vec::<bool>(), or);
        assert_eq!(a.minimum(&b).to_vec::<bool>(), and);
    }
}

crate::device_test! {
    fn where_and_masked_fill_broadcast_like_torch(dev: Device) {
        let fx = fixtures();
        for case in fx.case_names().filter(|c| c.starts_with("where/")) {
            let cond = fx.tensor(case, "cond", dev);
            let (a, b) = (fx.tensor(case, "a", dev), fx.tensor(case, "b", dev));
            let expected = fx.tensor(case, "y", dev);
            assert_close(&cond.where_cond(&a, &b), &expected, 0.0, 0.0, case);
            let strided = reversed_strides(&cond).where_cond(&reversed_strides(&a), &reversed_strides(&b));
            assert_close(&strided, &expected, 0.0, 0.0, case);
        }
        for case in fx.case_names().filter(|c| c.starts_with("masked_fill/")) {
            let (x, mask) = (fx.tensor(case, "a", dev), fx.tensor(case, "cond", dev));
            let y = reversed_strides(&x).masked_fill(&mask, fx.scalar(case, "value"));
            assert_close(&y, &fx.tensor(case, "y", dev), 0.0, 0.0, case);
        }
    }
}

crate::device_test! {
    fn big_broadcast_runs_in_parallel_chunks(dev: Device) {
        // Above PAR_THRESHOLD, with a broadcast row and a transposed operand.
        let (rows, cols) = (211, 199);
        let a = Tensor::from_vec((0..rows * cols).map(|i| i as f64).collect::<Vec<_>>(), [cols, rows], dev)
            .unwrap()
            .t();
        let b = Tensor::from_vec((0..cols).map(|j| j as f64 * 0.5).collect::<Vec<_>>(), [cols], dev).unwrap();
        let y = &a - &b;
        let (va, vb) = (a.to_vec::<f64>(), b.to_vec::<f64>());
        let naive: Vec<f64> = (0..rows * cols).map(|i| va[i] - vb[i % cols]).collect();
        assert_eq!(y.to_vec::<f64>(), naive);
    }
}

crate::device_test! {
    fn repeated_block_operands_match_the_naive_loop(dev: Device) {
        // Blocks that fill whole 16-byte vectors take the row-broadcast kernel on CUDA (a bias
        // over rows, a table over the batch), on either side of a non-commuting op; 10 does
        // not and takes the strided one.
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (full_dims, row_dims) in
                [(vec![37, 64], vec![64]), (vec![3, 5, 48], vec![5, 48]), (vec![6, 10], vec![10])]
            {
                let n: usize = full_dims.iter().product();
                let inner: usize = row_dims.iter().product();
                let full: Vec<f64> = (0..n).map(|i| ((i * 7) % 23) as f64 - 11.5).collect();
                let row: Vec<f64> = (0..inner).map(|j| (j % 13) as f64 * 0.5 + 1.0).collect();
                let a = Tensor::from_vec(full.clone(), full_dims.as_slice(), dev).unwrap().to_dtype(dtype);
                let b = Tensor::from_vec(row.clone(), row_dims.as_slice(), dev).unwrap().to_dtype(dtype);
                let left: Vec<f64> = (0..n).map(|i| full[i] - row[i % inner]).collect();
                let right: Vec<f64> = (0..n).map(|i| row[i % inner] / full[i]).collect();
                let tol = if dtype.size_in_bytes() == 2 { 1e-2 } else { 1e-6 };
                for (y, naive, what) in [(a.sub(&b), &left, "full - row"), (b.div(&a), &right, "row / full")] {
                    let got = y.to_dtype(DType::F64).to_vec::<f64>();
                    for (i, (g, w)) in got.iter().zip(naive.iter()).enumerate() {
                        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{dtype} {what} {full_dims:?} at {i}: {g} vs {w}");
                    }
                }
            }
        }
    }
}

crate::device_test! {
    #[should_panic(expected = "add: shapes [2, 3] and [4] cannot be broadcast together")]
    fn shape_mismatch_names_op_and_shapes(dev: Device) {
        let _ = Tensor::zeros([2, 3], DType::F32, dev).unwrap() + Tensor::zeros([4], DType::F32, dev).unwrap();
    }
}

crate::device_test! {
    #[should_panic(expected = "lt: shapes [3] and [2] cannot be broadcast together")]
    fn comparison_shape_mismatch_names_op(dev: Device) {
        Tensor::zeros([3], DType::F32, dev).unwrap().lt(&Tensor::zeros([2], DType::F32, dev).unwrap());
    }
}

crate::device_test! {
    #[should_panic(expected = "mul: dtypes differ (float32 with shape [2] and float16 with shape [2])")]
    fn dtype_mismatch_names_op_dtypes_and_shapes(dev: Device) {
        let _ = Tensor::zeros([2], DType::F32, dev).unwrap() * Tensor::zeros([2], DType::F16, dev).unwrap();
    }
}

crate::device_test! {
    #[should_panic(expected = "where_cond: the condition must be a bool tensor, got float32")]
    fn where_needs_a_bool_condition(dev: Device) {
        let x = Tensor::zeros([2], DType::F32, dev).unwrap();
        x.where_cond(&x, &x);
    }
}

crate::device_test! {
    #[should_panic(expected = "masked_fill: mask of shape [3, 2] cannot be broadcast to the tensor's shape [2]")]
    fn masked_fill_mask_must_fit_the_tensor(dev: Device) {
        let x = Tensor::zeros([2], DType::F32, dev).unwrap();
        x.masked_fill(&Tensor::zeros([3, 2], DType::Bool, dev).unwrap(), 1.0);
    }
}

crate::device_test! {
    #[should_panic(expected = "div: not defined for integer tensors (dtype int64)")]
    fn integer_division_is_refused(dev: Device) {
        let (x, y) = (Tensor::new([4i64, 2], dev).unwrap(), Tensor::new([2i64, 1], dev).unwrap());
        let _ = &x / &y;
    }
}

/// A broadcast-compatible pair: an output shape, and for each operand a suffix of it where
/// some dims are replaced by 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(0usize..5, 0..5).prop_flat_map(|out| {
        let r = out.len();
        let operand = move |out: Vec<usize>| {
            (0..=r, prop::collection::vec(any::<bool>(), r)).prop_map(move |(rank, ones)| {
                (r - rank..r).map(|i| if ones[i] { 1 } else { out[i] }).collect::<Vec<usize>>()
            })
        };
        (operand(out.clone()), operand(out))
    })
}

/// Row-major index of `out_index` in an operand of shape `dims`, aligned at the right,
/// with size-1 dims pinned to 0: numpy broadcasting spelled out.
fn broadcast_source_index(out_index: &[usize], dims: &[usize]) -> usize {
    let lead = out_index.len() - dims.len();
    dims.iter().enumerate().fold(0, |acc, (j, &d)| acc * d + if d == 1 { 0 } else { out_index[lead + j] })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn binary_ops_match_naive_broadcast_loop(
        (sa, sb) in broadcast_pair(),
        op in prop::sample::select(vec![BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div,
                                        BinaryOp::Maximum, BinaryOp::Minimum]),
        strided in any::<(bool, bool)>(),
    ) {
        let values = |n: usize, salt: f64| (0..n).map(|i| ((i as f64 + salt) * 0.731).sin() * 4.0).collect::<Vec<_>>();
        let (va, vb) = (values(sa.iter().product(), 0.0), values(sb.iter().product(), 0.5));
        let mut a = Tensor::from_vec(va.clone(), sa.clone(), Device::Cpu).unwrap();
        let mut b = Tensor::from_vec(vb.clone(), sb.clone(), Device::Cpu).unwrap();
        if strided.0 { a = reversed_strides(&a); }
        if strided.1 { b = reversed_strides(&b); }
        let y = a.binary(&b, op);
        // The output shape: the larger rank, each dim the non-1 size of the operands.
        let rank = sa.len().max(sb.len());
        let pad = |s: &[usize]| [vec![1; rank - s.len()], s.to_vec()].concat();
        let out: Vec<usize> = pad(&sa).iter().zip(pad(&sb)).map(|(&x, y)| if x == 1 { y } else { x }).collect();
        prop_assert_eq!(y.dims(), &out[..]);
        let f = |x: f64, y: f64| match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Maximum => x.max(y),
            BinaryOp::Minimum => x.min(y),
            BinaryOp::Pow => x.powf(y),
        };
        let n: usize = out.iter().product();
        let mut expected = Vec::with_capacity(n);
        let mut index = vec![0usize; rank];
        for _ in 0..n {
            expected.push(f(va[broadcast_source_index(&index, &sa)], vb[broadcast_source_index(&index, &sb)]));
            for d in (0..rank).rev() {
                index[d] += 1;
                if index[d] < out[d] { break; }
                index[d] = 0;
            }
        }
        prop_assert_eq!(y.to_vec::<f64>(), expected);
    }
}

crate::device_test! {
    fn gelu_backward_matches_the_derivative_in_f64(dev: Device) {
        // Central differences of GELU in f64 (both forms), then the f32 and bf16 kernels.
        let xs: Vec<f64> = (0..97).map(|i| -6.0 + 0.125 * i as f64).collect();
        let gs: Vec<f64> = (0..97).map(|i| 0.5 + 0.01 * i as f64).collect();
        let x = Tensor::from_vec(xs.clone(), [97], dev).unwrap();
        let g = Tensor::from_vec(gs.clone(), [97], dev).unwrap();
        for tanh in [false, true] {
            let f = |t: &Tensor| if tanh { t.gelu_tanh() } else { t.gelu() };
            let h = 1e-6;
            let (up, down) = (f(&x.add_scalar(h)).to_f64_vec(), f(&x.add_scalar(-h)).to_f64_vec());
            let want: Vec<f64> = (0..97).map(|i| gs[i] * (up[i] - down[i]) / (2.0 * h)).collect();
            let want = Tensor::from_vec(want, [97], dev).unwrap();
            assert_close(&g.gelu_backward(&x, tanh), &want, 1e-7, 1e-8, &format!("gelu_backward tanh={tanh} f64"));
            for dtype in [DType::F32, DType::BF16] {
                let got = g.to_dtype(dtype).gelu_backward(&x.to_dtype(dtype), tanh);
                let (rtol, atol) = tolerance(dtype);
                // The reference at the rounded inputs.
                let xq = x.to_dtype(dtype).to_dtype(DType::F64);
                let gq = g.to_dtype(dtype).to_dtype(DType::F64);
                let want = gq.gelu_backward(&xq, tanh).to_dtype(dtype);
                assert_close(&got, &want, rtol, atol, &format!("gelu_backward tanh={tanh} {dtype}"));
            }
        }
    }
}

crate::device_test! {
    fn elementwise_ops_keep_a_channels_last_layout_on_the_gpu(dev: Device) {
        let cl = |t: &Tensor| t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]);
        let vals: Vec<f64> = (0..2 * 8 * 3 * 5).map(|i| ((i * 37 % 23) as f64 - 11.0) * 0.25).collect();
        let x = Tensor::from_vec(vals, [2, 8, 3, 5], dev).unwrap().to_dtype(DType::BF16);
        let (xc, yc) = (cl(&x), cl(&x.mul_scalar(0.5)));
        let bias = Tensor::from_vec((0..8).map(|c| c as f64).collect::<Vec<_>>(), [1, 8, 1, 1], dev).unwrap().to_dtype(DType::BF16);
        let results = [
            ("relu", xc.relu(), x.relu()),
            ("add", xc.add(&yc), x.add(&x.mul_scalar(0.5))),
            ("add with a broadcast operand", xc.add(&bias), x.add(&bias)),
            ("gt", xc.gt(&yc).to_dtype(DType::BF16), x.gt(&x.mul_scalar(0.5)).to_dtype(DType::BF16)),
            ("threshold_backward", yc.threshold_backward(&xc, 0.0), x.mul_scalar(0.5).threshold_backward(&x, 0.0)),
            ("gelu_backward", yc.gelu_backward(&xc, true), x.mul_scalar(0.5).gelu_backward(&x, true)),
            ("to_dtype", xc.to_dtype(DType::F32).to_dtype(DType::BF16), x.clone()),
        ];
        for (what, got, want) in results {
            let (rtol, atol) = tolerance(DType::BF16);
            assert_close(&got.to_dtype(DType::F64), &want.to_dtype(DType::F64), rtol, atol, &format!("{what}: values"));
            if dev.is_cuda() {
                assert_eq!(got.layout().strides(), xc.layout().strides(), "{what}: channels-last in, channels-last out");
            } else {
                assert!(got.is_contiguous(), "{what}: the CPU returns row-major results");
            }
        }
        // A row-major first operand leads: the result is row-major.
        assert!(x.add(&xc).is_contiguous());
    }
}
