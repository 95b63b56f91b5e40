//! The matrix products of one GPT-2 124M training step (batch 16 x 1024 tokens, bf16) timed
//! one by one with CUDA events: forward `x @ W`, and backward `g @ W^T` and `x^T @ g`, for each
//! linear layer's shape and the tied LM head (vocabulary 50257, and padded to 50304 to show
//! what an unaligned leading dimension costs). `bench/peers/gpt2_matmuls.py` prints PyTorch's
//! times for the same products; run both in one sitting and compare line by line.
//!
//! Then the same products with their cuBLASLt epilogues (bias, GELU, GELU gradient, bias
//! gradient) beside the plain product. The model's head runs the padded products.
//!
//! `cargo run --release -p oxtrain-bench --bin gpt2_matmuls` (needs a CUDA GPU).

use oxtrain_bench::time_gpu;
use oxtrain_tensor::cuda;
use oxtrain_tensor::{DType, Device, Tensor};

/// One pass of a layer's product (forward, input gradient, weight gradient).
type Pass<'a> = Box<dyn Fn() -> Tensor + 'a>;

const GPU: Device = Device::Cuda(0);
const TOKENS: usize = 16 * 1024;

fn rand(dims: [usize; 2]) -> Tensor {
    Tensor::rand(dims, DType::F32, GPU).unwrap().affine(0.2, -0.1).to_dtype(DType::BF16)
}

fn main() {
    assert!(cuda::is_available(0), "gpt2_matmuls needs a CUDA GPU");
    // (name, K, N, count per step): Conv1D weights are [in, out] = [K, N].
    let layers = [
        ("c_attn", 768, 2304, 12),
        ("attn.c_proj", 768, 768, 12),
        ("mlp.c_fc", 768, 3072, 12),
        ("mlp.c_proj", 3072, 768, 12),
        ("lm_head", 768, 50257, 1),
        ("lm_head_padded", 768, 50304, 1),
    ];
    println!("{:<16} {:<6} {:>10} {:>9} {:>10}", "layer", "pass", "us", "TFLOP/s", "us/step");
    let mut step_total = 0.0;
    for (name, k, n, count) in layers {
        let x = rand([TOKENS, k]);
        let g = rand([TOKENS, n]);
        let flops = 2.0 * (TOKENS * k * n) as f64;
        // The LM head's weight is the embedding table [vocab, 768], used transposed.
        let w = if name.starts_with("lm_head") { rand([n, k]).t() } else { rand([k, n]) };
        let passes: [(&str, Pass); 3] = [
            ("fwd", Box::new(|| x.matmul(&w))),
            ("dx", Box::new(|| g.matmul(&w.t()))),
            ("dw", Box::new(|| x.t().matmul(&g))),
        ];
        for (pass, f) in passes {
            let s = time_gpu(10, &mut || drop(f()));
            if !name.ends_with("padded") {
                step_total += s * count as f64;
            }
            println!(
                "{name:<16} {pass:<6} {:>10.1} {:>9.1} {:>10.1}",
                s * 1e6,
                flops / s / 1e12,
                s * 1e6 * count as f64
            );
        }
    }
    println!("total per step (unpadded head): {:.2} ms", step_total * 1e3);
    epilogues();
}

/// Each fused product of a GPT-2 layer against the plain product of the same shape.
fn epilogues() {
    println!("\n{:<28} {:>10} {:>10}", "fused product", "fused us", "plain us");
    let (e, h) = (768, 3072);
    let (x, w_fc, b_fc) = (rand([TOKENS, e]), rand([e, h]), rand([1, h]).reshape([h]));
    let (w_attn, b_attn) = (rand([e, 3 * e]), rand([1, 3 * e]).reshape([3 * e]));
    let (hidden, w_proj, g) = (rand([TOKENS, h]), rand([h, e]), rand([TOKENS, e]));
    let g_fc = rand([TOKENS, h]);
    let before = cuda::epilogue_products_on_this_thread();
    let rows: [(&str, Pass, Pass); 4] = [
        ("c_attn x@w+b", Box::new(|| x.matmul_bias(&w_attn, &b_attn)), Box::new(|| x.matmul(&w_attn))),
        (
            "c_fc gelu(x@w+b)",
            Box::new(|| x.matmul_bias_gelu_tanh(&w_fc, &b_fc).0),
            Box::new(|| x.matmul(&w_fc)),
        ),
        (
            "c_proj dx*gelu'(pre), db_fc",
            Box::new(|| g.matmul_gelu_tanh_backward(&w_proj.t(), &hidden).0),
            Box::new(|| g.matmul(&w_proj.t())),
        ),
        (
            "c_fc dw, db",
            Box::new(|| x.t().matmul_and_rhs_col_sums(&g_fc).0),
            Box::new(|| x.t().matmul(&g_fc)),
        ),
    ];
    for (name, fused, plain) in rows {
        let (sf, sp) = (time_gpu(10, &mut || drop(fused())), time_gpu(10, &mut || drop(plain())));
        println!("{name:<28} {:>10.1} {:>10.1}", sf * 1e6, sp * 1e6);
    }
    let used = cuda::epilogue_products_on_this_thread() - before;
    println!("products run with an epilogue: {used} (0 means cuBLASLt refused them all: compositions ran)");
}
