//! Tests of the normalisation primitives: PyTorch fixtures (`fixtures.py`) for outputs and
//! statistics, and naive f64 loops for large strided inputs (the multithreaded paths).

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{device_test, DType, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "norm/fixtures.json")
}

/// Pseudo-random values `offset + spread * u`, `u` uniform in [-1, 1) (a fixed LCG).
pub(super) fn random(shape: &[usize], seed: u64, offset: f64, spread: f64, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            offset + spread * (((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0)
        })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap()
}

fn check(got: &Tensor, expected: &Tensor, dtype: DType, what: &str) {
    let (rtol, atol) = tolerance(dtype);
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_close(got, expected, rtol, atol, what);
}

device_test! {
    fn layer_norm_matches_torch(dev: Device) {
        let f = fixtures();
        let t = |case: &str, name: &str| f.tensor(case, name, dev);
        // (case, view of x, has weight, has bias, dtype of output, dtype of statistics)
        let x = t("ln_f32_strided", "x").transpose(0, 1);
        assert!(!x.is_contiguous());
        let cases = [
            ("ln_f32_strided", x, true, true, DType::F32, DType::F32),
            ("ln_f64_two_dims", t("ln_f64_two_dims", "x"), true, false, DType::F64, DType::F64),
            ("ln_bf16", t("ln_bf16", "x"), true, true, DType::BF16, DType::F32),
            ("ln_offset_f32", t("ln_offset_f32", "x"), true, true, DType::F32, DType::F32),
        ];
        for (case, x, has_weight, has_bias, out_dtype, stats_dtype) in cases {
            let normalized: Vec<usize> = f.ints(case, "normalized_shape").iter().map(|&d| d as usize).collect();
            let weight = has_weight.then(|| t(case, "weight"));
            let bias = has_bias.then(|| t(case, "bias"));
            let (out, mean, rstd) = x.layer_norm(&normalized, weight.as_ref(), bias.as_ref(), f.scalar(case, "eps"));
            check(&out, &t(case, "out"), out_dtype, &format!("{case} out"));
            check(&mean, &t(case, "mean"), stats_dtype, &format!("{case} mean"));
            check(&rstd, &t(case, "rstd"), stats_dtype, &format!("{case} rstd"));
        }
    }
}

device_test! {
    fn batch_norm_matches_torch(dev: Device) {
        let f = fixtures();
        let t = |case: &str, name: &str| f.tensor(case, name, dev);
        let x = t("bn_nchw_f32_channels_last", "x").permute([0, 3, 1, 2]);
        let cases = [
            ("bn_nchw_f32_channels_last", x, true, DType::F32, DType::F32),
            ("bn_nc_f64", t("bn_nc_f64", "x"), false, DType::F64, DType::F64),
            ("bn_ncl_bf16", t("bn_ncl_bf16", "x"), true, DType::BF16, DType::F32),
            ("bn_offset_f32", t("bn_offset_f32", "x"), false, DType::F32, DType::F32),
        ];
        for (case, x, affine, out_dtype, stats_dtype) in cases {
            let (weight, bias) = if affine { (Some(t(case, "weight")), Some(t(case, "bias"))) } else { (None, None) };
            let (mean, var) = x.batch_norm_stats();
            check(&mean, &t(case, "mean"), stats_dtype, &format!("{case} mean"));
            check(&var, &t(case, "var"), stats_dtype, &format!("{case} var"));
            let (out, mean2, var2) = x.batch_norm_training(weight.as_ref(), bias.as_ref(), f.scalar(case, "eps"));
            check(&out, &t(case, "out"), out_dtype, &format!("{case} out"));
            assert_eq!((mean2.to_f64_vec(), var2.to_f64_vec()), (mean.to_f64_vec(), var.to_f64_vec()));
        }
        let c = "bn_eval";
        let out = t(c, "x").batch_norm_normalize(
            &t(c, "running_mean"),
            &t(c, "running_var"),
            Some(&t(c, "weight")),
            Some(&t(c, "bias")),
            f.scalar(c, "eps"),
        );
        check(&out, &t(c, "out"), DType::F32, "bn_eval out");
    }
}

