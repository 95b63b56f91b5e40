//! Tests of the reduce family against naive f64 loops over multi-indices (written here,
//! independent of the kernels) and against PyTorch fixtures from `fixtures.py`.
use crate::testing::Fixtures;
use crate::*;

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "reduce/fixtures.json")
}

/// Deterministic values in [-10, 10) (xorshift), or small integers with many ties.
pub(crate) fn values(n: usize, seed: u64, ties: bool) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            if ties {
                (u * 7.0).floor() - 3.0
            } else {
                u * 20.0 - 10.0
            }
        })
        .collect()
}

/// The reduced dims as PyTorch reads `dims` (negative from the back; empty means all).
pub(crate) fn normalize(dims: &[i64], rank: usize) -> Vec<usize> {
    if rank == 0 {
        return vec![];
    }
    let mut d: Vec<usize> =
        dims.iter().map(|&d| if d < 0 { (d + rank as i64) as usize } else { d as usize }).collect();
    if d.is_empty() {
        d = (0..rank).collect();
    }
    d.sort_unstable();
    d
}

/// The output shape and, per output element, its reduced elements in row-major order.
pub(crate) fn naive_groups(t: &Tensor, dims: &[usize], keepdim: bool) -> (Vec<usize>, Vec<Vec<f64>>) {
    let shape = t.dims().to_vec();
    let vals = t.to_f64_vec();
    let out_shape: Vec<usize> = (0..shape.len())
        .filter_map(|i| match (dims.contains(&i), keepdim) {
            (false, _) => Some(shape[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let n_out: usize = (0..shape.len()).filter(|i| !dims.contains(i)).map(|i| shape[i]).product();
    let mut groups = vec![vec![]; n_out];
    for (linear, &v) in vals.iter().enumerate() {
        // Unravel the row-major index, then ravel the kept coordinates.
        let mut rest = linear;
        let mut index = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            index[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut out = 0;
        for d in 0..shape.len() {
            if !dims.contains(&d) {
                out = out * shape[d] + index[d];
            }
        }
        groups[out].push(v);
    }
    (out_shape, groups)
}

pub(crate) fn naive_max(g: &[f64], largest: bool) -> (f64, usize) {
    let mut best = (if largest { f64::NEG_INFINITY } else { f64::INFINITY }, 0);
    for (i, &x) in g.iter().enumerate() {
        if x.is_nan() {
            return (x, i);
        }
        if (largest && x > best.0) || (!largest && x < best.0) || i == 0 {
            best = (x, i);
        }
    }
    best
}

pub(crate) fn naive_var(g: &[f64], correction: usize) -> f64 {
    let n = g.len() as f64;
    let mean = g.iter().sum::<f64>() / n;
    g.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - correction as f64).max(0.0)
}

/// `|actual - expected| <= rtol * |expected| + stol * scale` per element; NaN and inf must match.
#[track_caller]
pub(crate) fn assert_near(
    actual: &Tensor,
    expected: &[f64],
    scale: &[f64],
    (rtol, stol): (f64, f64),
    what: &str,
) {
    let a = actual.to_f64_vec();
    assert_eq!(a.len(), expected.len(), "{what}: lengths differ");
    for (i, ((&x, &e), &s)) in a.iter().zip(expected).zip(scale).enumerate() {
        let ok = if e.is_nan() || e.is_infinite() {
            x.is_nan() == e.is_nan() && (e.is_nan() || x == e)
        } else {
            (x - e).abs() <= rtol * e.abs() + stol * s + 1e-300
        };
        assert!(ok, "{what}: element {i} is {x}, expected {e}");
    }
}

/// Tolerances (relative to the result, relative to the sum of magnitudes) per dtype.
pub(crate) fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-13),
        DType::F32 => (2e-6, 2e-6),
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (8e-3, 1e-5),
        _ => (0.0, 0.0),
    }
}

/// Checks every value reduction of `t` over `dims` against the naive loops.
pub(crate) fn check_all_ops(t: &Tensor, dims: &[i64], keepdim: bool, what: &str) {
    let nd = normalize(dims, t.rank());
    let (shape, groups) = naive_groups(t, &nd, keepdim);
    let scale: Vec<f64> = groups.iter().map(|g| g.iter().map(|x| x.abs()).sum::<f64>()).collect();
    let mag: Vec<f64> = groups.iter().map(|g| g.iter().fold(0.0, |m: f64, x| m.max(x.abs()))).collect();
    let t_ = tol(t.dtype());
    let check = |name: &str, got: Tensor, exp: Vec<f64>, scale: &[f64]| {
        let what = format!("{what}: {name} over {dims:?} keepdim {keepdim}");
        assert_eq!(got.dims(), &shape[..], "{what}: shape");
        assert_near(&got, &exp, scale, t_, &what);
    };
    let n: Vec<f64> = groups.iter().map(|g| g.len() as f64).collect();
    check("sum", t.sum(dims, keepdim), groups.iter().map(|g| g.iter().sum()).collect(), &scale);
    let mean_scale: Vec<f64> = scale.iter().zip(&n).map(|(s, n)| s / n).collect();
    check(
        "mean",
        t.mean(dims, keepdim),
        groups.iter().map(|g| g.iter().sum::<f64>() / g.len() as f64).collect(),
        &mean_scale,
    );
    let var_scale: Vec<f64> = mag.iter().map(|m| m * m).collect();
    check("var", t.var(dims, 1, keepdim), groups.iter().map(|g| naive_var(g, 1)).collect(), &var_scale);
    check("std", t.std(dims, 0, keepdim), groups.iter().map(|g| naive_var(g, 0).sqrt()).collect(), &mag);
    if nd.iter().all(|&d| t.dims()[d] != 0) {
        check("max", t.max(dims, keepdim), groups.iter().map(|g| naive_max(g, true).0).collect(), &mag);
        check("min", t.min(dims, keepdim), groups.iter().map(|g| naive_max(g, false).0).collect(), &mag);
    }
}

fn base(shape: &[usize], dtype: DType, seed: u64, dev: Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, false), shape, dev).unwrap().to_dtype(dtype)
}

