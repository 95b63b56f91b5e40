//! Small models trained data-parallel and in one process, for the DDP tests of every backend:
//! the same deterministic data, split by rank, and helpers that compare the results.

use oxtrain_autograd::Var;
use oxtrain_comm::Communicator;
use oxtrain_ddp::{Ddp, DdpConfig};
use oxtrain_nn::optim::{AdamW, AdamWConfig, IntoParamGroups, Lars, LarsConfig, Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Embedding, Flatten, Forward, LayerNorm, Linear,
    Module, MultiheadAttentionConfig, MultiheadSelfAttention, Parameter, ReLU, Sequential, Visitor,
};
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};
use std::sync::{Arc, Mutex};

/// Models are built under one lock: layer initialisation draws from the process-wide
/// generator, which rank threads of one process share.
static BUILD: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Model {
    /// conv-relu-conv-relu-pool-linear on 3x8x8 images, 4 classes.
    Cnn,
    /// The same with batch norm after each convolution.
    CnnBn,
    /// Embedding, one self-attention block with layer norm, a head; next-token loss.
    Transformer,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Opt {
    SgdMomentum,
    AdamW,
    /// LARS: its trust ratio takes whole-parameter norms, which ZeRO all-reduces.
    Lars,
}

pub const CLASSES: usize = 4;
pub const VOCAB: usize = 16;
const SEQ: usize = 6;

pub struct Tiny {
    pub body: Sequential,
    pub transformer: Option<TinyTransformer>,
}

pub struct TinyTransformer {
    emb: Embedding,
    attn: MultiheadSelfAttention,
    ln: LayerNorm,
    head: Linear,
}

impl Module for TinyTransformer {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("emb", &self.emb);
        v.child("attn", &self.attn);
        v.child("ln", &self.ln);
        v.child("head", &self.head);
    }
}

impl TinyTransformer {
    fn forward_ids(&self, ids: &Tensor) -> Var {
        let h = self.emb.forward_ids(ids);
        let h = self.ln.forward(&(h.clone() + self.attn.forward(&h)));
        self.head.forward(&h)
    }
}

impl Module for Tiny {
    fn visit(&self, v: &mut dyn Visitor) {
        match &self.transformer {
            Some(t) => t.visit(v),
            None => self.body.visit(v),
        }
    }
}

pub fn build(model: Model, seed: u64) -> Tiny {
    let _lock = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    oxtrain_tensor::manual_seed(seed);
    let dev = Device::Cpu;
    if model == Model::Transformer {
        let t = TinyTransformer {
            emb: Embedding::new(VOCAB, 8, dev).unwrap(),
            // No projection biases: the key bias has an exactly zero gradient (softmax ignores
            // a shift shared by all keys), so its computed gradient is rounding noise, which
            // AdamW turns into full-size steps whose sign no two summation orders agree on.
            attn: MultiheadSelfAttention::with_config(
                8,
                2,
                MultiheadAttentionConfig { bias: false, ..Default::default() },
                dev,
            )
            .unwrap(),
            ln: LayerNorm::new([8], dev).unwrap(),
            head: Linear::new(8, VOCAB, dev).unwrap(),
        };
        return Tiny { body: Sequential::new(), transformer: Some(t) };
    }
    let conv = |i, o| {
        Conv2d::with_config(i, o, [3, 3], Conv2dConfig { padding: [1, 1], ..Default::default() }, dev)
            .unwrap()
    };
    let mut s = Sequential::new().append(conv(3, 6));
    if model == Model::CnnBn {
        s = s.append(BatchNorm2d::new(6, dev).unwrap());
    }
    s = s.append(ReLU).append(conv(6, 8));
    if model == Model::CnnBn {
        s = s.append(BatchNorm2d::new(8, dev).unwrap());
    }
    s = s
        .append(ReLU)
        .append(AdaptiveAvgPool2d::new([1, 1]))
        .append(Flatten::new())
        .append(Linear::new(8, CLASSES, dev).unwrap());
    Tiny { body: s, transformer: None }
}

/// The global batch of `step`: `rows` examples (images and labels, or token ids and their
/// next tokens).
pub fn batch(model: Model, step: usize, rows: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(1000 + step as u64);
    let dev = Device::Cpu;
    if model == Model::Transformer {
        let ids: Vec<i64> =
            (0..rows * (SEQ + 1)).map(|i| ((i * 7 + step * 3 + i / 5) % VOCAB) as i64).collect();
        let ids = Tensor::from_vec(ids, [rows, SEQ + 1], dev).unwrap();
        return (ids.narrow(1, 0, SEQ).contiguous(), ids.narrow(1, 1, SEQ).contiguous());
    }
    let x = Distribution::STANDARD_NORMAL.sample_with(&mut g, [rows, 3, 8, 8], DType::F32, dev).unwrap();
    let y: Vec<i64> = (0..rows).map(|i| ((i * 3 + step) % CLASSES) as i64).collect();
    (x, Tensor::from_vec(y, rows, dev).unwrap())
}

/// Rows `[r * per_rank, (r + 1) * per_rank)` of a batch.
pub fn shard(t: &Tensor, rank: usize, per_rank: usize) -> Tensor {
    t.narrow(0, rank * per_rank, per_rank).contiguous()
}

