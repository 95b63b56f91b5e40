//! Tests of layer norm's fused forms (`layer_norm_to`, `add_layer_norm`,
//! `layer_norm_backward_with`): f64 loops are the reference, and the unfused ops (casts, the
//! add, layer norm and its backward) must give the same bits, since the fused kernels do the
//! same f32 arithmetic and round once. Rows of 1, 33, 100, 1000 and GPT-2's 768 elements (not
//! multiples of the 32 lanes or of the values per lane), strided inputs, a NaN, no rows, and
//! more rows than the CUDA backward has warps.

use super::tests::random;
use crate::testing::{assert_close, tolerance};
use crate::{device_test, DType, Device, LayerNormGradOptions, Tensor};

const EPS: f64 = 1e-5;

/// Layer norm of rows of `len` in f64: `(out, mean, rstd)`.
fn forward_loop(
    x: &[f64],
    len: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut out, mut means, mut rstds) = (Vec::with_capacity(x.len()), vec![], vec![]);
    for row in x.chunks(len) {
        let mean = row.iter().sum::<f64>() / len as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + EPS).sqrt();
        let affine = |j: usize, v: f64| (v - mean) * rstd * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]);
        out.extend(row.iter().enumerate().map(|(j, &v)| affine(j, v)));
        means.push(mean);
        rstds.push(rstd);
    }
    (out, means, rstds)
}

/// A reference result and the size of what its computation adds up (the sum of magnitudes of
/// the terms), against which f32 rounding is judged.
struct Expected {
    value: Vec<f64>,
    scale: Vec<f64>,
}

/// Layer norm's gradients in f64 from their definition (statistics from `x`), with `residual`
/// added to dx: `(dx, dweight, dbias)`.
fn backward_loop(
    dy: &[f64],
    x: &[f64],
    len: usize,
    w: Option<&[f64]>,
    residual: Option<&[f64]>,
) -> (Expected, Expected, Expected) {
    let zeros = |n: usize| Expected { value: vec![0.0; n], scale: vec![0.0; n] };
    let (mut dx, mut dw, mut db) = (zeros(x.len()), zeros(len), zeros(len));
    for r in 0..x.len().checked_div(len).unwrap_or(0) {
        let (xs, gs) = (&x[r * len..(r + 1) * len], &dy[r * len..(r + 1) * len]);
        let mean = xs.iter().sum::<f64>() / len as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + EPS).sqrt();
        let xhat: Vec<f64> = xs.iter().map(|v| (v - mean) * rstd).collect();
        let gy: Vec<f64> = gs.iter().enumerate().map(|(j, g)| g * w.map_or(1.0, |w| w[j])).collect();
        let mean_gy = gy.iter().sum::<f64>() / len as f64;
        let mean_gyx = gy.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / len as f64;
        let abs_gy = gy.iter().map(|g| g.abs()).sum::<f64>() / len as f64;
        let abs_gyx = gy.iter().zip(&xhat).map(|(g, h)| (g * h).abs()).sum::<f64>() / len as f64;
        for j in 0..len {
            let res = residual.map_or(0.0, |res| res[r * len + j]);
            dx.value[r * len + j] = rstd * (gy[j] - mean_gy - xhat[j] * mean_gyx) + res;
            dx.scale[r * len + j] = rstd * (gy[j].abs() + abs_gy + xhat[j].abs() * abs_gyx) + res.abs();
            dw.value[j] += gs[j] * xhat[j];
            dw.scale[j] += (gs[j] * xhat[j]).abs();
            db.value[j] += gs[j];
            db.scale[j] += gs[j].abs();
        }
    }
    (dx, dw, db)
}

/// Asserts `got` (of `dtype`) is within rounding of `want`: f32 results within a few units of
/// 2^-24 of the magnitudes summed (`2e-6 * scale`, which a wrong term of the sum exceeds),
/// 16-bit results within their own tolerance.
#[track_caller]
fn assert_rounding_close(got: &Tensor, want: &Expected, dtype: DType, what: &str) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let (rtol, atol) = tolerance(dtype);
    for (i, (g, (w, s))) in got.to_f64_vec().iter().zip(want.value.iter().zip(&want.scale)).enumerate() {
        let allowed = if dtype == DType::F32 { 2e-6 * s + 1e-7 } else { atol + rtol * w.abs() };
        assert!((g - w).abs() <= allowed, "{what}: element {i} is {g}, expected {w} (allowed {allowed})");
    }
}