/// Views of shape [4, 5, 6] with every kind of layout.
fn views(dtype: DType, dev: Device) -> Vec<(&'static str, Tensor)> {
    vec![
        ("contiguous", base(&[4, 5, 6], dtype, 1, dev)),
        ("permuted", base(&[6, 4, 5], dtype, 2, dev).permute([1, 2, 0])),
        ("narrowed", base(&[5, 7, 6], dtype, 3, dev).narrow(1, 2, 5).narrow(0, 1, 4)),
        ("expanded", base(&[4, 1, 6], dtype, 4, dev).expand([4, 5, 6])),
        ("stepped", base(&[8, 6, 5], dtype, 5, dev).slice(0, 1, 8, 2).transpose(1, 2)),
    ]
}

device_test! {
    fn value_reductions_match_naive_loops_on_views(dev: Device) {
        let dim_sets: [&[i64]; 8] = [&[0], &[1], &[2], &[-1], &[0, 2], &[-3, -2], &[0, 1, 2], &[]];
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            for (name, t) in views(dtype, dev) {
                for dims in dim_sets {
                    for keepdim in [false, true] {
                        check_all_ops(&t, dims, keepdim, &format!("{name} {dtype}"));
                    }
                }
            }
        }
    }
}

device_test! {
    fn argmax_argmin_match_naive_loops_with_ties(dev: Device) {
        let t = Tensor::from_vec(values(8 * 9 * 10, 7, true), [8, 9, 10], dev).unwrap();
        for (name, v) in [("contiguous", t.clone()), ("permuted", t.permute([2, 0, 1])), ("narrowed", t.narrow(2, 3, 6))] {
            for dim in 0..3i64 {
                let (_, groups) = naive_groups(&v, &[dim as usize], false);
                for largest in [true, false] {
                    let got = if largest { v.argmax(dim, false) } else { v.argmin(dim - 3, false) };
                    assert_eq!(got.dtype(), DType::I64);
                    let exp: Vec<i64> = groups.iter().map(|g| naive_max(g, largest).1 as i64).collect();
                    assert_eq!(got.to_vec::<i64>(), exp, "{name} dim {dim} largest {largest}");
                }
            }
        }
        let flat = t.permute([1, 2, 0]);
        let (_, all) = naive_groups(&flat, &[0, 1, 2], false);
        assert_eq!(flat.argmax_all().to_scalar::<i64>(), naive_max(&all[0], true).1 as i64);
        assert_eq!(flat.argmin_all().to_scalar::<i64>(), naive_max(&all[0], false).1 as i64);
    }
}