/// Per-channel mean and biased variance of a tensor of shape `[N, C, ...]`, naive in f64.
fn channel_moments_loop(x: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let (c, s) = (x.dims()[1], x.dims()[2..].iter().product::<usize>());
    let v = x.to_f64_vec();
    let per_channel =
        |ch: usize| v.iter().enumerate().filter(move |(i, _)| (i / s) % c == ch).map(|(_, &x)| x);
    let n = (v.len() / c) as f64;
    let mean: Vec<f64> = (0..c).map(|ch| per_channel(ch).sum::<f64>() / n).collect();
    let var = (0..c).map(|ch| per_channel(ch).map(|x| (x - mean[ch]).powi(2)).sum::<f64>() / n).collect();
    (mean, var)
}

device_test! {
    fn batch_norm_on_a_large_strided_input_matches_loop(dev: Device) {
        // NHWC storage seen as NCHW, above the threading threshold; offset mean per channel.
        let x = random(&[8, 24, 20, 5], 1, 50.0, 3.0, dev).to_dtype(DType::F32).permute([0, 3, 1, 2]);
        let (mean, var) = x.batch_norm_stats();
        let (mean_ref, var_ref) = channel_moments_loop(&x);
        let (m, v) = (Tensor::from_vec(mean_ref.clone(), 5, dev).unwrap(), Tensor::from_vec(var_ref.clone(), 5, dev).unwrap());
        assert_close(&mean, &m, 1e-6, 1e-6, "mean");
        assert_close(&var, &v, 1e-6, 1e-6, "var");
        let weight = random(&[5], 2, 1.0, 0.5, dev).to_dtype(DType::F32);
        let bias = random(&[5], 3, 0.0, 1.0, dev);
        let eps = 1e-5;
        let out = x.batch_norm_normalize(&mean, &var, Some(&weight), Some(&bias), eps);
        let (xs, ws, bs) = (x.to_f64_vec(), weight.to_f64_vec(), bias.to_f64_vec());
        let expected: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = (i / 480) % 5;
                (x - mean_ref[c]) / (var_ref[c] + eps).sqrt() * ws[c] + bs[c]
            })
            .collect();
        let expected = Tensor::from_vec(expected, x.dims(), dev).unwrap();
        assert_close(&out, &expected, 1e-5, 1e-5, "batch_norm out");
        // Same result on a contiguous copy (the layout must not change the numbers).
        let (mean_c, _) = x.contiguous().batch_norm_stats();
        assert_eq!(mean_c.to_vec::<f32>(), mean.to_vec::<f32>());
    }
}

device_test! {
    fn layer_norm_on_a_large_strided_input_matches_loop(dev: Device) {
        for dtype in [DType::F32, DType::F16] {
            let x = random(&[96, 64, 8], 4, 5.0, 2.0, dev).to_dtype(dtype).transpose(0, 1); // [64, 96, 8]
            let weight = random(&[96, 8], 5, 1.0, 0.5, dev).to_dtype(dtype);
            let (out, mean, rstd) = x.layer_norm([96, 8], Some(&weight), None, 1e-5);
            assert_eq!((mean.dims(), rstd.dims()), (&[64, 1, 1][..], &[64, 1, 1][..]));
            assert_eq!(mean.dtype(), DType::F32);
            let (xs, ws) = (x.to_f64_vec(), weight.to_f64_vec());
            let (mut out_ref, mut mean_ref, mut rstd_ref) = (vec![], vec![], vec![]);
            for row in xs.chunks(768) {
                let mu = row.iter().sum::<f64>() / 768.0;
                let rs = 1.0 / (row.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / 768.0 + 1e-5).sqrt();
                out_ref.extend(row.iter().zip(&ws).map(|(x, w)| (x - mu) * rs * w));
                mean_ref.push(mu);
                rstd_ref.push(rs);
            }
            let (rtol, atol) = tolerance(dtype);
            let make = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap();
            assert_close(&out, &make(out_ref, x.dims()), rtol, atol, "layer_norm out");
            assert_close(&mean, &make(mean_ref, &[64, 1, 1]), 1e-6, 1e-6, "layer_norm mean");
            assert_close(&rstd, &make(rstd_ref, &[64, 1, 1]), 1e-6, 1e-6, "layer_norm rstd");
        }
    }
}

device_test! {
    #[should_panic(expected = "layer_norm: normalized_shape [4] must be a non-empty tail of the input's shape [2, 3]")]
    fn layer_norm_shape_mismatch_panics(dev: Device) {
        Tensor::zeros([2, 3], DType::F32, dev).unwrap().layer_norm(4usize, None, None, 1e-5);
    }
}

