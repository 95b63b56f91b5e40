//! `linear_cross_entropy` against the unfused head and cross-entropy (whose values are checked
//! against PyTorch in oxtrain-nn), against finite differences, and across chunk sizes.

use super::*;
use oxtrain_autograd::{autocast, gradcheck};
use oxtrain_nn::loss::{cross_entropy_with, CrossEntropyOptions};
use oxtrain_tensor::{Device, Distribution, Generator};

const ROWS: usize = 11;
const FEATURES: usize = 5;
const CLASSES: usize = 13;

/// Hidden states, a weight, and targets of which two are ignored.
fn operands(dtype: DType) -> (Tensor, Tensor, Tensor) {
    let mut g = Generator::new(3);
    let h = Distribution::Normal { mean: 0.0, std: 1.0 }
        .sample_with(&mut g, [ROWS, FEATURES], dtype, Device::Cpu)
        .unwrap();
    let w = Distribution::Normal { mean: 0.0, std: 1.0 }
        .sample_with(&mut g, [CLASSES, FEATURES], dtype, Device::Cpu)
        .unwrap()
        .mul_scalar(0.5);
    let mut t: Vec<i64> = (0..ROWS as i64).map(|i| (i * 7 + 2) % CLASSES as i64).collect();
    (t[3], t[8]) = (IGNORE_INDEX, IGNORE_INDEX);
    (h, w, Tensor::from_vec(t, [ROWS], Device::Cpu).unwrap())
}