device_test! {
    fn large_reductions_take_every_parallel_path(dev: Device) {
        // Shapes chosen so each loop (inner, rows) runs both split over outputs and over the
        // reduced range, plus transposed and expanded inputs.
        let cases: Vec<(Tensor, Vec<i64>)> = vec![
            (base(&[3000, 24], DType::F32, 11, dev), vec![0]),
            (base(&[24, 3000], DType::F32, 12, dev), vec![1]),
            (base(&[50000, 3], DType::F32, 13, dev), vec![1]),
            (base(&[3, 30000], DType::F32, 14, dev), vec![0]),
            (base(&[64, 40, 30], DType::F32, 15, dev), vec![1]),
            (base(&[3000, 24], DType::F64, 16, dev).t(), vec![1]),
            (base(&[1, 400], DType::F32, 17, dev).expand([300, 400]), vec![0]),
            (base(&[200, 300], DType::F32, 18, dev), vec![]),
            // A bias gradient's shape: the rows of two leading dims folded into 96 columns,
            // split over many blocks by the column kernel on CUDA.
            (base(&[16, 512, 96], DType::BF16, 20, dev), vec![0, 1]),
            (base(&[9, 40, 70], DType::F32, 21, dev).narrow(2, 3, 64), vec![0, 1]),
        ];
        for (t, dims) in cases {
            check_all_ops(&t, &dims, false, &format!("large {:?}", t.dims()));
        }
        let ties = Tensor::from_vec(values(4000 * 16, 19, true), [4000, 16], dev).unwrap();
        for (v, dim) in [(ties.clone(), 0usize), (ties.t(), 1), (ties.reshape([16, 4000]), 1)] {
            let (_, groups) = naive_groups(&v, &[dim], false);
            let exp: Vec<i64> = groups.iter().map(|g| naive_max(g, true).1 as i64).collect();
            assert_eq!(v.argmax(dim, false).to_vec::<i64>(), exp, "argmax of {:?} over {dim}", v.dims());
        }
    }
}

device_test! {
    fn low_precision_sums_accumulate_in_f32(dev: Device) {
        // One million 0.1s: a plain f32 running sum is off by about 1%.
        let t = Tensor::full([1000, 1000], 0.1, DType::F32, dev).unwrap();
        let exact = 1e6 * (0.1f32 as f64);
        assert!((t.sum_all().item() - exact).abs() <= 1e-5 * exact, "f32 sum {}", t.sum_all().item());
        assert!((t.sum(1, false).sum_all().item() - exact).abs() <= 1e-5 * exact);
        // A bf16 accumulator would stop growing at 256.
        let ones = Tensor::ones([3, 5000], DType::BF16, dev).unwrap();
        assert_eq!(ones.sum(1, false).to_f64_vec(), vec![half::bf16::from_f64(5000.0).to_f64(); 3]);
        assert_eq!(ones.sum(0, false).dtype(), DType::BF16);
        let halves = Tensor::full([4096], 0.5, DType::F16, dev).unwrap();
        assert_eq!(halves.sum_all().item(), 2048.0);
        assert_eq!(halves.mean_all().item(), 0.5);
    }
}

device_test! {
    fn integer_and_low_precision_sums_match_torch(dev: Device) {
        let fx = fixtures();
        for case in fx.case_names().filter(|c| c.starts_with("sum_")) {
            let x = fx.tensor(case, "x", dev);
            let dim = fx.ints(case, "dim")[0];
            let expected = fx.tensor(case, "sum", dev);
            let got = x.sum(dim, false);
            assert_eq!(got.dtype(), expected.dtype(), "{case}: dtype");
            let (rtol, atol) = crate::testing::tolerance(expected.dtype());
            crate::testing::assert_close(&got, &expected, rtol, atol, case);
        }
        let u8s = Tensor::full([1000], 255.0, DType::U8, dev).unwrap();
        assert_eq!(u8s.sum_all().to_scalar::<i64>(), 255_000);
        let bools = Tensor::new([true, false, true], dev).unwrap();
        assert_eq!(bools.sum_all().to_scalar::<i64>(), 2);
        assert_eq!(Tensor::new([7u32, 9], dev).unwrap().sum(0, true).to_vec::<i64>(), vec![16]);
    }
}

