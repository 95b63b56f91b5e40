//! The fused products (`fused.rs`) against their composition in f64 on the CPU, from the same
//! (rounded) inputs: on CUDA the cuBLASLt epilogues where the shapes are aligned, the fallback
//! where they are not, transposed and narrowed operands, and NaN/inf.

use super::tests::rand;
use crate::testing::assert_close;
use crate::*;

const DTYPES: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::F64];

fn f64_cpu(t: &Tensor) -> Tensor {
    t.to_device(Device::Cpu).unwrap().to_dtype(DType::F64)
}

/// `(rtol, atol)` for a product's result of magnitude up to about 8: the composition rounds
/// after the product and again after the elementwise op, the epilogue once; `gelu` adds the
/// error of cuBLASLt's tanh in its GELU epilogue, which is not correctly rounded in f32.
fn tol(dtype: DType, gelu: bool) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 if gelu => (1e-3, 1e-3),
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (4e-3, 1e-2),
        _ => (2e-2, 5e-2),
    }
}

/// Checks column sums `got [n]` against `want_terms [rows, n]` summed in f64: each term may be
/// off by its dtype's rounding (twice for a composed term), and the sum by one more rounding.
#[track_caller]
fn assert_sums_close(got: &Tensor, want_terms: &Tensor, dtype: DType, what: &str) {
    let n = want_terms.dims()[1];
    assert_eq!(got.dims(), [n], "{what}: shape");
    let unit = match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-3,
        DType::F16 => 2f64.powi(-9),
        _ => 2f64.powi(-7),
    };
    let (got, terms) = (f64_cpu(got).to_vec::<f64>(), want_terms.to_vec::<f64>());
    for (j, &value) in got.iter().enumerate() {
        let column = terms.iter().skip(j).step_by(n);
        let (sum, abs) = column.fold((0.0, 0.0), |(s, a), &t| (s + t, a + t.abs()));
        let ok = (value - sum).abs() <= unit * abs + 1e-12;
        assert!(ok, "{what}: sum {j} is {value}, expected {sum} (terms' absolute sum {abs})");
    }
}

/// `(what, x, w, bias)`: inputs of `x @ w + bias` covering the layouts a linear layer meets.
fn linear_cases(dtype: DType, dev: Device) -> Vec<(&'static str, Tensor, Tensor, Tensor)> {
    let r = |shape: &[usize], seed: u64| rand(shape, seed, dtype, dev);
    vec![
        ("aligned", r(&[64, 32], 1), r(&[32, 48], 2), r(&[48], 3)),
        ("3-d input, 39 rows", r(&[3, 13, 24], 4), r(&[24, 40], 5), r(&[40], 6)),
        ("dims not multiples of 8", r(&[7, 5], 7), r(&[5, 9], 8), r(&[9], 9)),
        ("transposed input", r(&[32, 40], 10).t(), r(&[32, 16], 11), r(&[16], 12)),
        ("weight stored [out, in]", r(&[20, 16], 13), r(&[24, 16], 14).t(), r(&[24], 15)),
        (
            "column slice of a wider weight",
            r(&[16, 32], 16),
            r(&[32, 96], 17).narrow(1, 32, 32),
            r(&[96], 18).narrow(0, 32, 32),
        ),
        ("one row", r(&[1, 32], 19), r(&[32, 8], 20), r(&[8], 21)),
    ]
}

/// Counts the epilogue products `f` runs on this thread.
fn epilogues_in(f: impl FnOnce()) -> usize {
    let before = cuda::epilogue_products_on_this_thread();
    f();
    cuda::epilogue_products_on_this_thread() - before
}

/// Whether an aligned bf16 case must take the epilogue: on CUDA, unless the user switched
/// cuBLASLt or its epilogues off. (Other dtypes may fall back where cuBLASLt has no fused
/// kernel; their values are checked all the same.)
fn expect_fused(dev: Device, dtype: DType, what: &str) -> bool {
    let off = |v: &str| std::env::var(v).is_ok_and(|v| !v.is_empty() && v != "0");
    dev.is_cuda()
        && dtype == DType::BF16
        && what == "aligned"
        && !off("OXTRAIN_DISABLE_CUBLASLT")
        && !off("OXTRAIN_DISABLE_EPILOGUES")
}

