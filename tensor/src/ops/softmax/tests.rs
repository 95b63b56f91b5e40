//! Tests of softmax/log_softmax: PyTorch fixtures with extreme logits, and naive f64 loops
//! (written here) on random non-contiguous views.
use crate::ops::reduce::proptests::view_spec;
use crate::ops::reduce::tests::{naive_groups, values};
use crate::testing::{assert_close, tolerance, Fixtures};
use crate::*;
use proptest::prelude::*;

/// Naive softmax (or log_softmax) of `t` along `dim`, in f64, in row-major order of `t`.
fn naive_softmax(t: &Tensor, dim: usize, log: bool) -> Vec<f64> {
    let shape = t.dims().to_vec();
    if shape.is_empty() {
        return vec![if log { 0.0 } else { 1.0 }];
    }
    let (_, lanes) = naive_groups(t, &[dim], false);
    let results: Vec<Vec<f64>> = lanes
        .iter()
        .map(|lane| {
            let m = lane.iter().fold(f64::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            let sum: f64 = lane.iter().map(|x| (x - m).exp()).sum();
            lane.iter().map(|x| if log { (x - m) - sum.ln() } else { (x - m).exp() / sum }).collect()
        })
        .collect();
    let n: usize = shape.iter().product();
    (0..n)
        .map(|linear| {
            let mut rest = linear;
            let mut coord = vec![0; shape.len()];
            for a in (0..shape.len()).rev() {
                coord[a] = rest % shape[a];
                rest /= shape[a];
            }
            let lane = (0..shape.len()).filter(|&a| a != dim).fold(0, |acc, a| acc * shape[a] + coord[a]);
            results[lane][coord[dim]]
        })
        .collect()
}

fn check(t: &Tensor, dim: i64, what: &str) {
    let d = if t.rank() == 0 { 0 } else { (dim + t.rank() as i64) as usize % t.rank() };
    let (rtol, atol) = tolerance(t.dtype());
    for log in [false, true] {
        let got = if log { t.log_softmax(dim) } else { t.softmax(dim) };
        assert_eq!((got.dims(), got.dtype()), (t.dims(), t.dtype()), "{what}");
        let exp = Tensor::from_vec(naive_softmax(t, d, log), t.dims(), Device::Cpu).unwrap();
        assert_close(&got, &exp, rtol, atol, &format!("{what}: log {log}, dim {dim}"));
    }
}

device_test! {
    fn softmax_matches_torch_on_extreme_logits(dev: Device) {
        let fx = Fixtures::parse(include_str!("fixtures.json"), "softmax/fixtures.json");
        for case in fx.case_names() {
            let x = fx.tensor(case, "x", dev);
            let dim = fx.ints(case, "dim")[0];
            let (rtol, atol) = tolerance(x.dtype());
            // The same values through a layout whose dims are in reverse memory order.
            let rev: Vec<usize> = (0..x.rank()).rev().collect();
            let view = x.permute(&rev).contiguous().permute(&rev);
            assert!(!view.is_contiguous());
            for t in [&x, &view] {
                assert_close(&t.softmax(dim), &fx.tensor(case, "softmax", dev), rtol, atol, case);
                assert_close(&t.log_softmax(dim), &fx.tensor(case, "log_softmax", dev), rtol, atol, case);
            }
        }
    }
}

device_test! {
    fn large_softmax_takes_the_parallel_paths(dev: Device) {
        let make = |shape: &[usize], seed| {
            Tensor::from_vec(values(shape.iter().product(), seed, false), shape, dev).unwrap().to_dtype(DType::F32)
        };
        check(&make(&[200, 300], 1), 1, "rows");
        check(&make(&[300, 200], 2), 0, "columns of one block");
        check(&make(&[40, 50, 30], 3), 1, "columns of many blocks");
        check(&make(&[300, 400], 4).t(), -1, "transposed");
        check(&make(&[64, 1, 100], 5).expand([64, 8, 100]).to_dtype(DType::F16), 1, "expanded f16");
    }
}

device_test! {
    fn softmax_of_a_scalar_is_one(dev: Device) {
        let s = Tensor::scalar(-3.5f32, dev).unwrap();
        assert_eq!((s.softmax(0).to_scalar::<f32>(), s.log_softmax(-1).to_scalar::<f32>()), (1.0, 0.0));
        let empty = Tensor::zeros([0, 4], DType::F64, dev).unwrap();
        assert_eq!(empty.softmax(1).dims(), &[0, 4]);
    }
}

device_test! {
    #[should_panic(expected = "softmax: expected a floating-point tensor, got dtype int64 (shape [2])")]
    fn softmax_rejects_integers(dev: Device) {
        Tensor::new([1i64, 2], dev).unwrap().softmax(0);
    }
}

device_test! {
    #[should_panic(expected = "log_softmax: dim 2 is out of range for a tensor of rank 2")]
    fn log_softmax_rejects_an_out_of_range_dim(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().log_softmax(2);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn softmax_matches_naive_on_views(spec in view_spec(), dim in -4i64..4, f64_: bool) {
        let t = spec.build(if f64_ { DType::F64 } else { DType::F32 });
        // Any valid dim, written negative when `dim` is.
        let r = t.rank() as i64;
        let dim = if r == 0 { 0 } else if dim < 0 { -1 - (-dim - 1) % r } else { dim % r };
        check(&t, dim, &format!("{spec:?}"));
    }
}

/// Inputs of `shape` with NaN, +-inf and all--inf rows sprinkled in when `special`.
fn gpu_input(shape: &[usize], dtype: DType, seed: u64, special: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = values(n, seed, false).iter().map(|x| x * 4.0).collect();
    if special && n > 64 {
        let last = *shape.last().unwrap();
        v[3] = f64::NEG_INFINITY;
        v[n / 2] = f64::NAN;
        v[n - 5] = f64::INFINITY;
        // One whole row of -inf (the second row), when there are rows.
        if n >= 2 * last {
            v[last..2 * last].fill(f64::NEG_INFINITY);
        }
    }
    Tensor::from_vec(v, shape, Device::Cpu).unwrap().to_dtype(dtype)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_softmax_matches_cpu_on_every_kernel_path() {
    let dev = Device::Cuda(0);
    // Row lengths for each kernel: warp (scalar and vector access), block (8 and 16 values a
    // thread), the three-pass long-row kernel; then columns (inner > 1).
    let cases: &[(&[usize], i64)] = &[
        (&[37, 1], -1),
        (&[50, 31], -1),
        (&[40, 128], -1),
        (&[9, 1000], -1),
        (&[7, 1023], -1),
        (&[5, 2048], -1),
        (&[3, 5001], -1),
        (&[4, 12288], -1),
        (&[2, 16384], -1),
        (&[2, 40000], -1),
        (&[6, 70, 33], 1),
        (&[3000, 5], 0),
    ];
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let (rtol, atol) = tolerance(dtype);
        for (i, &(shape, dim)) in cases.iter().enumerate() {
            for special in [false, true] {
                let x = gpu_input(shape, dtype, 100 + i as u64, special);
                let g = x.to_device(dev).unwrap();
                for log in [false, true] {
                    let (want, got) = if log {
                        (x.log_softmax(dim), g.log_softmax(dim))
                    } else {
                        (x.softmax(dim), g.softmax(dim))
                    };
                    let got = got.to_device(Device::Cpu).unwrap();
                    let what = format!("{dtype} {shape:?} dim {dim} log {log} special {special}");
                    assert_close(&got, &want, rtol, atol, &what);
                }
                // A view whose rows start off a vector boundary takes the scalar kernels.
                if shape.len() == 2 && shape[1] > 2 {
                    let v = g.narrow(1, 1, shape[1] - 1);
                    let got = v.softmax(-1).to_device(Device::Cpu).unwrap();
                    let want = x.narrow(1, 1, shape[1] - 1).softmax(-1);
                    assert_close(&got, &want, rtol, atol, &format!("narrowed {dtype} {shape:?}"));
                }
            }
        }
    }
}

/// Times a row softmax over a 256 MB f32 tensor (the target: >= 80% of device copy
/// bandwidth); prints the rates and checks sampled rows against the CPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_softmax_row_bandwidth() {
    let dev = Device::Cuda(0);
    for cols in [128usize, 1024, 4096, 8192, 32768] {
        let rows = (64usize << 20) / cols;
        let x = Distribution::STANDARD_NORMAL
            .sample_with(&mut crate::Generator::new(cols as u64), [rows, cols], DType::F32, Device::Cpu)
            .unwrap()
            .to_device(dev)
            .unwrap();
        let time = |f: &dyn Fn() -> Tensor| {
            f();
            crate::cuda::synchronize(0).unwrap();
            let reps = 20;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                f();
            }
            crate::cuda::synchronize(0).unwrap();
            t0.elapsed().as_secs_f64() / reps as f64
        };
        let bytes = 2.0 * (rows * cols * 4) as f64;
        let copy = time(&|| x.copy());
        let soft = time(&|| x.softmax(-1));
        let logs = time(&|| x.log_softmax(-1));
        println!(
            "[{rows}, {cols}] f32: copy {:.0} GB/s, softmax {:.0} GB/s ({:.3} ms, {:.0}% of copy), log_softmax {:.0} GB/s",
            bytes / copy / 1e9,
            bytes / soft / 1e9,
            soft * 1e3,
            100.0 * copy / soft,
            bytes / logs / 1e9
        );
        let head = x.narrow(0, 0, 3);
        let got = head.softmax(-1).to_device(Device::Cpu).unwrap();
        let want = head.to_device(Device::Cpu).unwrap().softmax(-1);
        assert_close(&got, &want, 1e-5, 1e-6, &format!("[{rows}, {cols}]"));
    }
}