fn tensor(v: Vec<f64>, dims: &[usize], dev: Device) -> Tensor {
    Tensor::from_vec(v, dims, dev).unwrap()
}

/// The bits of `t`'s elements, widened exactly: equal for equal tensors of one dtype.
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

device_test! {
    fn layer_norm_to_is_the_cast_of_f32_layer_norm_and_matches_f64(dev: Device) {
        for (seed, (rows, len)) in [(5, 1), (7, 33), (9, 100), (4, 768), (3, 1000)].into_iter().enumerate() {
            let seed = 10 * seed as u64;
            let base = random(&[rows, len], seed, 3.0, 2.0, dev);
            let (w, b) = (random(&[len], seed + 1, 1.0, 0.5, dev), random(&[len], seed + 2, 0.0, 0.5, dev));
            let (wv, bv) = (w.to_f64_vec(), b.to_f64_vec());
            for in_dtype in FLOATS {
                let x = base.to_dtype(in_dtype);
                let (want, want_mean, want_rstd) = forward_loop(&x.to_f64_vec(), len, Some(&wv), Some(&bv));
                // The f32 layer norm of the widened input, which every output dtype rounds.
                let (wide, wide_mean, wide_rstd) = x.to_dtype(DType::F32).layer_norm([len], Some(&w), Some(&b), EPS);
                for out_dtype in FLOATS {
                    let what = format!("[{rows}, {len}] {in_dtype} -> {out_dtype}");
                    let (out, mean, rstd) = x.layer_norm_to([len], Some(&w), Some(&b), EPS, out_dtype);
                    assert_eq!((mean.dtype(), mean.dims()), (DType::F32, &[rows, 1][..]), "{what}: mean");
                    assert_eq!(bits(&out), bits(&wide.to_dtype(out_dtype)), "{what}: one rounding of the f32 result");
                    assert_eq!((bits(&mean), bits(&rstd)), (bits(&wide_mean), bits(&wide_rstd)), "{what}: statistics");
                    let (rtol, atol) = if out_dtype == DType::F32 { (1e-5, 1e-5) } else { tolerance(out_dtype) };
                    assert_close(&out, &tensor(want.clone(), &[rows, len], dev), rtol, atol, &format!("{what}: out"));
                    assert_close(&mean, &tensor(want_mean.clone(), &[rows, 1], dev), 1e-6, 1e-6, &format!("{what}: mean"));
                    assert_close(&rstd, &tensor(want_rstd.clone(), &[rows, 1], dev), 1e-5, 1e-6, &format!("{what}: rstd"));
                }
            }
        }
    }
}

device_test! {
    fn layer_norm_to_reads_a_strided_input_and_keeps_a_nan_in_its_row(dev: Device) {
        // [40, 6] seen transposed: 6 rows of 40, not contiguous; row 2 holds a NaN.
        let mut v = random(&[40, 6], 3, -1.0, 3.0, Device::Cpu).to_f64_vec();
        v[7 * 6 + 2] = f64::NAN;
        let x = tensor(v, &[40, 6], dev).to_dtype(DType::F32).transpose(0, 1);
        assert!(!x.is_contiguous());
        let w = random(&[40], 4, 1.0, 0.5, dev);
        let (out, mean, _) = x.layer_norm_to([40], Some(&w), None, EPS, DType::BF16);
        let (want, want_mean, _) = forward_loop(&x.to_f64_vec(), 40, Some(&w.to_f64_vec()), None);
        let (rtol, atol) = tolerance(DType::BF16);
        assert_close(&out, &tensor(want, &[6, 40], dev), rtol, atol, "strided out");
        assert_close(&mean, &tensor(want_mean, &[6, 1], dev), 1e-6, 1e-6, "strided mean");
        assert!(out.to_f64_vec()[80..120].iter().all(|v| v.is_nan()), "the NaN's row is NaN");
    }
}

