//! The heavy ops of the CPU GPT-2 training step (`oxtrain bench gpt2`: 4 layers, 256 wide,
//! vocab 50257, batch 8 x 128 tokens) timed alone at their real shapes, so a change to one
//! kernel can be judged without the noise of a whole step. `bench/peers/gpt2_cpu_ops.py` times
//! the same ops in PyTorch; run both at the same thread count and compare line by line.
//!
//! `cargo run --release -p oxtrain-bench --bin gpt2_cpu_ops -- [--threads N] [--reps R]`
//! prints one line per op: the median wall time and the median CPU time of the process (all
//! threads), which other processes' load disturbs less.

use oxtrain_autograd::Var;
use oxtrain_bench::{median_cpu_seconds, median_seconds, usize_arg};
use oxtrain_tensor::{DType, Device, Tensor};

/// One timed op: its name and a closure that runs it once.
type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>);

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, DType::F32, Device::Cpu).unwrap()
}

fn main() {
    let threads = usize_arg("--threads", 1);
    let reps = usize_arg("--reps", 5);
    let filter = std::env::args().skip_while(|a| a != "--only").nth(1).unwrap_or_default();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let (rows, d, vocab, inner) = (1024, 256, 50257, 1024);
        let h = randn(&[rows, d]);
        let w = randn(&[vocab, d]).mul_scalar(0.02);
        let g = randn(&[rows, vocab]).mul_scalar(1e-4);
        let x = randn(&[rows, d]);
        let w_fc = randn(&[d, inner]);
        let g_fc = randn(&[rows, inner]);
        let a = randn(&[rows, inner]);
        let targets = Tensor::randint(0, vocab as i64, [rows], Device::Cpu).unwrap();
        let logits = randn(&[rows, vocab]);
        let mut cases: Vec<Case> = vec![
            ("lm_head forward  h @ W^T", Box::new(|| drop(h.matmul(&w.t())))),
            ("lm_head dx  g @ W", Box::new(|| drop(g.matmul(&w)))),
            ("lm_head dW  (g^T @ h)", Box::new(|| drop(g.t().matmul(&h)))),
            ("c_fc forward  x @ W", Box::new(|| drop(x.matmul(&w_fc)))),
            ("c_fc dx  g @ W^T", Box::new(|| drop(g_fc.matmul(&w_fc.t())))),
            ("c_fc dW  x^T @ g", Box::new(|| drop(x.t().matmul(&g_fc)))),
            ("gelu_tanh forward", Box::new(|| drop(a.gelu_tanh()))),
            ("gelu_tanh backward", Box::new(|| drop(g_fc.gelu_backward(&a, true)))),
            (
                "cross_entropy forward+backward",
                Box::new(|| {
                    let l = Var::parameter(logits.clone());
                    oxtrain_nn::loss::cross_entropy(&l, &targets).backward();
                    drop(l.grad());
                }),
            ),
        ];
        for (name, f) in cases.iter_mut() {
            if !name.contains(filter.as_str()) {
                continue;
            }
            let wall = median_seconds(1, reps, f.as_mut());
            let cpu = median_cpu_seconds(0, reps, f.as_mut());
            println!("{name:34} wall {:8.1} ms   cpu {:8.1} ms", wall * 1e3, cpu * 1e3);
        }
    });
}