device_test! {
    fn matmul_bias_is_the_product_plus_the_bias(dev: Device) {
        for dtype in DTYPES {
            for (what, x, w, b) in linear_cases(dtype, dev) {
                let what = format!("{dtype} {what}");
                let mut got = None;
                let fused = epilogues_in(|| got = Some(x.matmul_bias(&w, &b)));
                let got = got.unwrap();
                let want = f64_cpu(&x).matmul(&f64_cpu(&w)).add(&f64_cpu(&b));
                assert_eq!((got.dtype(), got.device()), (dtype, dev), "{what}");
                let (rtol, atol) = tol(dtype, false);
                assert_close(&f64_cpu(&got), &want, rtol, atol, &what);
                if expect_fused(dev, dtype, what.split_once(' ').unwrap().1) {
                    assert_eq!(fused, 1, "{what}: the bias epilogue was not used");
                }
            }
        }
    }
}

device_test! {
    fn matmul_bias_keeps_nan_and_infinity(dev: Device) {
        for dtype in [DType::F32, DType::BF16] {
            let x = rand(&[16, 16], 1, DType::F64, Device::Cpu);
            let mut b = rand(&[8], 2, DType::F64, Device::Cpu).to_vec::<f64>();
            b[3] = f64::INFINITY;
            let mut xv = x.to_vec::<f64>();
            xv[0] = f64::NAN;
            let x = Tensor::from_vec(xv, [16, 16], dev).unwrap().to_dtype(dtype);
            let b = Tensor::from_vec(b, [8], dev).unwrap().to_dtype(dtype);
            let w = rand(&[16, 8], 3, dtype, dev);
            let got = f64_cpu(&x.matmul_bias(&w, &b));
            let want = f64_cpu(&x).matmul(&f64_cpu(&w)).add(&f64_cpu(&b));
            let (rtol, atol) = tol(dtype, false);
            // Row 0 is NaN throughout, column 3 infinite below it.
            assert_close(&got, &want, rtol, atol, &format!("{dtype} NaN input, infinite bias"));
            assert!(want.to_vec::<f64>()[8 + 3] == f64::INFINITY && want.to_vec::<f64>()[1].is_nan());
        }
    }
}

device_test! {
    fn matmul_bias_gelu_tanh_is_gelu_of_the_biased_product(dev: Device) {
        for dtype in DTYPES {
            for (what, x, w, b) in linear_cases(dtype, dev) {
                let what = format!("{dtype} {what}");
                let mut got = None;
                let fused = epilogues_in(|| got = Some(x.matmul_bias_gelu_tanh(&w, &b)));
                let (out, pre) = got.unwrap();
                let want_pre = f64_cpu(&x).matmul(&f64_cpu(&w)).add(&f64_cpu(&b));
                assert_eq!((out.dtype(), pre.dtype()), (dtype, dtype), "{what}");
                let (rtol, atol) = tol(dtype, true);
                assert_close(&f64_cpu(&pre), &want_pre, rtol, atol, &format!("{what}: pre-activation"));
                // The GELU of the rounded pre-activation, as the composition computes it.
                let want_out = f64_cpu(&pre).gelu_tanh();
                assert_close(&f64_cpu(&out), &want_out, rtol, atol, &format!("{what}: output"));
                if expect_fused(dev, dtype, what.split_once(' ').unwrap().1) {
                    assert_eq!(fused, 1, "{what}: the GELU epilogue was not used");
                }
            }
        }
    }
}

