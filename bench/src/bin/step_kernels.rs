//! The memory-bound kernels of a channels-last ResNet-50 step at one of its real shapes
//! (`[256, 256, 56, 56]` bf16, NHWC), timed alone with CUDA events: achieved bandwidth (bytes
//! that must move, read plus written) against a device-to-device copy in the same run. Tells
//! which kernel is far from the memory system's rate. `--channels C --hw HW` pick the shape.
//!
//! `cargo run --release -p oxtrain-bench --bin step_kernels` (needs a CUDA GPU).

use oxtrain_bench::{time_gpu, usize_arg};
use oxtrain_tensor::cuda;
use oxtrain_tensor::{DType, Device, Tensor};

const GPU: Device = Device::Cuda(0);

fn main() {
    assert!(cuda::is_available(0), "step_kernels needs a CUDA GPU");
    let (n, c, hw) = (usize_arg("--batch", 256), usize_arg("--channels", 256), usize_arg("--hw", 56));
    let nhwc = |t: Tensor| t.reshape([n, hw, hw, c]).permute([0, 3, 1, 2]);
    let rand = || {
        nhwc(
            Tensor::rand([n * hw * hw * c], DType::F32, GPU).unwrap().affine(2.0, -1.0).to_dtype(DType::BF16),
        )
    };
    let (x, y, g) = (rand(), rand(), rand());
    let elems = (n * c * hw * hw) as f64;
    let gb = |passes: f64, s: f64| passes * elems * 2.0 / s / 1e9;
    let w = Tensor::ones([c], DType::F32, GPU).unwrap();
    let b = Tensor::zeros([c], DType::F32, GPU).unwrap();
    let (_, mean, var) = x.batch_norm_training(Some(&w), Some(&b), 1e-5);
    let copy = time_gpu(20, &mut || drop(x.permute([0, 2, 3, 1]).copy()));
    let rows: Vec<(&str, f64, f64)> = vec![
        ("copy (contiguous)", 2.0, copy),
        ("relu", 2.0, time_gpu(20, &mut || drop(x.relu()))),
        ("add", 3.0, time_gpu(20, &mut || drop(x.add(&y)))),
        ("to_dtype bf16->f32", 3.0, time_gpu(20, &mut || drop(x.to_dtype(DType::F32)))),
        ("threshold_backward", 3.0, time_gpu(20, &mut || drop(g.threshold_backward(&y, 0.0)))),
        ("batch_norm_stats", 1.0, time_gpu(20, &mut || drop(x.batch_norm_stats()))),
        (
            "batch_norm_training",
            3.0,
            time_gpu(20, &mut || drop(x.batch_norm_training(Some(&w), Some(&b), 1e-5))),
        ),
        (
            "batch_norm_relu_training",
            3.0,
            time_gpu(20, &mut || drop(x.batch_norm_relu_training(Some(&w), Some(&b), 1e-5))),
        ),
        (
            "batch_norm_backward",
            5.0,
            time_gpu(20, &mut || drop(g.batch_norm_backward(&x, (&mean, &var), Some(&w), 1e-5, true))),
        ),
        ("batch_norm_backward (NCHW dy)", 5.0, {
            let gc = g.contiguous();
            time_gpu(20, &mut || drop(gc.batch_norm_backward(&x, (&mean, &var), Some(&w), 1e-5, true)))
        }),
    ];
    println!("shape [{n}, {c}, {hw}, {hw}] bf16 channels-last; GB/s counts the bytes each kernel must move");
    println!("{:<32} {:>10} {:>10} {:>8}", "kernel", "us", "GB/s", "of copy");
    let copy_gbs = gb(2.0, copy);
    for (name, passes, s) in rows {
        println!("{name:<32} {:>10.1} {:>10.0} {:>8.2}", s * 1e6, gb(passes, s), gb(passes, s) / copy_gbs);
    }
}
