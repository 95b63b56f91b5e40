//! GPT-2's layer norms at their real shape (`[16384, 768]`: B16 T1024, n_embd 768) under bf16
//! autocast, timed alone with CUDA events: achieved bandwidth (the bytes each form must move,
//! read plus written) against a device-to-device copy in the same run. The fused forms (output
//! in bf16, the residual add folded into the forward, the residual gradient and the addend's
//! bf16 gradient into the backward) sit beside the unfused ops they replace. Run it a second
//! time with `OXTRAIN_DISABLE_FAST_LAYER_NORM=1` to see the f64 kernels in the same rows.
//! `--rows R --len L` pick the shape.
//!
//! `cargo run --release -p oxtrain-bench --bin layer_norm_kernels` (needs a CUDA GPU).

use oxtrain_bench::{time_gpu, usize_arg};
use oxtrain_tensor::{cuda, DType, Device, LayerNormGradOptions, Tensor};

const GPU: Device = Device::Cuda(0);

fn main() {
    assert!(cuda::is_available(0), "layer_norm_kernels needs a CUDA GPU");
    let (rows, len) = (usize_arg("--rows", 16384), usize_arg("--len", 768));
    let rand =
        |dtype: DType| Tensor::rand([rows, len], DType::F32, GPU).unwrap().affine(2.0, -1.0).to_dtype(dtype);
    // The residual stream (f32), a branch's output and the norm's output gradient (bf16), and
    // the gradient that reaches the stream from above (f32).
    let (x, y, dn, dres) = (rand(DType::F32), rand(DType::BF16), rand(DType::BF16), rand(DType::F32));
    let w = Tensor::ones([len], DType::F32, GPU).unwrap();
    let b = Tensor::zeros([len], DType::F32, GPU).unwrap();
    let (eps, shape) = (1e-5, [len]);
    let (sum, _, mean, rstd) = x.add_layer_norm(&y, shape, Some(&w), Some(&b), eps, DType::BF16);
    let stats = (&mean, &rstd);
    let fused_backward = || {
        let opts =
            LayerNormGradOptions { residual: Some(&dres), lowered: Some(DType::BF16), skip_params: false };
        dn.layer_norm_backward_with(&sum, stats, Some(&w), shape, opts)
    };
    let unfused_backward = || {
        let (dx, dw, db) = dn.to_dtype(DType::F32).layer_norm_backward(&sum, stats, Some(&w), shape);
        let dx = dx.add(&dres);
        (dx.to_dtype(DType::BF16), dx, dw, db)
    };
    let copy = time_gpu(20, &mut || drop(x.copy()));
    // (what, bytes per element that must move, seconds)
    let rows_out: Vec<(&str, f64, f64)> = vec![
        ("copy f32", 8.0, copy),
        ("layer_norm f32", 8.0, time_gpu(20, &mut || drop(x.layer_norm(shape, Some(&w), Some(&b), eps)))),
        (
            "layer_norm_to f32 -> bf16",
            6.0,
            time_gpu(20, &mut || drop(x.layer_norm_to(shape, Some(&w), Some(&b), eps, DType::BF16))),
        ),
        (
            "  unfused: layer_norm, cast",
            6.0,
            time_gpu(20, &mut || drop(x.layer_norm(shape, Some(&w), Some(&b), eps).0.to_dtype(DType::BF16))),
        ),
        (
            "add_layer_norm f32+bf16 -> bf16",
            12.0,
            time_gpu(20, &mut || drop(x.add_layer_norm(&y, shape, Some(&w), Some(&b), eps, DType::BF16))),
        ),
        (
            "  unfused: cast, add, ln, cast",
            12.0,
            time_gpu(20, &mut || {
                let s = x.add(&y.to_dtype(DType::F32));
                drop(s.layer_norm(shape, Some(&w), Some(&b), eps).0.to_dtype(DType::BF16));
            }),
        ),
        ("backward_with (residual, bf16 dy)", 16.0, time_gpu(20, &mut || drop(fused_backward()))),
        ("  unfused: cast, bwd, add, cast", 16.0, time_gpu(20, &mut || drop(unfused_backward()))),
        (
            "layer_norm_backward f32",
            12.0,
            time_gpu(20, &mut || drop(dres.layer_norm_backward(&sum, stats, Some(&w), shape))),
        ),
    ];
    let fast = cuda_fast_layer_norm();
    println!(
        "shape [{rows}, {len}], fast layer-norm kernels {fast}; GB/s counts the bytes each form must move"
    );
    println!("{:<36} {:>10} {:>10} {:>8}", "form", "us", "GB/s", "of copy");
    let elems = (rows * len) as f64;
    let gbs = |bytes: f64, s: f64| bytes * elems / s / 1e9;
    let copy_gbs = gbs(8.0, copy);
    for (name, bytes, s) in rows_out {
        println!("{name:<36} {:>10.1} {:>10.0} {:>8.2}", s * 1e6, gbs(bytes, s), gbs(bytes, s) / copy_gbs);
    }
}

/// "on", or "off" when `OXTRAIN_DISABLE_FAST_LAYER_NORM` turns them off.
fn cuda_fast_layer_norm() -> &'static str {
    match std::env::var("OXTRAIN_DISABLE_FAST_LAYER_NORM") {
        Ok(v) if !v.is_empty() && v != "0" => "off",
        _ => "on",
    }
}