device_test! {
    #[should_panic(expected = "layer_norm: weight must have shape [3] for an input of shape [2, 3], got [2, 3]")]
    fn layer_norm_weight_shape_panics(dev: Device) {
        let x = Tensor::zeros([2, 3], DType::F32, dev).unwrap();
        x.layer_norm([3], Some(&x), None, 1e-5);
    }
}

device_test! {
    #[should_panic(expected = "batch_norm: bias must have shape [3] for an input of shape [2, 3, 4], got [4]")]
    fn batch_norm_param_shape_panics(dev: Device) {
        let x = Tensor::zeros([2, 3, 4], DType::F32, dev).unwrap();
        let (mean, var) = x.batch_norm_stats();
        x.batch_norm_normalize(&mean, &var, None, Some(&Tensor::zeros([4], DType::F32, dev).unwrap()), 1e-5);
    }
}

device_test! {
    #[should_panic(expected = "batch_norm_stats: expected a floating-point input, got int64 with shape [2, 3]")]
    fn batch_norm_int_input_panics(dev: Device) {
        Tensor::zeros([2, 3], DType::I64, dev).unwrap().batch_norm_stats();
    }
}

device_test! {
    #[should_panic(expected = "batch_norm_stats: expected an input of shape [N, C], [N, C, L] or [N, C, H, W], got [5]")]
    fn batch_norm_rank_one_panics(dev: Device) {
        Tensor::zeros([5], DType::F32, dev).unwrap().batch_norm_stats();
    }
}

/// Batch norm's gradients from their definition in f64: `(dx, dweight, dbias)`.
fn batch_norm_backward_loop(dy: &Tensor, x: &Tensor, w: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (c, spatial) = (x.dims()[1], x.dims()[2..].iter().product::<usize>());
    let (xs, gs) = (x.to_f64_vec(), dy.to_f64_vec());
    let (mean, var) = channel_moments_loop(x);
    let count = (xs.len() / c) as f64;
    let ch = |i: usize| (i / spatial) % c;
    let (mut sum_dy, mut sum_dyx) = (vec![0.0; c], vec![0.0; c]);
    for (i, (&g, &v)) in gs.iter().zip(&xs).enumerate() {
        sum_dy[ch(i)] += g;
        sum_dyx[ch(i)] += g * (v - mean[ch(i)]);
    }
    let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let dx = (0..xs.len())
        .map(|i| {
            let k = ch(i);
            let xhat = (xs[i] - mean[k]) * rstd[k];
            w[k] * rstd[k] * (gs[i] - sum_dy[k] / count - xhat * sum_dyx[k] * rstd[k] / count)
        })
        .collect();
    let dweight = (0..c).map(|k| sum_dyx[k] * rstd[k]).collect();
    (dx, dweight, sum_dy)
}

device_test! {
    fn batch_norm_backward_matches_loop(dev: Device) {
        let eps = 1e-5;
        // [4, 6, 9, 11]: several chunks per channel on neither path; a channels-last view too.
        let (x, dy) = (random(&[4, 6, 9, 11], 3, 0.5, 2.0, dev), random(&[4, 6, 9, 11], 4, 0.0, 1.0, dev));
        let w: Vec<f64> = (0..6).map(|c| 0.5 + 0.25 * c as f64).collect();
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            for channels_last in [false, true] {
                let view = |t: &Tensor| {
                    let t = t.to_dtype(dtype);
                    if channels_last { t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]) } else { t }
                };
                let (x, dy) = (view(&x), view(&dy));
                let (mean, var) = x.batch_norm_stats();
                let weight = Tensor::from_vec(w.clone(), [6], dev).unwrap().to_dtype(dtype);
                let (dx, dw, db) = dy.batch_norm_backward(&x, (&mean, &var), Some(&weight), eps, true);
                // The reference starts from the values the low-precision tensors hold.
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&dy, &x, &w, eps);
                let what = format!("batch_norm_backward {dtype} channels-last {channels_last}");
                let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
                check(&dx.expect("input gradient asked for"), &as_t(want_dx, x.dims()), dtype, &format!("{what} dx"));
                check(&dw, &as_t(want_dw, &[6]), dtype, &format!("{what} dweight"));
                check(&db, &as_t(want_db, &[6]), dtype, &format!("{what} dbias"));
                let (none, _, _) = dy.batch_norm_backward(&x, (&mean, &var), Some(&weight), eps, false);
                assert!(none.is_none(), "{what}: no input gradient asked for");
            }
        }
    }
}