device_test! {
    fn arg_and_extreme_values_match_torch_with_nan_and_ties(dev: Device) {
        let fx = fixtures();
        for case in fx.case_names().filter(|c| c.starts_with("arg_")) {
            let x = fx.tensor(case, "x", dev);
            let dim = fx.ints(case, "dim")[0];
            assert_eq!(x.argmax(dim, false).to_vec::<i64>(), fx.tensor(case, "argmax", dev).to_vec::<i64>(), "{case}");
            assert_eq!(x.argmin(dim, false).to_vec::<i64>(), fx.tensor(case, "argmin", dev).to_vec::<i64>(), "{case}");
            crate::testing::assert_close(&x.max(dim, false), &fx.tensor(case, "max", dev), 0.0, 0.0, case);
            crate::testing::assert_close(&x.min(dim, false), &fx.tensor(case, "min", dev), 0.0, 0.0, case);
            // The same answers through a transposed copy of the input.
            let xt = x.t().contiguous().t();
            assert_eq!(xt.argmax(dim, false).to_vec::<i64>(), x.argmax(dim, false).to_vec::<i64>(), "{case} (view)");
        }
    }
}

device_test! {
    fn var_and_std_match_torch_far_from_zero(dev: Device) {
        let fx = fixtures();
        for case in fx.case_names().filter(|c| c.starts_with("var_")) {
            let x = fx.tensor(case, "x", dev);
            let dims = fx.ints(case, "dims");
            let correction = fx.scalar(case, "correction") as usize;
            let keepdim = fx.scalar(case, "keepdim") != 0.0;
            let (rtol, atol) = if x.dtype() == DType::F64 { (1e-9, 0.0) } else { (1e-6, 0.0) };
            for v in [x.clone(), x.permute([2, 0, 1]).contiguous().permute([1, 2, 0])] {
                let var = v.var(&dims, correction, keepdim);
                crate::testing::assert_close(&var, &fx.tensor(case, "var", dev), rtol, atol, case);
                let std = v.std(&dims, correction, keepdim);
                crate::testing::assert_close(&std, &fx.tensor(case, "std", dev), rtol, atol, case);
            }
        }
    }
}

device_test! {
    fn topk_matches_torch(dev: Device) {
        let fx = fixtures();
        for case in fx.case_names().filter(|c| c.starts_with("topk_")) {
            let x = fx.tensor(case, "x", dev);
            let k = fx.scalar(case, "k") as usize;
            let dim = fx.ints(case, "dim")[0];
            let largest = fx.scalar(case, "largest") != 0.0;
            let (values, indices) = x.topk(k, dim, largest, true);
            crate::testing::assert_close(&values, &fx.tensor(case, "values", dev), 0.0, 0.0, case);
            assert_eq!(indices.dtype(), DType::I64);
            assert_eq!(indices.to_vec::<i64>(), fx.tensor(case, "indices", dev).to_vec::<i64>(), "{case}");
            // A non-contiguous input gives the same answer.
            let (v2, i2) = x.transpose(0, -1).contiguous().transpose(0, -1).topk(k, dim, largest, true);
            crate::testing::assert_close(&v2, &values, 0.0, 0.0, case);
            assert_eq!(i2.to_vec::<i64>(), indices.to_vec::<i64>(), "{case}");
        }
    }
}

device_test! {
    fn unsorted_topk_keeps_input_order(dev: Device) {
        let x = Tensor::new([[5.0f32, 1.0, 4.0, 2.0, 3.0], [0.0, 9.0, 8.0, 7.0, 1.0]], dev).unwrap();
        let (v, i) = x.topk(3, 1, true, false);
        assert_eq!(i.to_vec2::<i64>(), vec![vec![0, 2, 4], vec![1, 2, 3]]);
        assert_eq!(v.to_vec2::<f32>(), vec![vec![5.0, 4.0, 3.0], vec![9.0, 8.0, 7.0]]);
        let (v, i) = Tensor::scalar(2.5f32, dev).unwrap().topk(1, -1, true, true);
        assert_eq!((v.dims(), i.to_scalar::<i64>(), v.to_scalar::<f32>()), (&[][..], 0, 2.5));
    }
}

