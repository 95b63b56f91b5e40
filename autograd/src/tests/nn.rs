use super::{check, positive, randn};
use oxtrain_tensor::device_test;

device_test! {
    fn conv2d_gradients(dev: Device) {
        check(
            "conv2d with bias, stride, padding, dilation",
            |v| v[0].conv2d(&v[1], Some(&v[2]), [2, 1], [1, 1], [1, 2], 1),
            &[randn(&[1, 5, 4, 2], 1, dev).permute([0, 3, 1, 2]), randn(&[3, 2, 3, 2], 2, dev), randn(&[3], 3, dev)],
        );
        check(
            "conv2d groups, no bias",
            |v| v[0].conv2d(&v[1], None, [1, 1], [0, 0], [1, 1], 2),
            &[randn(&[1, 4, 4, 3], 4, dev), randn(&[2, 2, 2, 2], 5, dev)],
        );
    }
}

device_test! {
    fn pooling_gradients(dev: Device) {
        let x = || [randn(&[1, 4, 5, 2], 6, dev).permute([0, 3, 1, 2])]; // [1, 2, 4, 5], channels-last
        check("max_pool2d", |v| v[0].max_pool2d([2, 2], [2, 1], [1, 0], [1, 1], false), &x());
        check("max_pool2d dilated ceil", |v| v[0].max_pool2d([2, 2], [2, 2], [0, 1], [1, 2], true), &x());
        check("adaptive_max_pool2d", |v| v[0].adaptive_max_pool2d([3, 2]), &x());
        check("avg_pool2d", |v| v[0].avg_pool2d([3, 2], [2, 2], [1, 1], true, false, None), &x());
        check("avg_pool2d include pad", |v| v[0].avg_pool2d([2, 3], [1, 2], [1, 1], false, true, None), &x());
        check("avg_pool2d divisor", |v| v[0].avg_pool2d([2, 2], [2, 2], [0, 0], false, true, Some(3)), &x());
        check("adaptive_avg_pool2d", |v| v[0].adaptive_avg_pool2d([3, 2]), &x());
    }
}

device_test! {
    fn layer_norm_gradients(dev: Device) {
        check(
            "layer_norm affine",
            |v| v[0].layer_norm(4, Some(&v[1]), Some(&v[2]), 1e-5),
            &[randn(&[4, 3], 7, dev).t(), randn(&[4], 8, dev), randn(&[4], 9, dev)],
        );
        check("layer_norm whole input", |v| v[0].layer_norm([3, 4], None, None, 1e-5), &[randn(&[3, 4], 10, dev)]);
        check(
            "layer_norm bias only",
            |v| v[0].layer_norm([3, 4], None, Some(&v[1]), 1e-5),
            &[randn(&[2, 3, 4], 11, dev), randn(&[3, 4], 12, dev)],
        );
    }
}

device_test! {
    fn batch_norm_gradients(dev: Device) {
        check(
            "batch_norm training affine",
            |v| v[0].batch_norm_training(Some(&v[1]), Some(&v[2]), 1e-5).0,
            &[randn(&[3, 2, 2, 2], 13, dev), positive(&[2], 14, dev), randn(&[2], 15, dev)],
        );
        check(
            "batch_norm relu training (fused)",
            |v| v[0].batch_norm_relu_training(Some(&v[1]), Some(&v[2]), 1e-5).0,
            &[randn(&[3, 2, 2, 2], 22, dev), positive(&[2], 23, dev), randn(&[2], 24, dev)],
        );
        check(
            "batch_norm add relu training (fused)",
            |v| v[0].batch_norm_add_relu_training(Some(&v[1]), Some(&v[2]), &v[3], 1e-5).0,
            &[randn(&[3, 2, 2, 2], 25, dev), positive(&[2], 26, dev), randn(&[2], 27, dev), randn(&[3, 2, 2, 2], 28, dev)],
        );
        // Channels-last (on CUDA the tile kernels: the ReLU's mask recomputed from x, and the
        // gradient of an output used twice read in two parts).
        let cl = |seed: u64| randn(&[3, 2, 3, 8], seed, dev).permute([0, 3, 1, 2]);
        check(
            "batch_norm relu training channels-last",
            |v| v[0].batch_norm_relu_training(Some(&v[1]), Some(&v[2]), 1e-5).0,
            &[cl(40), positive(&[8], 41, dev), randn(&[8], 42, dev)],
        );
        check(
            "batch_norm add relu channels-last, output used twice",
            |v| {
                let y = v[0].batch_norm_add_relu_training(Some(&v[1]), Some(&v[2]), &v[3], 1e-5).0;
                y.mul_scalar(0.5).add(&y.tanh())
            },
            &[cl(43), positive(&[8], 44, dev), randn(&[8], 45, dev), cl(46)],
        );
        check(
            "batch_norm training [N, C]",
            |v| v[0].batch_norm_training(None, None, 1e-5).0,
            &[randn(&[3, 4], 16, dev).t()],
        );
        let (mean, var) = (randn(&[3], 17, dev), positive(&[3], 18, dev));
        check(
            "batch_norm eval",
            move |v| v[0].batch_norm_eval(&mean, &var, Some(&v[1]), Some(&v[2]), 1e-5),
            &[randn(&[2, 3, 2], 19, dev), randn(&[3], 20, dev), randn(&[3], 21, dev)],
        );
    }
}

