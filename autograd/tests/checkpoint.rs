//! Activation checkpointing (`checkpoint`, `checkpoint_many`): gradients bit for bit those of
//! the same computation recorded whole, random masks replayed, hooks fired once, the random
//! stream left where the run without checkpointing leaves it.
//!
//! The pieces draw dropout masks from the process-wide generator, so the tests of this file
//! take turns (no other test in this binary draws meanwhile).

use oxtrain_autograd::{checkpoint, checkpoint_many, is_recomputing, no_grad, Var};
use oxtrain_tensor::{
    default_generator_state, device_test, set_default_generator_state, DType, Device, Distribution,
    Generator, GeneratorState, Tensor,
};
use std::sync::{Arc, Mutex, MutexGuard};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(shape: &[usize], seed: u64, dev: Device) -> Tensor {
    Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(seed), shape, DType::F32, dev).unwrap()
}

/// Inverted dropout with a mask from the process-wide generator.
fn dropout(x: &Var, p: f64) -> Var {
    let keep = Tensor::bernoulli_scalar(x.dims(), 1.0 - p, x.dtype(), x.device()).unwrap();
    x.mul(&Var::constant(keep.mul_scalar(1.0 / (1.0 - p))))
}

/// One residual MLP block with dropout: `x + drop(tanh(x w1 + b1) w2)`; `w1` read twice.
#[derive(Clone)]
struct Block {
    w1: Var,
    b1: Var,
    w2: Var,
}

impl Block {
    fn new(width: usize, seed: u64, dev: Device) -> Block {
        let p = |shape: &[usize], s: u64| Var::parameter(randn(shape, seed * 10 + s, dev).mul_scalar(0.3));
        Block { w1: p(&[width, width], 1), b1: p(&[width], 2), w2: p(&[width, width], 3) }
    }

    fn forward(&self, x: &Var) -> Var {
        let h = dropout(&x.matmul(&self.w1).add(&self.b1).tanh(), 0.3);
        // A second use of w1, so its gradient comes in two parts.
        let h = h.add(&x.matmul(&self.w1).mul_scalar(0.1));
        x.add(&dropout(&h.matmul(&self.w2), 0.2))
    }

    fn params(&self) -> [&Var; 3] {
        [&self.w1, &self.b1, &self.w2]
    }
}

/// Loss of a stack of blocks, each run checkpointed or not; the input requires grad too.
fn loss(blocks: &[Block], x: &Var, checkpointed: bool) -> Var {
    let mut h = x.clone();
    for b in blocks {
        h = if checkpointed {
            let b = b.clone();
            checkpoint(move |x| b.forward(x), &h)
        } else {
            b.forward(&h)
        };
    }
    h.square().mean_all()
}

/// The gradients (parameters, then the input) and the generator state after one step.
fn step(
    blocks: &[Block],
    x: &Var,
    checkpointed: bool,
    rng: GeneratorState,
) -> (Vec<Vec<f32>>, GeneratorState) {
    set_default_generator_state(rng);
    let all: Vec<&Var> = blocks.iter().flat_map(Block::params).chain([x]).collect();
    all.iter().for_each(|p| p.zero_grad());
    loss(blocks, x, checkpointed).backward();
    (all.iter().map(|p| p.grad().unwrap().to_vec1_flat()).collect(), default_generator_state())
}

trait Flat {
    fn to_vec1_flat(&self) -> Vec<f32>;
}

impl Flat for Tensor {
    fn to_vec1_flat(&self) -> Vec<f32> {
        self.flatten_all().to_vec1::<f32>()
    }
}

device_test! {
    fn checkpointed_gradients_are_bitwise_those_without(dev: Device) {
        let _turn = turn();
        let blocks: Vec<Block> = (0..3).map(|i| Block::new(8, i, dev)).collect();
        let x = Var::parameter(randn(&[5, 8], 99, dev));
        let rng = GeneratorState { seed: 7, offset: 3 };
        let (plain, rng_plain) = step(&blocks, &x, false, rng);
        let (ckpt, rng_ckpt) = step(&blocks, &x, true, rng);
        for (i, (a, b)) in plain.iter().zip(&ckpt).enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a), bits(b), "gradient {i} differs with checkpointing");
        }
        // The random stream goes on where it would without checkpointing.
        assert_eq!(rng_plain, rng_ckpt);
        // Another mask (another starting state) gives other gradients: the masks matter.
        let (other, _) = step(&blocks, &x, true, GeneratorState { seed: 8, offset: 0 });
        assert_ne!(other[0], plain[0]);
    }
}

