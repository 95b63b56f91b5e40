//! Tests of batch norm's backward through the ReLU after it (`relu.rs`): the fused passes
//! against the composition they replace (`threshold_backward` on the ReLU's output, then
//! `batch_norm_backward`) and against f64 loops, on NCHW and channels-last inputs whose
//! channels are and are not a multiple of the kernels' vector width.

use super::tests::{batch_norm_backward_loop, check, random};
use super::ReluMask;
use crate::{device_test, DType, Device, Tensor};

/// The same NCHW tensor stored channels-last.
fn channels_last(t: &Tensor) -> Tensor {
    if t.rank() == 4 {
        t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
    } else {
        t.clone()
    }
}

/// One input of the tests: x, dy and a residual (NCHW, f64), and whether the tests store
/// them channels-last.
struct Case {
    name: &'static str,
    x: Tensor,
    dy: Tensor,
    res: Tensor,
    channels_last: bool,
}

impl Case {
    /// `t` (one of the case's tensors) in `dtype` and the case's layout.
    fn prepare(&self, t: &Tensor, dtype: DType) -> Tensor {
        let t = t.to_dtype(dtype);
        if self.channels_last {
            channels_last(&t)
        } else {
            t
        }
    }
}

/// Shapes and layouts the fused paths see: channels a multiple of 8 (16-byte vectors for every
/// dtype), of 4 only (f32 vectors, bf16 scalars), odd; planes not a multiple of 8; `[N, C]`.
fn cases(dev: Device) -> Vec<Case> {
    let layouts: [(&str, &[usize], bool); 6] = [
        ("cl C16", &[4, 16, 9, 11], true),
        ("cl C12", &[3, 12, 7, 5], true),
        ("cl C5", &[2, 5, 9, 7], true),
        ("nchw C6", &[3, 6, 9, 11], false),
        ("nc C24", &[37, 24], true),
        ("nchw C16", &[2, 16, 5, 3], false),
    ];
    layouts
        .iter()
        .enumerate()
        .map(|(i, &(name, shape, channels_last))| {
            let seed = 40 + 3 * i as u64;
            Case {
                name,
                x: random(shape, seed, 0.2, 1.5, dev),
                dy: random(shape, seed + 1, 0.0, 1.0, dev),
                res: random(shape, seed + 2, 0.0, 1.0, dev),
                channels_last,
            }
        })
        .collect()
}

fn weight_and_bias(channels: usize, dev: Device, dtype: DType) -> (Tensor, Tensor) {
    let w: Vec<f64> = (0..channels).map(|c| 0.5 + 0.125 * (c % 7) as f64).collect();
    let b: Vec<f64> = (0..channels).map(|c| 0.25 * (c % 5) as f64 - 0.5).collect();
    let t = |v: Vec<f64>| Tensor::from_vec(v, [channels], dev).unwrap().to_dtype(dtype);
    (t(w), t(b))
}

/// Whether the fused CUDA kernels take `x` (channels-last on a GPU).
fn fused_on(x: &Tensor) -> bool {
    x.device().is_cuda() && x.layout().strides()[1] == 1
}