/// Batch norm's training backward against its formula written as plain f64 loops, on an input
/// large enough for the multithreaded path of the fused CPU kernel; then the f32 gradient
/// against the f64 one.
#[test]
fn batch_norm_fused_backward_matches_naive_f64() {
    use crate::Var;
    use oxtrain_tensor::{DType, Device};
    let (n, c, hw) = (4usize, 3usize, 64 * 50);
    let x = randn(&[n, c, 64, 50], 30, Device::Cpu).affine(2.0, 0.5);
    let dy = randn(&[n, c, 64, 50], 31, Device::Cpu);
    let w = positive(&[c], 32, Device::Cpu);
    let run = |dtype: DType| {
        let (xv, wv) = (Var::parameter(x.to_dtype(dtype)), Var::parameter(w.to_dtype(dtype)));
        let bv = Var::parameter(w.zeros_like().to_dtype(dtype));
        let (out, _, _) = xv.batch_norm_training(Some(&wv), Some(&bv), 1e-5);
        out.backward_with(dy.to_dtype(dtype), false);
        (xv.grad().unwrap().to_f64_vec(), wv.grad().unwrap().to_f64_vec(), bv.grad().unwrap().to_f64_vec())
    };
    let (gx, gw, gb) = run(DType::F64);
    let (xs, dys, ws) = (x.to_f64_vec(), dy.to_f64_vec(), w.to_f64_vec());
    let count = (n * hw) as f64;
    let at = |s: usize, ch: usize, i: usize| (s * c + ch) * hw + i;
    for ch in 0..c {
        let idx: Vec<usize> = (0..n).flat_map(|s| (0..hw).map(move |i| at(s, ch, i))).collect();
        let mean = idx.iter().map(|&k| xs[k]).sum::<f64>() / count;
        let var = idx.iter().map(|&k| (xs[k] - mean).powi(2)).sum::<f64>() / count;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let sum_dy: f64 = idx.iter().map(|&k| dys[k]).sum();
        let sum_dy_xhat: f64 = idx.iter().map(|&k| dys[k] * (xs[k] - mean) * rstd).sum();
        assert!((gb[ch] - sum_dy).abs() < 1e-9 * (1.0 + sum_dy.abs()), "dbias of channel {ch}");
        assert!((gw[ch] - sum_dy_xhat).abs() < 1e-9 * (1.0 + sum_dy_xhat.abs()), "dweight of channel {ch}");
        for &k in &idx {
            let xhat = (xs[k] - mean) * rstd;
            let want = ws[ch] * rstd * (dys[k] - sum_dy / count - xhat * sum_dy_xhat / count);
            assert!((gx[k] - want).abs() < 1e-10 * (1.0 + want.abs()), "dx[{k}]: {} vs {want}", gx[k]);
        }
    }
    // f32: the sums accumulate in f64, so the gradients are f32-rounded f64 values.
    let (fx, fw, fb) = run(DType::F32);
    let worst = |a: &[f64], b: &[f64]| {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0f64, f64::max) / scale
    };
    assert!(worst(&fx, &gx) < 1e-5, "f32 dx vs f64: {}", worst(&fx, &gx));
    assert!(worst(&fw, &gw) < 1e-5, "f32 dweight vs f64: {}", worst(&fw, &gw));
    assert!(worst(&fb, &gb) < 1e-5, "f32 dbias vs f64: {}", worst(&fb, &gb));
}

/// ReLU's one-pass backward: the gradient passes where the input is positive, 0 elsewhere
/// (at 0 too, as in PyTorch), on a strided input large enough for the multithreaded path.
#[test]
fn relu_backward_passes_gradient_where_input_is_positive() {
    use crate::Var;
    use oxtrain_tensor::Device;
    let x = randn(&[200, 300], 40, Device::Cpu).t().narrow(0, 1, 250);
    let x = x.masked_fill(&x.abs().cmp_scalar(0.05, oxtrain_tensor::CmpOp::Lt), 0.0);
    let g = randn(&[250, 200], 41, Device::Cpu);
    let xv = Var::parameter(x.clone());
    xv.relu().backward_with(g.clone(), false);
    let got = xv.grad().unwrap().to_f64_vec();
    for ((gv, xe), ge) in got.iter().zip(x.to_f64_vec()).zip(g.to_f64_vec()) {
        assert_eq!(*gv, if xe > 0.0 { ge } else { 0.0 });
    }
}