pub fn loss(model: Model, m: &Tiny, x: &Tensor, y: &Tensor) -> Var {
    let logits = forward(model, m, x);
    logits_loss(model, &logits, y)
}

pub fn forward(model: Model, m: &Tiny, x: &Tensor) -> Var {
    match &m.transformer {
        Some(t) if model == Model::Transformer => t.forward_ids(x),
        _ => m.body.forward(&Var::constant(x.clone())),
    }
}

pub fn logits_loss(model: Model, logits: &Var, y: &Tensor) -> Var {
    if model == Model::Transformer {
        let n = logits.dims()[0] * logits.dims()[1];
        oxtrain_nn::loss::cross_entropy(&logits.reshape([n, VOCAB]), &y.reshape(n))
    } else {
        oxtrain_nn::loss::cross_entropy(logits, y)
    }
}

/// The test optimizer of `opt` over parameters or groups (plain, or inside a ZeRO wrapper).
pub fn optimizer(opt: Opt, params: impl IntoParamGroups) -> Box<dyn Optimizer> {
    match opt {
        Opt::SgdMomentum => {
            Box::new(Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }))
        }
        Opt::AdamW => {
            Box::new(AdamW::new(params, AdamWConfig { lr: 0.01, weight_decay: 0.01, ..Default::default() }))
        }
        Opt::Lars => Box::new(Lars::new(
            params,
            LarsConfig {
                lr: 0.5,
                momentum: 0.9,
                weight_decay: 1e-4,
                trust_coefficient: 0.02,
                ..Default::default()
            },
        )),
    }
}

/// Parameter values by name.
pub fn params(m: &dyn Module) -> Vec<(String, Vec<f32>)> {
    m.named_parameters().into_iter().map(|(n, v)| (n, v.tensor().to_vec::<f32>())).collect()
}

pub fn buffers(m: &dyn Module) -> Vec<(String, Vec<f64>)> {
    m.named_buffers().into_iter().map(|(n, t)| (n, t.to_f64_vec())).collect()
}

/// One process trains on the whole batch of every step (`per_rank * world` rows);
/// `accumulate` micro-batches of it per step, as ranks do with `no_sync`.
pub fn train_single(model: Model, opt: Opt, steps: usize, rows: usize, accumulate: usize) -> Tiny {
    let m = build(model, 7);
    let mut o = optimizer(opt, m.parameters());
    for step in 0..steps {
        o.zero_grad();
        for micro in 0..accumulate {
            let (x, y) = batch(model, step * accumulate + micro, rows);
            (loss(model, &m, &x, &y) * (1.0 / accumulate as f64)).backward();
        }
        o.step();
    }
    m
}

/// Rank `comm.rank()` trains its shard of every step under DDP, from its own (different)
/// initial weights: the start-up broadcast must make them rank 0's.
pub fn train_rank(
    comm: Arc<dyn Communicator>,
    model: Model,
    opt: Opt,
    steps: usize,
    per_rank: usize,
    accumulate: usize,
    config: DdpConfig,
) -> Ddp<Tiny> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let m = build(model, if rank == 0 { 7 } else { 100 + rank as u64 });
    let ddp = Ddp::new(m, comm, config).unwrap();
    let mut o = optimizer(opt, ddp.module().parameters());
    for step in 0..steps {
        o.zero_grad();
        for micro in 0..accumulate {
            let (x, y) = batch(model, step * accumulate + micro, per_rank * world);
            let (x, y) = (shard(&x, rank, per_rank), shard(&y, rank, per_rank));
            let run = || {
                let logits = ddp.forward_with(|m| forward(model, m, &x));
                (logits_loss(model, &logits, &y) * (1.0 / accumulate as f64)).try_backward().unwrap();
            };
            if micro + 1 < accumulate {
                ddp.no_sync(run);
            } else {
                run();
            }
        }
        ddp.span("optimizer", || o.step());
    }
    ddp
}

/// Largest |a - b| over the largest |b| of each tensor; panics naming the worst tensor when
/// it exceeds `tol`.
pub fn assert_close(what: &str, got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: parameter counts differ");
    let mut worst: (f64, &str) = (0.0, "");
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!(n, m, "{what}: parameter order differs");
        let scale = b.iter().fold(0f64, |s, &v| s.max(f64::from(v).abs())).max(1e-30);
        let diff = a.iter().zip(b).fold(0f64, |s, (&x, &y)| s.max((f64::from(x) - f64::from(y)).abs()));
        if diff / scale > worst.0 {
            worst = (diff / scale, n);
        }
    }
    assert!(
        worst.0 <= tol,
        "{what}: `{}` differs from the reference by {:.3e} relative (> {tol:e})",
        worst.1,
        worst.0
    );
    worst.0
}

/// Same values bit for bit.
pub fn assert_bitwise_equal(what: &str, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) {
    for ((n, x), (_, y)) in a.iter().zip(b) {
        let same = x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: `{n}` differs between ranks");
    }
}

/// A parameter no forward uses (for the unused-parameter tests).
pub struct WithUnused {
    pub inner: Tiny,
    pub unused: Parameter,
}

impl Module for WithUnused {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("net", &self.inner);
        v.param("extra", &self.unused);
    }
}