device_test! {
    fn batch_norm_relu_backward_with_recomputed_mask_matches_composition(dev: Device) {
        let eps = 1e-5;
        for case in cases(dev) {
            let name = case.name;
            for dtype in [DType::F32, DType::BF16, DType::F64] {
                let (x, dy) = (case.prepare(&case.x, dtype), case.prepare(&case.dy, dtype));
                let channels = x.dims()[1];
                let (w, b) = weight_and_bias(channels, dev, dtype);
                let what = format!("batch_norm_relu {name} {dtype}");
                let (out, mean, var, mask) = x.batch_norm_relu_training_with_mask(Some(&w), Some(&b), eps);
                // The forward is the plain fused one, and ReLU of the unfused one, bit for bit.
                let (plain, _, _) = x.batch_norm_relu_training(Some(&w), Some(&b), eps);
                assert_eq!(out.to_f64_vec(), plain.to_f64_vec(), "{what}: forward");
                let (bn, _, _) = x.batch_norm_training(Some(&w), Some(&b), eps);
                assert_eq!(out.to_f64_vec(), bn.relu().to_f64_vec(), "{what}: forward against relu(batch_norm)");
                match &mask {
                    ReluMask::Recompute(_) => assert!(fused_on(&x), "{what}: recomputed mask off the fused path"),
                    ReluMask::Output(_) => assert!(!fused_on(&x), "{what}: the fused path keeps the output"),
                }
                // The composition it replaces, and the definition in f64.
                let masked = dy.threshold_backward(&out, 0.0);
                let (cdx, cdw, cdb) = masked.batch_norm_backward(&x, (&mean, &var), Some(&w), eps, true);
                let wv = w.to_f64_vec();
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&masked, &x, &wv, eps);
                let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
                for keep in [false, true] {
                    let (dx, dw, db, kept) =
                        dy.batch_norm_relu_backward_with(&mask, &x, (&mean, &var), Some(&w), eps, true, keep);
                    let dx = dx.expect("input gradient asked for");
                    check(&dx, &cdx.clone().unwrap(), dtype, &format!("{what} dx against the composition"));
                    check(&dx, &as_t(want_dx.clone(), x.dims()), dtype, &format!("{what} dx"));
                    check(&dw, &cdw, dtype, &format!("{what} dweight against the composition"));
                    check(&dw, &as_t(want_dw.clone(), &[channels]), dtype, &format!("{what} dweight"));
                    check(&db, &cdb, dtype, &format!("{what} dbias against the composition"));
                    check(&db, &as_t(want_db.clone(), &[channels]), dtype, &format!("{what} dbias"));
                    if fused_on(&x) {
                        assert_eq!(dx.layout().strides(), x.layout().strides(), "{what}: dx keeps x's layout");
                    }
                    match kept {
                        Some(k) => {
                            assert!(keep, "{what}: masked gradient not asked for");
                            assert_eq!(k.to_f64_vec(), masked.to_f64_vec(), "{what}: the kept masked gradient");
                        }
                        None => assert!(!keep, "{what}: masked gradient asked for"),
                    }
                }
                let (none, _, _, _) = dy.batch_norm_relu_backward_with(&mask, &x, (&mean, &var), Some(&w), eps, false, false);
                assert!(none.is_none(), "{what}: no input gradient asked for");
            }
        }
    }
}

device_test! {
    fn batch_norm_add_relu_backward_matches_composition(dev: Device) {
        let eps = 1e-5;
        for case in cases(dev) {
            let name = case.name;
            for dtype in [DType::F32, DType::BF16, DType::F64] {
                let (x, dy, res) = (case.prepare(&case.x, dtype), case.prepare(&case.dy, dtype), case.prepare(&case.res, dtype));
                let channels = x.dims()[1];
                let (w, b) = weight_and_bias(channels, dev, dtype);
                let what = format!("batch_norm_add_relu {name} {dtype}");
                let (y, mean, var) = x.batch_norm_add_relu_training(Some(&w), Some(&b), &res, eps);
                let masked = dy.threshold_backward(&y, 0.0);
                let (cdx, cdw, cdb) = masked.batch_norm_backward(&x, (&mean, &var), Some(&w), eps, true);
                let wv = w.to_f64_vec();
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&masked, &x, &wv, eps);
                let as_t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, dev).unwrap().to_dtype(dtype);
                // dy packed like x, and row-major (copied into x's order first).
                for (dy_name, dy) in [("dy like x", dy.clone()), ("dy row-major", dy.contiguous())] {
                    for keep in [true, false] {
                        let what = format!("{what} {dy_name} keep {keep}");
                        let (dx, dw, db, kept) =
                            dy.batch_norm_relu_backward(&y, &x, (&mean, &var), Some(&w), eps, true, keep);
                        let dx = dx.expect("input gradient asked for");
                        check(&dx, &cdx.clone().unwrap(), dtype, &format!("{what}: dx against the composition"));
                        check(&dx, &as_t(want_dx.clone(), x.dims()), dtype, &format!("{what}: dx"));
                        check(&dw, &cdw, dtype, &format!("{what}: dweight against the composition"));
                        check(&dw, &as_t(want_dw.clone(), &[channels]), dtype, &format!("{what}: dweight"));
                        check(&db, &cdb, dtype, &format!("{what}: dbias against the composition"));
                        check(&db, &as_t(want_db.clone(), &[channels]), dtype, &format!("{what}: dbias"));
                        match kept {
                            Some(k) => {
                                assert!(keep, "{what}: masked gradient not asked for");
                                assert_eq!(k.to_f64_vec(), masked.to_f64_vec(), "{what}: the kept masked gradient");
                                if fused_on(&x) {
                                    assert_eq!(k.layout().strides(), x.layout().strides(), "{what}: masked layout");
                                }
                            }
                            None => assert!(!keep, "{what}: masked gradient asked for"),
                        }
                    }
                }
                // The gradient in two parts (dy and the residual as a second part): the same
                // as their sum, which `add` rounds to the dtype first.
                assert_eq!(x.batch_norm_relu_fuses_addend(), fused_on(&x), "{what}: where the addend is read");
                let sum = dy.add(&res);
                let masked_sum = sum.threshold_backward(&y, 0.0);
                let (sdx, sdw, sdb) = masked_sum.batch_norm_backward(&x, (&mean, &var), Some(&w), eps, true);
                let (want_dx, want_dw, want_db) = batch_norm_backward_loop(&masked_sum, &x, &wv, eps);
                let (dx, dw, db, kept) =
                    dy.batch_norm_relu_backward_plus(&res, &y, &x, (&mean, &var), Some(&w), eps, true, true);
                let what = format!("{what} dy in two parts");
                let dx = dx.expect("input gradient asked for");
                check(&dx, &sdx.unwrap(), dtype, &format!("{what}: dx against the composition"));
                check(&dx, &as_t(want_dx, x.dims()), dtype, &format!("{what}: dx"));
                check(&dw, &sdw, dtype, &format!("{what}: dweight against the composition"));
                check(&dw, &as_t(want_dw, &[channels]), dtype, &format!("{what}: dweight"));
                check(&db, &sdb, dtype, &format!("{what}: dbias against the composition"));
                check(&db, &as_t(want_db, &[channels]), dtype, &format!("{what}: dbias"));
                let kept = kept.expect("masked gradient asked for");
                assert_eq!(kept.to_f64_vec(), masked_sum.to_f64_vec(), "{what}: the kept masked gradient");
            }
        }
    }
}