device_test! {
    fn add_layer_norm_equals_add_then_layer_norm(dev: Device) {
        use DType::*;
        let pairs = [(F32, BF16, BF16), (F32, F32, F32), (BF16, BF16, BF16), (F16, F32, F16), (F32, BF16, F32)];
        for (seed, (rows, len)) in [(6usize, 33usize), (4, 768), (3, 1000)].into_iter().enumerate() {
            let seed = 100 + 10 * seed as u64;
            let (w, b) = (random(&[len], seed, 1.0, 0.5, dev), random(&[len], seed + 1, 0.0, 0.5, dev));
            for (x_dtype, y_dtype, out_dtype) in pairs {
                let what = format!("[{rows}, {len}] {x_dtype} + {y_dtype} -> {out_dtype}");
                let x = random(&[rows, len], seed + 2, 1.0, 2.0, dev).to_dtype(x_dtype);
                let y = random(&[rows, len], seed + 3, -0.5, 1.0, dev).to_dtype(y_dtype);
                let (sum, out, mean, rstd) = x.add_layer_norm(&y, [len], Some(&w), Some(&b), EPS, out_dtype);
                let promoted = if x_dtype == y_dtype { x_dtype } else { F32 };
                let want_sum = x.to_dtype(promoted).add(&y.to_dtype(promoted));
                assert_eq!(sum.dtype(), promoted, "{what}: the sum's dtype");
                assert_eq!(bits(&sum), bits(&want_sum), "{what}: sum");
                let (want_out, want_mean, want_rstd) = want_sum.layer_norm_to([len], Some(&w), Some(&b), EPS, out_dtype);
                assert_eq!(bits(&out), bits(&want_out), "{what}: out");
                assert_eq!((bits(&mean), bits(&rstd)), (bits(&want_mean), bits(&want_rstd)), "{what}: statistics");
                let (reference, _, _) = forward_loop(&want_sum.to_f64_vec(), len, Some(&w.to_f64_vec()), Some(&b.to_f64_vec()));
                let (rtol, atol) = if out_dtype == F32 { (1e-5, 1e-5) } else { tolerance(out_dtype) };
                assert_close(&out, &tensor(reference, &[rows, len], dev), rtol, atol, &format!("{what}: against f64"));
            }
        }
        // A strided addend, and one that broadcasts (the unfused path).
        let x = random(&[5, 33], 7, 0.0, 1.0, dev).to_dtype(F32);
        for y in [random(&[33, 5], 8, 0.0, 1.0, dev).to_dtype(BF16).transpose(0, 1), random(&[33], 9, 0.0, 1.0, dev).to_dtype(F32)] {
            let (sum, out, _, _) = x.add_layer_norm(&y, [33], None, None, EPS, BF16);
            let want_sum = x.add(&y.to_dtype(F32));
            assert_eq!(bits(&sum), bits(&want_sum), "sum with an addend of shape {:?}", y.dims());
            assert_eq!(bits(&out), bits(&want_sum.layer_norm_to([33], None, None, EPS, BF16).0), "out");
        }
    }
}

