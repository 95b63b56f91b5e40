//! The memory-bound kernels of a channels-last ResNet-50 step at one of its real shapes
//! (`[256, 256, 56, 56]` bf16, NHWC), timed alone with CUDA events: achieved bandwidth (bytes
//! that must move, read plus written) against a device-to-device copy in the same run. Tells
//! which kernel is far from the memory system's rate. `--channels C --hw HW` pick the shape.
//! Then GPT-2 124M's fused attention, forward and backward, with each kernel version
//! (`--attn-batch B --attn-seq T` pick the shape); `bench/peers/attention.py` times PyTorch's
//! `scaled_dot_product_attention` the same way.
//!
//! `cargo run --release -p oxtrain-bench --bin step_kernels` (needs a CUDA GPU).

use oxtrain_bench::{time_gpu, usize_arg};
use oxtrain_tensor::cuda;
use oxtrain_tensor::{DType, Device, FlashAttention, Tensor};

const GPU: Device = Device::Cuda(0);

fn main() {
    assert!(cuda::is_available(0), "step_kernels needs a CUDA GPU");
    memory_bound_rows();
    attention_rows();
}

fn memory_bound_rows() {
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

/// Fused attention at GPT-2 124M's shape (H12, D64, causal, bf16; q, k, v as views of one
/// `[B, T, 3, H, D]` projection and the output gradient as a view of `[B, T, H, D]`, as the
/// model passes them), forward and backward of each kernel version. TFLOP/s count the products
/// causal attention needs, as FlashAttention counts them (the backward 2.5 times the forward);
/// "ms/step" is the time of GPT-2's 12 layers.
fn attention_rows() {
    let (b, t, h, d) = (usize_arg("--attn-batch", 16), usize_arg("--attn-seq", 1024), 12, 64);
    let rand = |n: usize| Tensor::rand([n], DType::F32, GPU).unwrap().affine(2.0, -1.0).to_dtype(DType::BF16);
    let qkv = rand(b * t * 3 * h * d).reshape([b, t, 3, h, d]);
    let part = |i: usize| qkv.narrow(2, i, 1).squeeze(2).permute([0, 2, 1, 3]);
    let (q, k, v) = (part(0), part(1), part(2));
    let dout = rand(b * t * h * d).reshape([b, t, h, d]).permute([0, 2, 1, 3]);
    let opts = FlashAttention { causal: true, ..Default::default() };
    let forward_flop = 2.0 * (b * h * t * t * d) as f64;
    println!();
    println!("attention B{b} H{h} T{t} D{d} causal bf16");
    println!("{:<32} {:>10} {:>10} {:>8}", "kernel", "us", "TFLOP/s", "ms/step");
    let default = cuda::attention_v2();
    for (version, v2) in [("v1", false), ("v2", true)] {
        cuda::set_attention_v2(v2);
        let (out, lse) = q.flash_attention(&k, &v, &opts);
        let forward = time_gpu(20, &mut || drop(q.flash_attention(&k, &v, &opts)));
        let backward =
            time_gpu(20, &mut || drop(dout.flash_attention_backward((&q, &k, &v), (&out, &lse), &opts)));
        for (pass, flop, s) in
            [("forward", forward_flop, forward), ("backward", 2.5 * forward_flop, backward)]
        {
            let name = format!("attention {pass} {version}");
            println!("{name:<32} {:>10.1} {:>10.1} {:>8.2}", s * 1e6, flop / s / 1e12, s * 12.0 * 1e3);
        }
    }
    cuda::set_attention_v2(default);
}