/// Channels-last `[2, 16, 3, 5]` whose channels hold 0 and pairs `a, -a` (so each channel's
/// mean is exactly 0 and the zeros normalise to exactly 0), with biases that put the ReLU's
/// input on 0 and on the edge of what the storage type rounds to 0: the recomputed mask must
/// agree with the stored output there too.
fn edge_case(dev: Device, dtype: DType) -> (Tensor, Tensor, Tensor) {
    let (n, c, hw) = (2, 16, 15);
    let value = |p: usize| {
        let a = |q: usize| 1.0 + (q % 7) as f64 / 8.0;
        match p % 3 {
            0 => 0.0,
            1 => a(p),
            _ => -a(p - 1),
        }
    };
    // Element (i, k, h, w) is position i * hw + h * 5 + w of channel k.
    let x: Vec<f64> = (0..n * c * hw).map(|e| value((e / (c * hw)) * hw + e % hw)).collect();
    let x = channels_last(&Tensor::from_vec(x, [n, c, 3, 5], dev).unwrap().to_dtype(dtype));
    let tiny =
        [0.0, -0.0, 1e-45, 2f64.powi(-134), 2f64.powi(-133), 3.0 * 2f64.powi(-135), 2f64.powi(-25), 1e-30];
    let b: Vec<f64> = (0..c).map(|k| if k < tiny.len() { tiny[k] } else { -tiny[k - tiny.len()] }).collect();
    let w: Vec<f64> = (0..c).map(|k| 0.75 + 0.0625 * k as f64).collect();
    let t = |v: Vec<f64>| Tensor::from_vec(v, [c], dev).unwrap().to_dtype(DType::F32);
    (x, t(w), t(b))
}

device_test! {
    fn batch_norm_relu_recomputed_mask_agrees_at_zero(dev: Device) {
        let eps = 1e-5;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let (x, w, b) = edge_case(dev, dtype);
            // dy = 1: dbias counts where the gradient passed, exactly (30 values per channel).
            let dy = channels_last(&Tensor::ones(x.dims(), dtype, dev).unwrap());
            let (out, mean, var, mask) = x.batch_norm_relu_training_with_mask(Some(&w), Some(&b), eps);
            let what = format!("edge case {dtype}");
            let masked = dy.threshold_backward(&out, 0.0);
            let (cdx, _, cdb) = masked.batch_norm_backward(&x, (&mean, &var), Some(&w), eps, true);
            let (dx, _, db, _) = dy.batch_norm_relu_backward_with(&mask, &x, (&mean, &var), Some(&w), eps, true, false);
            assert_eq!(db.to_f64_vec(), cdb.to_f64_vec(), "{what}: where the gradient passed, per channel");
            check(&dx.unwrap(), &cdx.unwrap(), dtype, &format!("{what}: dx"));
            let passed: f64 = cdb.to_f64_vec().iter().sum();
            assert!(passed > 0.0 && passed < x.elem_count() as f64, "{what}: the case masks some and not all");
        }
    }
}