device_test! {
    fn keepdim_scalars_empty_dim_lists_and_zero_sizes(dev: Device) {
        let t = base(&[2, 3, 4], DType::F32, 21, dev);
        assert_eq!(t.sum([0, 2], true).dims(), &[1, 3, 1]);
        assert_eq!(t.sum([-1], false).dims(), &[2, 3]);
        // An empty dim list reduces everything, as torch.sum(x, dim=[]).
        assert_eq!(t.sum(Vec::<i64>::new(), false).dims(), &[] as &[usize]);
        assert_eq!(t.sum(Vec::<i64>::new(), true).dims(), &[1, 1, 1]);
        assert_eq!(t.sum_all().item(), t.sum([0, 1, 2], false).item());
        let s = Tensor::scalar(4.0f64, dev).unwrap();
        assert_eq!((s.sum(0, false).item(), s.sum(-1, true).dims().len()), (4.0, 0));
        assert_eq!((s.max_all().item(), s.argmax(0, false).to_scalar::<i64>()), (4.0, 0));
        assert!(s.var(0, 1, false).item().is_nan());
        assert_eq!(s.var(0, 0, false).item(), 0.0);
        let empty = Tensor::zeros([0, 3], DType::F32, dev).unwrap();
        assert_eq!(empty.sum(0, false).to_vec::<f32>(), vec![0.0; 3]);
        assert!(empty.mean(0, false).to_vec::<f32>().iter().all(|x| x.is_nan()));
        assert!(empty.var(0, 1, false).to_vec::<f32>().iter().all(|x| x.is_nan()));
        assert_eq!(empty.max(1, false).dims(), &[0]);
        assert_eq!(empty.argmin(1, true).dims(), &[0, 1]);
        assert_eq!(empty.sum_all().item(), 0.0);
        let (v, i) = Tensor::zeros([3, 0], DType::F32, dev).unwrap().topk(0, 1, true, true);
        assert_eq!((v.dims(), i.dims()), (&[3, 0][..], &[3, 0][..]));
    }
}

device_test! {
    #[should_panic(expected = "sum: dim 3 is out of range for a tensor of rank 3")]
    fn sum_rejects_an_out_of_range_dim(dev: Device) {
        base(&[2, 3, 4], DType::F32, 1, dev).sum(3, false);
    }
}
device_test! {
    #[should_panic(expected = "var: a dim appears more than once")]
    fn var_rejects_a_repeated_dim(dev: Device) {
        base(&[2, 3, 4], DType::F32, 1, dev).var([1, -2], 1, false);
    }
}
device_test! {
    #[should_panic(expected = "argmin: dim -4 is out of range for a tensor of rank 3")]
    fn argmin_rejects_an_out_of_range_dim(dev: Device) {
        base(&[2, 3, 4], DType::F32, 1, dev).argmin(-4, false);
    }
}
device_test! {
    #[should_panic(expected = "mean: expected a floating-point tensor, got dtype int64")]
    fn mean_rejects_integers(dev: Device) {
        Tensor::new([1i64, 2], dev).unwrap().mean(0, false);
    }
}
device_test! {
    #[should_panic(expected = "std: expected a floating-point tensor, got dtype uint8")]
    fn std_rejects_integers(dev: Device) {
        Tensor::new([1u8, 2], dev).unwrap().std(0, 1, false);
    }
}
device_test! {
    #[should_panic(expected = "max: expected reduction dim 0 to have non-zero size (shape [0, 3])")]
    fn max_rejects_an_empty_reduction(dev: Device) {
        Tensor::zeros([0, 3], DType::F32, dev).unwrap().max(0, false);
    }
}
device_test! {
    #[should_panic(expected = "min: expected reduction dim 1 to have non-zero size")]
    fn min_all_rejects_an_empty_tensor(dev: Device) {
        Tensor::zeros([2, 0], DType::F32, dev).unwrap().min_all();
    }
}
device_test! {
    #[should_panic(expected = "topk: k (4) is out of range for dim 1 of size 3 (shape [2, 3])")]
    fn topk_rejects_k_beyond_the_dim(dev: Device) {
        base(&[2, 3], DType::F32, 1, dev).topk(4, 1, true, true);
    }
}
device_test! {
    #[should_panic(expected = "topk: dim 2 is out of range for a tensor of rank 2")]
    fn topk_rejects_an_out_of_range_dim(dev: Device) {
        base(&[2, 3], DType::F32, 1, dev).topk(1, 2, true, true);
    }
}