/// `(what, g, rhs, pre)`: the gradient `g [.., k]` of a product `h @ rhs^T`-style layer, the
/// matrix it is multiplied by (`rhs [k, n]`, the next layer's weight transposed), and the
/// GELU's input `pre [.., n]`.
fn gelu_grad_cases(dtype: DType, dev: Device) -> Vec<(&'static str, Tensor, Tensor, Tensor)> {
    let r = |shape: &[usize], seed: u64| rand(shape, seed, dtype, dev);
    // Pre-activations over [-3, 3), where GELU's derivative changes most.
    let p = |shape: &[usize], seed: u64| rand(shape, seed, DType::F64, dev).affine(3.0, 0.0).to_dtype(dtype);
    vec![
        ("aligned", r(&[64, 32], 1), r(&[48, 32], 2).t(), p(&[64, 48], 3)),
        ("3-d gradient", r(&[2, 9, 16], 4), r(&[16, 24], 5), p(&[2, 9, 24], 6)),
        ("dims not multiples of 8", r(&[5, 7], 7), r(&[7, 3], 8), p(&[5, 3], 9)),
        ("pre a column slice", r(&[16, 16], 10), r(&[16, 48], 11), p(&[16, 96], 12).narrow(1, 0, 48)),
    ]
}

device_test! {
    fn matmul_gelu_tanh_backward_is_the_gelu_gradient_and_its_sums(dev: Device) {
        for dtype in DTYPES {
            for (what, g, rhs, pre) in gelu_grad_cases(dtype, dev) {
                let what = format!("{dtype} {what}");
                let (d, sums) = g.matmul_gelu_tanh_backward(&rhs, &pre);
                let want = f64_cpu(&g).matmul(&f64_cpu(&rhs)).gelu_backward(&f64_cpu(&pre), true);
                assert_eq!((d.dtype(), sums.dtype(), d.dims()), (dtype, dtype, pre.dims()), "{what}");
                let (rtol, atol) = tol(dtype, true);
                assert_close(&f64_cpu(&d), &want, rtol, atol, &format!("{what}: gradient"));
                let n = want.dims()[want.rank() - 1];
                assert_sums_close(&sums, &want.reshape([want.elem_count() / n, n]), dtype, &format!("{what}: sums"));
            }
        }
    }
}

device_test! {
    fn weight_gradients_come_with_their_bias_gradients(dev: Device) {
        for dtype in DTYPES {
            let r = |shape: &[usize], seed: u64| rand(shape, seed, dtype, dev);
            // (what, x [rows, k], g [rows, n]): rows odd in the second, so k of the product is.
            for (what, x, g) in [
                ("aligned", r(&[64, 32], 1), r(&[64, 48], 2)),
                ("37 rows", r(&[37, 8], 3), r(&[37, 16], 4)),
                ("dims not multiples of 8", r(&[5, 3], 5), r(&[5, 7], 6)),
            ] {
                let what = format!("{dtype} {what}");
                let (x64, g64) = (f64_cpu(&x), f64_cpu(&g));
                let (rtol, atol) = tol(dtype, false);
                // A weight stored [in, out]: x^T @ g, and g's column sums.
                let (dw, db) = x.t().matmul_and_rhs_col_sums(&g);
                assert_close(&f64_cpu(&dw), &x64.t().matmul(&g64), rtol, atol, &format!("{what}: x^T g"));
                assert_sums_close(&db, &g64, dtype, &format!("{what}: g's column sums"));
                // A weight stored [out, in]: g^T @ x, and the same sums from the lhs.
                let (dw, db) = g.t().matmul_and_lhs_row_sums(&x);
                assert_close(&f64_cpu(&dw), &g64.t().matmul(&x64), rtol, atol, &format!("{what}: g^T x"));
                assert_sums_close(&db, &g64, dtype, &format!("{what}: g^T's row sums"));
            }
        }
    }
}