device_test! {
    fn batch_norm_relu_backward_matches_masked_loop(dev: Device) {
        let eps = 1e-5;
        // 34848 elements: above the threading threshold; planes of 1089, not a multiple of the
        // kernels' 8 lanes.
        let shape = [4, 8, 33, 33];
        let (x, dy) = (random(&shape, 21, 0.3, 1.5, dev), random(&shape, 22, 0.0, 1.0, dev));
        let res = random(&shape, 23, 0.0, 1.0, dev);
        let w: Vec<f64> = (0..8).map(|c| 0.5 + 0.125 * c as f64).collect();
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (x, dy, res) = (x.to_dtype(dtype), dy.to_dtype(dtype), res.to_dtype(dtype));
            let weight = Tensor::from_vec(w.clone(), [8], dev).unwrap().to_dtype(dtype);
            let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
            for residual in [false, true] {
                let what = format!("batch_norm_relu_backward {dtype} residual {residual}");
                let (y, mean, var) = if residual {
                    x.batch_norm_add_relu_training(Some(&weight), None, &res, eps)
                } else {
                    x.batch_norm_relu_training(Some(&weight), None, eps)
                };
                // The fused forward against its composition.
                let (out, _, _) = x.batch_norm_training(Some(&weight), None, eps);
                let composed = if residual { out.add(&res).relu() } else { out.relu() };
                check(&y, &composed, dtype, &format!("{what}: forward"));
                let masked = dy.threshold_backward(&y, 0.0);
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&masked, &x, &w, eps);
                for keep in [false, true] {
                    let (dx, dw, db, kept) =
                        dy.batch_norm_relu_backward(&y, &x, (&mean, &var), Some(&weight), eps, true, keep);
                    check(&dx.expect("input gradient asked for"), &as_t(want_dx.clone(), &shape), dtype, &format!("{what} dx"));
                    check(&dw, &as_t(want_dw.clone(), &[8]), dtype, &format!("{what} dweight"));
                    check(&db, &as_t(want_db.clone(), &[8]), dtype, &format!("{what} dbias"));
                    match kept {
                        Some(k) => {
                            assert!(keep, "{what}: masked gradient not asked for");
                            assert_eq!(k.to_f64_vec(), masked.to_f64_vec(), "{what}: the kept masked gradient");
                        }
                        None => assert!(!keep, "{what}: masked gradient asked for"),
                    }
                }
            }
        }
    }
}

device_test! {
    fn batch_norm_channels_last_keeps_its_layout(dev: Device) {
        // 16 channels: the 16-byte vector kernels take f32, bf16 and f64 alike on CUDA.
        let eps = 1e-5;
        let cl = |t: &Tensor| t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]);
        let (x, dy) = (random(&[3, 16, 5, 7], 7, -0.3, 1.5, dev), random(&[3, 16, 5, 7], 8, 0.0, 1.0, dev));
        let w: Vec<f64> = (0..16).map(|c| 0.75 + 0.05 * c as f64).collect();
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (xc, dyc) = (cl(&x.to_dtype(dtype)), cl(&dy.to_dtype(dtype)));
            let weight = Tensor::from_vec(w.clone(), [16], dev).unwrap().to_dtype(dtype);
            let (out, mean, var) = xc.batch_norm_training(Some(&weight), None, eps);
            let (want_out, _, _) = xc.contiguous().batch_norm_training(Some(&weight), None, eps);
            let what = format!("channels-last batch norm {dtype}");
            check(&out, &want_out, dtype, &format!("{what} out"));
            let (fused, _, _) = xc.batch_norm_relu_training(Some(&weight), None, eps);
            assert_eq!(fused.to_f64_vec(), out.relu().to_f64_vec(), "{what}: fused ReLU");
            // The residual packed like x, and row-major (copied into x's order first).
            let res = cl(&random(&[3, 16, 5, 7], 9, -1.0, 1.0, dev).to_dtype(dtype));
            for r in [res.clone(), res.contiguous()] {
                let (fused, mean2, var2) = xc.batch_norm_add_relu_training(Some(&weight), None, &r, eps);
                check(&fused, &out.add(&r).relu(), dtype, &format!("{what}: fused add and ReLU"));
                assert_eq!((mean2.to_f64_vec(), var2.to_f64_vec()), (mean.to_f64_vec(), var.to_f64_vec()));
                if dev.is_cuda() {
                    assert_eq!(fused.layout().strides(), xc.layout().strides(), "{what}: fused output layout");
                }
            }
            // dy packed like x, and dy row-major (copied into x's order first).
            for dy in [dyc.clone(), dyc.contiguous()] {
                let (dx, dw, db) = dy.batch_norm_backward(&xc, (&mean, &var), Some(&weight), eps, true);
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&dy, &xc, &w, eps);
                let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
                let dx = dx.expect("input gradient asked for");
                check(&dx, &as_t(want_dx, x.dims()), dtype, &format!("{what} dx"));
                check(&dw, &as_t(want_dw, &[16]), dtype, &format!("{what} dweight"));
                check(&db, &as_t(want_db, &[16]), dtype, &format!("{what} dbias"));
                if dev.is_cuda() {
                    assert_eq!(dx.layout().strides(), xc.layout().strides(), "{what}: dx stays channels-last");
                }
            }
            if dev.is_cuda() {
                assert_eq!(out.layout().strides(), xc.layout().strides(), "{what}: the output stays channels-last");
            }
        }
    }
}