/// Every reduction of `x` over `dims` on the GPU against the CPU backend (same dtype rules;
/// argmax/argmin and max/min exactly).
fn check_gpu_against_cpu(x: &Tensor, dims: &[i64], what: &str) {
    let g = x.to_device(Device::Cuda(0)).unwrap();
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
        ReduceOp::Var { correction: 1 },
        ReduceOp::Std { correction: 0 },
    ];
    for op in ops {
        if !x.dtype().is_float() && matches!(op, ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. })
        {
            continue;
        }
        let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
        if arg && dims.len() != 1 {
            continue;
        }
        for keepdim in [false, true] {
            let want = x.reduce(op, dims, keepdim);
            let got = g.reduce(op, dims, keepdim).to_device(Device::Cpu).unwrap();
            let what = format!("{what}: {} over {dims:?} keepdim {keepdim}", op.name());
            assert_eq!((got.dims(), got.dtype()), (want.dims(), want.dtype()), "{what}");
            if arg || matches!(op, ReduceOp::Max | ReduceOp::Min) || !want.dtype().is_float() {
                let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
                for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                    assert!(p == q || (p.is_nan() && q.is_nan()), "{what}: element {i}: {p} vs {q}");
                }
            } else {
                let (rtol, atol) = tol(x.dtype());
                crate::testing::assert_close(&got, &want, rtol * 4.0, atol * 4.0, &what);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_reductions_match_cpu_on_every_kernel_path() {
    // Thread-per-output (short or column reductions), block-per-output, and split reductions
    // (few outputs, long ranges), on contiguous and strided views.
    let cases: Vec<(&str, Vec<usize>, Vec<i64>)> = vec![
        ("short rows", vec![500, 7], vec![1]),
        ("columns", vec![300, 5000], vec![0]),
        ("few columns", vec![30000, 3], vec![0]),
        ("rows", vec![2000, 300], vec![1]),
        ("split rows", vec![3, 100000], vec![1]),
        ("whole", vec![200, 1000], vec![]),
        ("middle", vec![20, 500, 12], vec![1]),
        ("outer two", vec![40, 30, 50], vec![0, 2]),
    ];
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::U8] {
        for (name, shape, dims) in &cases {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = values(n, 31, true).iter().map(|x| (x * 10.0).round()).collect();
            let x = Tensor::from_vec(v, shape.as_slice(), Device::Cpu).unwrap().to_dtype(dtype);
            check_gpu_against_cpu(&x, dims, &format!("{dtype} {name} {shape:?}"));
            let t = x.transpose(0, -1);
            let tdims: Vec<i64> = dims
                .iter()
                .map(|&d| {
                    if d == 0 {
                        -1
                    } else if d == shape.len() as i64 - 1 {
                        0
                    } else {
                        d
                    }
                })
                .collect();
            check_gpu_against_cpu(&t, &tdims, &format!("{dtype} {name} transposed"));
        }
    }
    // NaN, infinities and all -inf lanes: first-occurrence and NaN rules of argmax/argmin.
    let mut v = values(64 * 3000, 41, true);
    v[5] = f64::NAN;
    v[3000 + 7] = f64::INFINITY;
    v[2 * 3000..3 * 3000].fill(f64::NEG_INFINITY);
    v[3 * 3000 + 10] = f64::NAN;
    v[3 * 3000 + 2000] = f64::NAN;
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let x = Tensor::from_vec(v.clone(), [64, 3000], Device::Cpu).unwrap().to_dtype(dtype);
        check_gpu_against_cpu(&x, &[1], &format!("{dtype} special"));
        check_gpu_against_cpu(&x.t(), &[0], &format!("{dtype} special transposed"));
        check_gpu_against_cpu(&x.narrow(0, 2, 1).reshape([3, 1000]).t(), &[1], &format!("{dtype} all -inf"));
    }
    let b = Tensor::from_vec(values(5000, 43, true), [50, 100], Device::Cpu).unwrap().to_dtype(DType::Bool);
    check_gpu_against_cpu(&b, &[1], "bool");
    check_gpu_against_cpu(&b, &[0], "bool columns");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_topk_matches_cpu() {
    for (shape, dim, k) in
        [(vec![40, 50], 1, 5), (vec![50, 40], 0, 40), (vec![3, 20000], 1, 7), (vec![6, 300, 4], 1, 30)]
    {
        let n: usize = shape.iter().product();
        let mut v = values(n, 51, true);
        v[3] = f64::NAN;
        for dtype in [DType::F32, DType::BF16, DType::I64] {
            let x = Tensor::from_vec(v.clone(), shape.as_slice(), Device::Cpu).unwrap().to_dtype(dtype);
            let g = x.to_device(Device::Cuda(0)).unwrap();
            for (largest, sorted) in [(true, true), (false, true), (true, false), (false, false)] {
                let (wv, wi) = x.topk(k, dim, largest, sorted);
                let (gv, gi) = g.topk(k, dim, largest, sorted);
                let what = format!("{dtype} {shape:?} dim {dim} k {k} largest {largest} sorted {sorted}");
                assert_eq!(gi.to_vec::<i64>(), wi.to_vec::<i64>(), "{what}");
                crate::testing::assert_close(&gv.to_device(Device::Cpu).unwrap(), &wv, 0.0, 0.0, &what);
            }
        }
    }
}