device_test! {
    fn cross_entropy_gradient_keeps_the_padded_rows_of_a_head(dev: Device) {
        let (rows, vocab) = (6, 130);
        // A head's logits: the first `vocab` columns of rows 256 apart (a padded product's).
        let buffer = rand(&[rows, 256], 1, DType::F32, dev);
        let logits = buffer.narrow(1, 0, vocab);
        let targets = Tensor::from_vec(vec![0i64, 129, 5, -100, 64, 7], [rows], dev).unwrap();
        let (_, lse) = logits.cross_entropy_rows(&targets, -100, 0.0);
        let weight = Tensor::full([rows], 0.25, DType::F32, dev).unwrap();
        let grad = logits.cross_entropy_rows_backward(&targets, &lse, &weight, -100, 0.0);
        // On CUDA the gradient keeps the logits' row stride for the head's backward products.
        let stride = if dev.is_cuda() { 256 } else { vocab };
        assert_eq!((grad.dims(), grad.strides()), (&[rows, vocab][..], &[stride, 1][..]));
        // The same gradient as from contiguous logits on the CPU.
        let plain = logits.to_device(Device::Cpu).unwrap().contiguous();
        let (t, l, w) = (targets.to_device(Device::Cpu).unwrap(), lse.to_device(Device::Cpu).unwrap(), weight.to_device(Device::Cpu).unwrap());
        let want = plain.cross_entropy_rows_backward(&t, &l, &w, -100, 0.0);
        assert_close(&grad.to_device(Device::Cpu).unwrap(), &want, 1e-5, 1e-7, "gradient");
        if dev.is_cuda() {
            // The pad columns hold zeros, so a product over the whole padded rows (the head's
            // input gradient through a zero-padded weight) reads no garbage.
            let pads = grad.as_strided(&[rows, stride], &[stride, 1], grad.layout().offset()).narrow(1, vocab, stride - vocab);
            assert!(pads.to_f64_vec().iter().all(|&x| x.to_bits() == 0), "pad columns are zero");
        }
    }
}

device_test! {
    #[should_panic(expected = "matmul_bias: input of shape [4, 6] does not fit a weight of shape [5, 3] ([in, out])")]
    fn matmul_bias_names_mismatched_shapes(dev: Device) {
        let r = |shape: &[usize]| rand(shape, 1, DType::F32, dev);
        r(&[4, 6]).matmul_bias(&r(&[5, 3]), &r(&[3]));
    }
}

device_test! {
    #[should_panic(expected = "matmul_bias: bias of shape [4] for 3 outputs")]
    fn matmul_bias_names_a_bias_of_the_wrong_length(dev: Device) {
        let r = |shape: &[usize]| rand(shape, 1, DType::F32, dev);
        r(&[4, 5]).matmul_bias(&r(&[5, 3]), &r(&[4]));
    }
}

/// GPT-2's MLP shapes (a few rows of tokens) in bf16: every fused product must take its
/// epilogue (the gradient ones are asserted only here). A failure here means cuBLASLt refused an epilogue: the values stay right (the
/// composition runs instead) but the time it saves is lost.
#[test]
#[ignore = "needs a CUDA GPU"]
fn epilogues_run_for_gpt2_shaped_bf16_products() {
    let dev = Device::Cuda(0);
    if !expect_fused(dev, DType::BF16, "aligned") {
        return;
    }
    let r = |shape: &[usize], seed: u64| rand(shape, seed, DType::BF16, dev);
    let (x, w_fc, b_fc, w_proj, b_proj) =
        (r(&[256, 768], 1), r(&[768, 3072], 2), r(&[3072], 3), r(&[3072, 768], 4), r(&[768], 5));
    let mut refused = Vec::new();
    let mut run = |name: &str, f: &mut dyn FnMut()| {
        if epilogues_in(f) != 1 {
            refused.push(name.to_string());
        }
    };
    let (mut h, mut pre) = (None, None);
    run("GELU_AUX_BIAS", &mut || {
        let (a, b) = x.matmul_bias_gelu_tanh(&w_fc, &b_fc);
        (h, pre) = (Some(a), Some(b));
    });
    let (h, pre) = (h.unwrap(), pre.unwrap());
    run("BIAS", &mut || drop(h.matmul_bias(&w_proj, &b_proj)));
    let g = r(&[256, 768], 6);
    // The GELU backward epilogue runs only when asked for (slower than its composition).
    if std::env::var("OXTRAIN_DGELU_EPILOGUE").is_ok_and(|v| !v.is_empty() && v != "0") {
        run("DGELU_BGRAD or DGELU", &mut || drop(g.matmul_gelu_tanh_backward(&w_proj.t(), &pre)));
    }
    run("BGRADA", &mut || drop(h.t().matmul_and_rhs_col_sums(&g)));
    run("BGRADB", &mut || drop(g.t().matmul_and_lhs_row_sums(&h)));
    assert!(refused.is_empty(), "cuBLASLt refused these epilogues (their compositions ran): {refused:?}");
}