/// Layer norm's gradients from their definition in f64, over rows of `len`.
fn layer_norm_backward_loop(
    dy: &[f64],
    x: &[f64],
    len: usize,
    w: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; len], vec![0.0; len]);
    for r in 0..x.len() / len {
        let (xs, gs) = (&x[r * len..(r + 1) * len], &dy[r * len..(r + 1) * len]);
        let mean = xs.iter().sum::<f64>() / len as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = xs.iter().map(|v| (v - mean) * rstd).collect();
        let gy: Vec<f64> = gs.iter().zip(w).map(|(g, w)| g * w).collect();
        let mean_gy = gy.iter().sum::<f64>() / len as f64;
        let mean_gyx = gy.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / len as f64;
        for j in 0..len {
            dx[r * len + j] = rstd * (gy[j] - mean_gy - xhat[j] * mean_gyx);
            dw[j] += gs[j] * xhat[j];
            db[j] += gs[j];
        }
    }
    (dx, dw, db)
}

device_test! {
    fn layer_norm_backward_matches_loop(dev: Device) {
        let eps = 1e-5;
        // 300 rows of 70: several row blocks on the CPU, several splits on CUDA; a large mean.
        let (x, dy) = (random(&[4, 75, 70], 11, 3.0, 2.0, dev), random(&[4, 75, 70], 12, 0.0, 1.0, dev));
        let w: Vec<f64> = (0..70).map(|j| 0.5 + 0.01 * j as f64).collect();
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (x, dy) = (x.to_dtype(dtype), dy.to_dtype(dtype));
            let weight = Tensor::from_vec(w.clone(), [70], dev).unwrap().to_dtype(dtype);
            let (_, mean, rstd) = x.layer_norm([70], Some(&weight), None, eps);
            let (dx, dw, db) = dy.layer_norm_backward(&x, (&mean, &rstd), Some(&weight), [70]);
            let wq = weight.to_f64_vec();
            let (want_dx, want_dw, want_db) = layer_norm_backward_loop(&dy.to_f64_vec(), &x.to_f64_vec(), 70, &wq, eps);
            let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
            let what = format!("layer_norm_backward {dtype}");
            check(&dx, &as_t(want_dx, x.dims()), dtype, &format!("{what} dx"));
            check(&dw, &as_t(want_dw, &[70]), dtype, &format!("{what} dweight"));
            check(&db, &as_t(want_db, &[70]), dtype, &format!("{what} dbias"));
        }
        // No weight: gy is dy.
        let (_, mean, rstd) = x.layer_norm([70], None, None, eps);
        let (dx, _, _) = dy.layer_norm_backward(&x, (&mean, &rstd), None, [70]);
        let (want_dx, _, _) = layer_norm_backward_loop(&dy.to_f64_vec(), &x.to_f64_vec(), 70, &[1.0; 70], eps);
        check(&dx, &Tensor::from_vec(want_dx, x.dims(), dev).unwrap(), DType::F64, "layer_norm_backward without weight");
    }
}