device_test! {
    fn softmax_backward_matches_a_loop(dev: Device) {
        // Rows of 37 (a tail in every warp pass) and of 1000; another dim takes the composed form.
        for (shape, dim) in [(vec![5, 3, 37], 2usize), (vec![4, 1000], 1), (vec![6, 7, 5], 1)] {
            let n: usize = shape.iter().product();
            let x: Vec<f64> = (0..n).map(|i| ((i * 7919 % 101) as f64 - 50.0) * 0.05).collect();
            let gv: Vec<f64> = (0..n).map(|i| ((i * 104729 % 97) as f64 - 48.0) * 0.02).collect();
            let x = Tensor::from_vec(x, shape.as_slice(), dev).unwrap();
            let g = Tensor::from_vec(gv.clone(), shape.as_slice(), dev).unwrap();
            for op in [SoftmaxOp::Softmax, SoftmaxOp::LogSoftmax] {
                let y = x.softmax_op(op, dim);
                // dx_i = y_i (g_i - sum_j g_j y_j), or g_i - exp(y_i) sum_j g_j, per slice.
                let (ys, inner, len) = (y.to_f64_vec(), shape[dim + 1..].iter().product::<usize>(), shape[dim]);
                let mut want = vec![0.0; n];
                for o in 0..n / (len * inner) {
                    for k in 0..inner {
                        let at = |j: usize| (o * len + j) * inner + k;
                        let s: f64 = (0..len)
                            .map(|j| if op == SoftmaxOp::Softmax { gv[at(j)] * ys[at(j)] } else { gv[at(j)] })
                            .sum();
                        for j in 0..len {
                            let i = at(j);
                            want[i] = if op == SoftmaxOp::Softmax { ys[i] * (gv[i] - s) } else { gv[i] - ys[i].exp() * s };
                        }
                    }
                }
                let want = Tensor::from_vec(want, shape.as_slice(), dev).unwrap();
                let what = format!("{} backward {shape:?} dim {dim}", op.name());
                assert_close(&g.softmax_backward(&y, op, dim), &want, 1e-12, 1e-12, &format!("{what} f64"));
                let (rtol, atol) = tolerance(DType::F32);
                let got = g.to_dtype(DType::F32).softmax_backward(&y.to_dtype(DType::F32), op, dim);
                assert_close(&got, &want.to_dtype(DType::F32), rtol, atol, &format!("{what} f32"));
            }
        }
    }
}
