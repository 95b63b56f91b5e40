//! The memory-bound kernels of a channels-last ResNet-50 step at one of its real shapes
//! (`[256, 256, 56, 56]` bf16, NHWC), timed alone with CUDA events: achieved bandwidth (bytes
//! that must move, read plus written) against a device-to-device copy in the same run. Tells
//! which kernel is far from the memory system's rate. `--channels C --hw HW` pick the shape;
//! the max-pool rows use the stem's shape (`[256, 64, 112, 112]`, 3x3 stride 2 padding 1).
//! Then GPT-2 124M's fused attention, forward and backward, with each kernel version
//! (`--attn-batch B --attn-seq T` pick the shape); `bench/peers/attention.py` times PyTorch's
//! `scaled_dot_product_attention` the same way.
//!
//! `cargo run --release -p oxtrain-bench --bin step_kernels` (needs a CUDA GPU).

use oxtrain_bench::{time_gpu, usize_arg};
use oxtrain_tensor::cuda;
use oxtrain_tensor::{DType, Device, FlashAttention, Tensor};

const GPU: Device = Device::Cuda(0);

/// Uniform values in [-1, 1) as a bf16 NHWC tensor seen as `[n, c, hw, hw]`.
fn rand_nhwc(n: usize, c: usize, hw: usize) -> Tensor {
    Tensor::rand([n * hw * hw * c], DType::F32, GPU)
        .unwrap()
        .affine(2.0, -1.0)
        .to_dtype(DType::BF16)
        .reshape([n, hw, hw, c])
        .permute([0, 3, 1, 2])
}

/// Batch norm's rows: (name, bytes that must move in tensor passes, seconds).
fn batch_norm_rows(n: usize, c: usize, hw: usize) -> Vec<(&'static str, f64, f64)> {
    let (x, y, g) = (rand_nhwc(n, c, hw), rand_nhwc(n, c, hw), rand_nhwc(n, c, hw));
    let w = Tensor::ones([c], DType::F32, GPU).unwrap();
    let b = Tensor::zeros([c], DType::F32, GPU).unwrap();
    let (out, mean, var, mask) = x.batch_norm_relu_training_with_mask(Some(&w), Some(&b), 1e-5);
    let stats = (&mean, &var);
    let copy = time_gpu(20, &mut || drop(x.permute([0, 2, 3, 1]).copy()));
    vec![
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
            time_gpu(20, &mut || drop(g.batch_norm_backward(&x, stats, Some(&w), 1e-5, true))),
        ),
        ("batch_norm_backward (NCHW dy)", 5.0, {
            let gc = g.contiguous();
            time_gpu(20, &mut || drop(gc.batch_norm_backward(&x, stats, Some(&w), 1e-5, true)))
        }),
        // The ReLU's backward then batch norm's (before the fold): 3 + 5 passes.
        ("threshold + batch_norm_backward", 8.0, {
            time_gpu(20, &mut || {
                drop(g.threshold_backward(&out, 0.0).batch_norm_backward(&x, stats, Some(&w), 1e-5, true))
            })
        }),
        // The mask recomputed from x: dy and x twice, dx once.
        ("bn_relu_backward recomputed mask", 5.0, {
            time_gpu(20, &mut || {
                drop(g.batch_norm_relu_backward_with(&mask, &x, stats, Some(&w), 1e-5, true, false))
            })
        }),
        // The block's end: dy, y, x read and the masked dy written, then masked, x and dx.
        ("bn_relu_backward kept mask", 7.0, {
            time_gpu(20, &mut || {
                drop(g.batch_norm_relu_backward(&out, &x, stats, Some(&w), 1e-5, true, true))
            })
        }),
        // The same with dy in two parts (the block input's two gradients), one more read.
        ("bn_relu_backward_plus kept mask", 8.0, {
            time_gpu(20, &mut || {
                drop(g.batch_norm_relu_backward_plus(&y, &out, &x, stats, Some(&w), 1e-5, true, true))
            })
        }),
    ]
}

/// The stem's max pooling, forward and backward, with flat indices and with window offsets:
/// (name, bytes in passes over the bf16 input, seconds).
fn max_pool_rows(n: usize) -> Vec<(&'static str, f64, f64)> {
    let x = rand_nhwc(n, 64, 112);
    let (k, s, p, d) = ([3, 3], [2, 2], [1, 1], [1, 1]);
    let (v, idx) = x.max_pool2d(k, s, p, d, false);
    let (_, off) = x.max_pool2d_with_offsets(k, s, p, d, false);
    let g = rand_nhwc(n, 64, 56);
    let dims = x.dims().to_vec();
    assert_eq!(g.dims(), v.dims());
    // Per input element (2 bytes): the output a quarter of it, i64 indices 4 passes' worth of
    // a quarter, u8 offsets half a pass's worth of a quarter.
    vec![
        (
            "max_pool2d fwd (i64 indices)",
            1.0 + 0.25 + 1.0,
            time_gpu(10, &mut || drop(x.max_pool2d(k, s, p, d, false))),
        ),
        (
            "max_pool2d fwd (u8 offsets)",
            1.0 + 0.25 + 0.125,
            time_gpu(10, &mut || drop(x.max_pool2d_with_offsets(k, s, p, d, false))),
        ),
        ("max_pool2d bwd (i64 indices)", 0.25 + 1.0 + 1.0, {
            time_gpu(10, &mut || {
                drop(g.max_pool2d_with_indices_backward(&idx, dims.clone(), k, s, p, d, false))
            })
        }),
        ("max_pool2d bwd (u8 offsets)", 0.25 + 0.125 + 1.0, {
            time_gpu(10, &mut || {
                drop(g.max_pool2d_with_offsets_backward(&off, dims.clone(), k, s, p, d, false))
            })
        }),
    ]
}

fn main() {
    assert!(cuda::is_available(0), "step_kernels needs a CUDA GPU");
    let (n, c, hw) = (usize_arg("--batch", 256), usize_arg("--channels", 256), usize_arg("--hw", 56));
    let tensor_bytes = (n * c * hw * hw * 2) as f64;
    let rows = batch_norm_rows(n, c, hw);
    let copy_gbs = 2.0 * tensor_bytes / rows[0].2 / 1e9;
    println!("shape [{n}, {c}, {hw}, {hw}] bf16 channels-last; GB/s counts the bytes each kernel must move");
    println!("{:<36} {:>10} {:>10} {:>8}", "kernel", "us", "GB/s", "of copy");
    let print = |name: &str, bytes: f64, s: f64| {
        let gbs = bytes / s / 1e9;
        println!("{name:<36} {:>10.1} {:>10.0} {:>8.2}", s * 1e6, gbs, gbs / copy_gbs);
    };
    for (name, passes, s) in rows {
        print(name, passes * tensor_bytes, s);
    }
    let stem_bytes = (n * 64 * 112 * 112 * 2) as f64;
    println!("stem max pooling: input [{n}, 64, 112, 112] bf16 channels-last, 3x3 stride 2 padding 1");
    for (name, passes, s) in max_pool_rows(n) {
        print(name, passes * stem_bytes, s);
    }
    attention_rows();
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