device_test! {
    fn hooks_fire_once_with_the_whole_gradient(dev: Device) {
        let _turn = turn();
        let blocks: Vec<Block> = (0..2).map(|i| Block::new(4, i, dev)).collect();
        let x = Var::constant(randn(&[3, 4], 5, dev));
        let fired: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
        let log = fired.clone();
        let handle = blocks[0].w1.register_hook(move |g| log.lock().unwrap().push(g.to_vec1_flat()));
        loss(&blocks, &x, true).backward();
        let fired = fired.lock().unwrap();
        assert_eq!(fired.len(), 1, "the hook of a parameter inside a checkpoint fired {} times", fired.len());
        assert_eq!(fired[0], blocks[0].w1.grad().unwrap().to_vec1_flat());
        handle.remove();
    }
}

device_test! {
    fn several_inputs_and_outputs_and_nesting(dev: Device) {
        let _turn = turn();
        let w = Var::parameter(randn(&[4, 4], 1, dev));
        let a = Var::parameter(randn(&[2, 4], 2, dev));
        let b = Var::parameter(randn(&[2, 4], 3, dev));
        let mask = Var::constant(randn(&[2, 4], 4, dev));
        let piece = {
            let w = w.clone();
            move |xs: &[Var]| {
                let s = xs[0].matmul(&w).add(&xs[1]).tanh();
                let inner_w = w.clone();
                // A checkpoint inside a checkpoint.
                let t = checkpoint(move |s| s.matmul(&inner_w).sigmoid(), &s);
                vec![s.mul(&xs[2]), t]
            }
        };
        let run = |checkpointed: bool| {
            [&w, &a, &b].iter().for_each(|p| p.zero_grad());
            let out = if checkpointed {
                checkpoint_many(piece.clone(), &[&a, &b, &mask])
            } else {
                piece(&[a.clone(), b.clone(), mask.clone()])
            };
            // The second output is read twice, the first once.
            out[0].sum_all().add(&out[1].square().sum_all()).add(&out[1].mean_all()).backward();
            [&w, &a, &b].map(|p| p.grad().unwrap().to_vec1_flat())
        };
        assert_eq!(run(false), run(true));
        // Without recording, a checkpoint is a plain call.
        let out = no_grad(|| checkpoint_many(piece.clone(), &[&a, &b, &mask]));
        assert!(out.iter().all(|v| !v.requires_grad()));
    }
}

device_test! {
    fn the_recomputation_is_marked_and_the_first_forward_is_not(dev: Device) {
        let _turn = turn();
        let w = Var::parameter(randn(&[3, 3], 1, dev));
        let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
        let (log, w2) = (seen.clone(), w.clone());
        let out = checkpoint(
            move |x| {
                log.lock().unwrap().push(is_recomputing());
                x.matmul(&w2)
            },
            &Var::constant(randn(&[2, 3], 2, dev)),
        );
        // The output needs a gradient through w although the input needs none.
        assert!(out.requires_grad());
        out.sum_all().backward();
        assert_eq!(*seen.lock().unwrap(), vec![false, true]);
        assert!(!is_recomputing());
        assert!(w.grad().is_some());
    }
}

#[test]
#[should_panic(expected = "must do the same ops each time it runs")]
fn a_piece_that_reads_other_parameters_on_replay_is_refused() {
    let _turn = turn();
    let (w, v) = (Var::parameter(randn(&[2], 1, Device::Cpu)), Var::parameter(randn(&[2], 2, Device::Cpu)));
    let (w2, v2) = (w.clone(), v.clone());
    let out = checkpoint(move |x| if is_recomputing() { x.mul(&v2) } else { x.mul(&w2) }, &w);
    out.sum_all().backward();
}