/// The loss and both gradients: fused with `opts`, or the plain product and cross-entropy with
/// the same loss options.
fn run(h: &Tensor, w: &Tensor, t: &Tensor, opts: &LinearCrossEntropyOptions, fused: bool) -> [Tensor; 3] {
    let (hv, wv) = (Var::parameter(h.clone()), Var::parameter(w.clone()));
    let loss = if fused {
        linear_cross_entropy(&hv, &wv, t, opts)
    } else {
        let ce = CrossEntropyOptions {
            ignore_index: opts.ignore_index,
            label_smoothing: opts.label_smoothing,
            reduction: opts.reduction,
        };
        cross_entropy_with(&hv.matmul(&wv.t()), t, &ce)
    };
    loss.backward();
    [loss.tensor().clone(), hv.grad().unwrap(), wv.grad().unwrap()]
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Every chunk size (one row and one class; 4 classes a block; 4 rows a chunk; all rows; more
/// than all; automatic), both reductions and label smoothing, in f64: the unfused values.
#[test]
fn chunked_equals_the_plain_head_and_loss() {
    let (h, w, t) = operands(DType::F64);
    for reduction in [Reduction::Mean, Reduction::Sum] {
        for label_smoothing in [0.0, 0.1] {
            let base = LinearCrossEntropyOptions { reduction, label_smoothing, ..Default::default() };
            let plain = run(&h, &w, &t, &base, false);
            for chunk_elements in [1, 4 * ROWS, 4 * CLASSES, ROWS * CLASSES, 3 * ROWS * CLASSES, 0] {
                let fused = run(&h, &w, &t, &LinearCrossEntropyOptions { chunk_elements, ..base }, true);
                for (what, (a, b)) in ["loss", "d hidden", "d weight"].iter().zip(plain.iter().zip(&fused)) {
                    let d = max_diff(a, b);
                    assert!(
                        d < 1e-12,
                        "{what}: {reduction:?}, smoothing {label_smoothing}, chunks of {chunk_elements}: off by {d}"
                    );
                }
            }
        }
    }
}

/// The gradients are those of finite differences of the loss (f64).
#[test]
fn gradients_match_finite_differences() {
    let (h, w, t) = operands(DType::F64);
    let opts = LinearCrossEntropyOptions {
        chunk_elements: 4 * CLASSES,
        label_smoothing: 0.05,
        ..Default::default()
    };
    gradcheck(|x| linear_cross_entropy(&x[0], &x[1], &t, &opts), &[h, w], 1e-6, 1e-6).unwrap();
}

/// A weight padded with zero classes (as on CUDA) changes nothing: the pad classes are out of
/// the softmax and get no gradient.
#[test]
fn padded_classes_are_invisible() {
    let (h, w, t) = operands(DType::F64);
    let chunked = LinearCrossEntropyOptions { chunk_elements: 4 * CLASSES, ..Default::default() };
    let plain = run(&h, &w, &t, &chunked, true);
    let padded = run(&h, &w, &t, &LinearCrossEntropyOptions { pad_classes_to: 8, ..chunked }, true);
    assert_eq!(padded[2].dims(), [CLASSES, FEATURES]);
    for (a, b) in plain.iter().zip(&padded) {
        assert!(max_diff(a, b) < 1e-12, "padded head off by {}", max_diff(a, b));
    }
}

/// f32 against the f64 values, and the same bits every time (chunks run in a fixed order).
#[test]
fn f32_is_close_to_f64_and_deterministic() {
    let (h, w, t) = operands(DType::F64);
    let exact = run(&h, &w, &t, &Default::default(), false);
    let (h32, w32) = (h.to_dtype(DType::F32), w.to_dtype(DType::F32));
    let opts = LinearCrossEntropyOptions { chunk_elements: 3 * CLASSES, ..Default::default() };
    let a = run(&h32, &w32, &t, &opts, true);
    let b = run(&h32, &w32, &t, &opts, true);
    for ((x, y), e) in a.iter().zip(&b).zip(&exact) {
        assert_eq!(x.to_f64_vec(), y.to_f64_vec(), "two identical runs differ");
        assert!(max_diff(x, e) < 1e-5, "f32 off the f64 values by {}", max_diff(x, e));
    }
}

/// Under bf16 autocast the products run in bf16 and the loss comes out f32, within bf16's
/// rounding of the f32 loss; the gradients come back in the operands' dtype.
#[test]
fn autocast_gives_an_f32_loss_and_f32_gradients() {
    let (h, w, t) = operands(DType::F32);
    let exact = run(&h, &w, &t, &Default::default(), false);
    let (hv, wv) = (Var::parameter(h), Var::parameter(w));
    let loss = autocast(DType::BF16, || linear_cross_entropy(&hv, &wv, &t, &Default::default()));
    assert_eq!(loss.dtype(), DType::F32);
    loss.backward();
    assert_eq!(hv.grad().unwrap().dtype(), DType::F32);
    let d = max_diff(loss.tensor(), &exact[0]);
    assert!(d < 2e-2 * (1.0 + exact[0].item().abs()), "bf16 loss off by {d}");
}

/// On CUDA, with GPT-2's vocabulary padded to 128 as the model runs it (the cross-entropy's
/// gradient then has rows 50304 apart), against the plain CPU head and loss.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_padded_chunks_match_the_cpu_head() {
    let (rows, features, classes) = (300, 64, 50257);
    let mut g = Generator::new(5);
    let normal = Distribution::Normal { mean: 0.0, std: 1.0 };
    let h = normal.sample_with(&mut g, [rows, features], DType::F32, Device::Cpu).unwrap();
    let w =
        normal.sample_with(&mut g, [classes, features], DType::F32, Device::Cpu).unwrap().mul_scalar(0.05);
    let t = Tensor::randint_with(&mut g, 0, classes as i64, [rows], Device::Cpu).unwrap();
    let exact = run(&h, &w, &t, &Default::default(), false);
    let gpu = Device::Cuda(0);
    let (hg, wg, tg) = (h.to_device(gpu).unwrap(), w.to_device(gpu).unwrap(), t.to_device(gpu).unwrap());
    let opts =
        LinearCrossEntropyOptions { chunk_elements: 128 * 50304, pad_classes_to: 128, ..Default::default() };
    let fused = run(&hg, &wg, &tg, &opts, true);
    for ((what, e), f) in ["loss", "d hidden", "d weight"].iter().zip(&exact).zip(&fused) {
        let f = f.to_device(Device::Cpu).unwrap();
        let d = max_diff(e, &f);
        let scale = e.to_f64_vec().iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(d <= 1e-3 * scale.max(1e-3), "{what}: off by {d} (largest value {scale})");
    }
}