device_test! {
    fn layer_norm_backward_with_matches_f64_and_the_unfused_backward(dev: Device) {
        use DType::*;
        // (rows, len, dy's dtype, x's dtype, weight, residual, lowered dx): 2500 rows are more
        // than the CUDA backward's warps, so warps sum several rows per column.
        let cases = [
            (74, 33, F32, F32, true, true, Some(BF16)),
            (2500, 33, BF16, F32, true, true, Some(BF16)),
            (64, 768, BF16, F32, true, true, Some(BF16)),
            (40, 1000, F32, BF16, false, false, None),
            (9, 100, F16, F16, true, false, Some(F32)),
            (3, 1, F32, F32, true, true, None),
        ];
        for (seed, (rows, len, dy_dtype, x_dtype, has_weight, has_residual, lowered)) in cases.into_iter().enumerate() {
            let what = format!("[{rows}, {len}] dy {dy_dtype}, x {x_dtype}");
            let seed = 200 + 10 * seed as u64;
            let x = random(&[rows, len], seed, 3.0, 2.0, dev).to_dtype(x_dtype);
            let dy = random(&[rows, len], seed + 1, 0.0, 1.0, dev).to_dtype(dy_dtype);
            let w = has_weight.then(|| random(&[len], seed + 2, 1.0, 0.5, dev));
            let residual = has_residual.then(|| random(&[rows, len], seed + 3, 0.0, 1.0, dev).to_dtype(x_dtype));
            let (_, mean, rstd) = x.layer_norm_to([len], w.as_ref(), None, EPS, dy_dtype);
            let opts = LayerNormGradOptions { residual: residual.as_ref(), lowered, skip_params: false };
            let g = dy.layer_norm_backward_with(&x, (&mean, &rstd), w.as_ref(), [len], opts);
            let wv = w.as_ref().map(Tensor::to_f64_vec);
            let rv = residual.as_ref().map(Tensor::to_f64_vec);
            let (want_dx, want_dw, want_db) = backward_loop(&dy.to_f64_vec(), &x.to_f64_vec(), len, wv.as_deref(), rv.as_deref());
            assert_rounding_close(&g.dx, &want_dx, x_dtype, &format!("{what}: dx"));
            let (dw, db) = g.params.as_ref().expect("parameter gradients");
            assert_eq!(dw.dims(), &[len], "{what}: dweight's shape");
            assert_rounding_close(dw, &want_dw, F32, &format!("{what}: dweight"));
            assert_rounding_close(db, &want_db, F32, &format!("{what}: dbias"));
            match (lowered, &g.dx_lowered) {
                (None, None) => {}
                // The narrower of dx and its lowered copy is the rounding of the wider.
                (Some(F32), Some(low)) => assert_eq!(bits(&low.to_dtype(x_dtype)), bits(&g.dx), "{what}: dx from its f32 copy"),
                (Some(d), Some(low)) => assert_eq!(bits(low), bits(&g.dx.to_dtype(d)), "{what}: lowered dx"),
                _ => panic!("{what}: a lowered dx exactly when asked"),
            }
            // Unfused: layer norm's own backward, then the residual added to its dx (in f32,
            // so only for an f32 x is that rounded the same way).
            let plain = dy.layer_norm_backward_with(&x, (&mean, &rstd), w.as_ref(), [len], Default::default());
            let (pw, pb) = plain.params.as_ref().expect("parameter gradients");
            assert_eq!((bits(dw), bits(db)), (bits(pw), bits(pb)), "{what}: the parameter gradients of the unfused backward");
            if x_dtype == F32 {
                let unfused = residual.as_ref().map_or(plain.dx.clone(), |r| plain.dx.add(r));
                assert_eq!(bits(&g.dx), bits(&unfused), "{what}: dx of the unfused backward plus the residual");
            }
            // Without the parameter gradients, dx is the same.
            let opts = LayerNormGradOptions { skip_params: true, ..opts };
            let bare = dy.layer_norm_backward_with(&x, (&mean, &rstd), w.as_ref(), [len], opts);
            assert!(bare.params.is_none(), "{what}: no parameter gradients when skipped");
            assert_eq!(bits(&bare.dx), bits(&g.dx), "{what}: dx without the parameter gradients");
        }
    }
}

device_test! {
    fn layer_norm_forms_take_no_rows(dev: Device) {
        let x = Tensor::zeros([0, 33], DType::F32, dev).unwrap();
        let w = random(&[33], 1, 1.0, 0.5, dev);
        let (sum, out, mean, _) = x.add_layer_norm(&x.to_dtype(DType::BF16), [33], Some(&w), None, EPS, DType::BF16);
        assert_eq!((sum.dims(), out.dims(), mean.dims()), (&[0, 33][..], &[0, 33][..], &[0, 1][..]));
        let g = out.layer_norm_backward_with(&sum, (&mean, &mean), Some(&w), [33], Default::default());
        let (dw, db) = g.params.expect("parameter gradients");
        assert_eq!((dw.to_f64_vec(), db.to_f64_vec()), (vec![0.0; 33], vec![0.0; 33]), "sums over no rows");
        assert_eq!(g.dx.dims(), &[0, 33]);
    }
}
