//! GPT-2 as Hugging Face's `GPT2Model` and `GPT2LMHeadModel`, with their state-dict names
//! (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight` in `Conv1D`'s `[in, out]`
//! layout, `lm_head.weight` tied to `wte`), so `model.safetensors` files load as they are.

mod config;
mod head;
mod layers;

pub use config::Gpt2Config;
pub use layers::{Activation, Conv1D, Gpt2Attention, Gpt2Block, Gpt2Mlp};

use crate::linear_cross_entropy::{linear_cross_entropy, LinearCrossEntropyOptions};
use crate::list::List;
use crate::loading::{given_or_read, load_pretrained, read_checkpoint, NameRules};
use crate::Result;
use layers::layer_norm;
use oxtrain_autograd::checkpoint_many;
use oxtrain_autograd::Var;
use oxtrain_nn::functional::dropout;
use oxtrain_nn::{init, Embedding, Forward, LayerNorm, LoadReport, Module, Parameter, TrainingFlag, Visitor};
use oxtrain_tensor::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Arc;

/// Names in GPT-2 checkpoints that are not weights: the causal-mask buffers older
/// `transformers` versions saved (`h.0.attn.bias`, `h.0.attn.masked_bias`).
const IGNORED: &[&str] = &[".attn.bias", ".attn.masked_bias"];

/// The transformer without a head (`GPT2Model`): token and position embeddings, `n_layer`
/// blocks, final layer norm. Its output is the last hidden state `[B, T, n_embd]`.
#[derive(Debug)]
pub struct Gpt2Model {
    pub wte: Embedding,
    pub wpe: Embedding,
    pub h: List<Gpt2Block>,
    pub ln_f: LayerNorm,
    pub config: Gpt2Config,
    training: TrainingFlag,
    /// Run each block under [`checkpoint_many`]: see [`Gpt2Model::set_activation_checkpointing`].
    activation_checkpointing: bool,
}

impl Gpt2Model {
    /// A freshly initialised model (N(0, 0.02) weights as Hugging Face's `_init_weights`,
    /// from the global generator).
    pub fn new(config: &Gpt2Config, device: Device) -> Result<Gpt2Model> {
        config.check()?;
        let act = Activation::parse(&config.activation_function)?;
        let c = config;
        let wte = Embedding::new(c.vocab_size, c.n_embd, device)?;
        let wpe = Embedding::new(c.n_positions, c.n_embd, device)?;
        for e in [&wte, &wpe] {
            init::normal_(&e.weight.tensor(), 0.0, c.initializer_range, None);
        }
        let h: Vec<Gpt2Block> =
            (0..c.n_layer).map(|_| Gpt2Block::new(c, act, device)).collect::<oxtrain_tensor::Result<_>>()?;
        Ok(Gpt2Model {
            wte,
            wpe,
            h: h.into_iter().collect(),
            ln_f: layer_norm(c.n_embd, c.layer_norm_epsilon, device)?,
            config: c.clone(),
            training: TrainingFlag::default(),
            activation_checkpointing: false,
        })
    }

    /// Activation checkpointing per block (`model.gradient_checkpointing_enable()` in Hugging
    /// Face): each block keeps only its inputs in training and reruns its forward in
    /// backward, random masks replayed, so gradients are those without it, bit for bit.
    pub fn set_activation_checkpointing(&mut self, on: bool) {
        self.activation_checkpointing = on;
    }

    pub fn activation_checkpointing(&self) -> bool {
        self.activation_checkpointing
    }

    /// The bare model of a checkpoint (`GPT2Model.from_pretrained(path)`), `path_or_dir` and
    /// `config` as in [`Gpt2LMHeadModel::from_pretrained`]; a checkpoint of the model with a
    /// head loads too, its `lm_head.weight` left out.
    pub fn from_pretrained(
        path_or_dir: impl AsRef<Path>,
        config: impl Into<Option<Gpt2Config>>,
        device: Device,
    ) -> Result<Gpt2Model> {
        let path = path_or_dir.as_ref();
        let config = given_or_read(config.into(), path, |p| Gpt2Config::from_file(p))?;
        let model = init::no_init_weights(|| Gpt2Model::new(&config, device))?;
        model.load_weights(path)?;
        Ok(model)
    }

    /// Loads a checkpoint (folder, file or index; see [`read_checkpoint`]) saved from
    /// `GPT2Model` or `GPT2LMHeadModel` (whose `lm_head.weight` is then reported unexpected).
    pub fn load_weights(&self, path: impl AsRef<Path>) -> Result<LoadReport> {
        let rules = NameRules { base_prefix: "transformer", ignore_suffixes: IGNORED, may_be_missing: &[] };
        load_pretrained(self, read_checkpoint(path)?, &rules)
    }

    /// Token ids `[B, T]` (integers) and an optional `attention_mask [B, T]` (1 = token,
    /// 0 = padding) to hidden states `[B, T, n_embd]`. Positions are `0..T` in every row, as
    /// Hugging Face uses when no `position_ids` are given.
    pub fn forward_hidden(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Var {
        assert!(
            input_ids.rank() == 2,
            "GPT-2: expected input_ids [batch, seq], got shape {:?}",
            input_ids.dims()
        );
        let t = input_ids.dims()[1];
        assert!(
            t <= self.config.n_positions,
            "GPT-2: a sequence of {t} tokens is longer than n_positions = {}",
            self.config.n_positions
        );
        let positions = Tensor::arange(0.0, t as f64, 1.0, DType::I64, input_ids.device())
            .expect("position ids on the input's device");
        let x = self.wte.forward_ids(input_ids).add(&self.wpe.forward_ids(&positions));
        let mut x = dropout(&x, self.config.embd_pdrop, self.training.get());
        // Each block's last residual add is fused with the next norm (ln_1 of the next block,
        // then ln_f).
        let mut pending: Option<Var> = None;
        for block in &self.h.0 {
            let (h, mlp_out) = if self.activation_checkpointing {
                checkpointed_block(block, &x, pending.as_ref(), attention_mask)
            } else {
                block.forward_deferred(&x, pending.as_ref(), attention_mask)
            };
            (x, pending) = (h, Some(mlp_out));
        }
        match pending {
            Some(m) => self.ln_f.forward_add(&x, &m).1,
            None => self.ln_f.forward(&x),
        }
    }
}

/// [`Gpt2Block::forward_deferred`] under [`checkpoint_many`]: the block's inputs `x` (and the
/// previous block's pending `m`) are all it keeps for backward.
fn checkpointed_block(
    block: &Arc<Gpt2Block>,
    x: &Var,
    pending: Option<&Var>,
    attention_mask: Option<&Tensor>,
) -> (Var, Var) {
    let (block, mask) = (block.clone(), attention_mask.cloned());
    let inputs: Vec<&Var> = std::iter::once(x).chain(pending).collect();
    let mut out = checkpoint_many(
        move |xs: &[Var]| {
            let (h, m) = block.forward_deferred(&xs[0], xs.get(1), mask.as_ref());
            vec![h, m]
        },
        &inputs,
    );
    let m = out.pop().expect("two outputs");
    (out.pop().expect("two outputs"), m)
}

impl Module for Gpt2Model {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("wte", &self.wte);
        v.child("wpe", &self.wpe);
        v.child("h", &self.h);
        v.child("ln_f", &self.ln_f);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

/// The output projection to the vocabulary (`lm_head`, a bias-free linear layer).
#[derive(Debug)]
pub struct LmHead {
    pub weight: Parameter,
}

impl Module for LmHead {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("weight", &self.weight);
    }
}

/// `GPT2LMHeadModel`: the transformer under `transformer.` and `lm_head`, whose weight is the
/// token embedding itself when `tie_word_embeddings` (the default).
#[derive(Debug)]
pub struct Gpt2LMHeadModel {
    pub transformer: Gpt2Model,
    pub lm_head: LmHead,
    /// [`Gpt2LMHeadModel::forward_loss`] through [`linear_cross_entropy`] in chunks: see
    /// [`Gpt2LMHeadModel::set_chunked_loss`].
    chunked_loss: bool,
}

impl Gpt2LMHeadModel {
    pub fn new(config: &Gpt2Config, device: Device) -> Result<Gpt2LMHeadModel> {
        let transformer = Gpt2Model::new(config, device)?;
        let weight = if config.tie_word_embeddings {
            Parameter::from_var(transformer.wte.weight.var())
        } else {
            let w = Tensor::zeros([config.vocab_size, config.n_embd], DType::F32, device)?;
            init::normal_(&w, 0.0, config.initializer_range, None);
            Parameter::new(w)
        };
        Ok(Gpt2LMHeadModel { transformer, lm_head: LmHead { weight }, chunked_loss: false })
    }

    /// Whether [`forward_loss`](Self::forward_loss) computes the head and the loss together in
    /// chunks of tokens ([`linear_cross_entropy`]): the `[batch, seq, vocab]` logits are never
    /// held whole, for one more product of the head in backward. Off by default. The loss and
    /// gradients equal the unchunked ones to f32 rounding; with activation checkpointing they
    /// are the same bit for bit as without it, chunked both times.
    pub fn set_chunked_loss(&mut self, on: bool) {
        self.chunked_loss = on;
    }

    pub fn chunked_loss(&self) -> bool {
        self.chunked_loss
    }

    /// The model of a checkpoint, as `GPT2LMHeadModel.from_pretrained(path)`: `path_or_dir`
    /// is a folder (`model.safetensors`, or the shards of `model.safetensors.index.json`), a
    /// `.safetensors` file or an index; `config` is `None` to read the `config.json` in (or
    /// beside) it. The model is built without random initialisation
    /// ([`init::no_init_weights`]) and filled from the file; a checkpoint that misses a weight
    /// fails with every missing name. [`load_weights`](Self::load_weights) loads into an
    /// existing model and returns what was skipped.
    pub fn from_pretrained(
        path_or_dir: impl AsRef<Path>,
        config: impl Into<Option<Gpt2Config>>,
        device: Device,
    ) -> Result<Gpt2LMHeadModel> {
        let path = path_or_dir.as_ref();
        let config = given_or_read(config.into(), path, |p| Gpt2Config::from_file(p))?;
        let model = init::no_init_weights(|| Gpt2LMHeadModel::new(&config, device))?;
        model.load_weights(path)?;
        Ok(model)
    }

    /// Loads a checkpoint (folder, file or index; see [`read_checkpoint`]) saved from
    /// `GPT2LMHeadModel` or `GPT2Model`, with or without `lm_head.weight`. With tied
    /// embeddings `lm_head.weight` is ignored: the head is `wte`, as after Hugging Face's
    /// `tie_weights()`.
    pub fn load_weights(&self, path: impl AsRef<Path>) -> Result<LoadReport> {
        let mut state = read_checkpoint(path)?;
        let tied = self.transformer.config.tie_word_embeddings;
        if tied {
            state.remove("lm_head.weight");
        }
        let rules = NameRules {
            base_prefix: "transformer",
            ignore_suffixes: IGNORED,
            may_be_missing: if tied { &["lm_head.weight"] } else { &[] },
        };
        let mut report = load_pretrained(self, state, &rules)?;
        report.missing.retain(|n| n != "lm_head.weight"); // tied: it is `wte`, loaded
        Ok(report)
    }

    /// Logits `[B, T, vocab_size]` for `input_ids [B, T]` and an optional `attention_mask`.
    pub fn forward(&self, input_ids: &Tensor, attention_mask: Option<&Tensor>) -> Var {
        let hidden = self.transformer.forward_hidden(input_ids, attention_mask);
        let w = self.lm_head.weight.var();
        lm_head_logits(&hidden, &w, HeadLayout::for_device(w.device()))
    }

    /// `model(input_ids, labels=labels).loss` in Hugging Face: [`Self::loss`] of
    /// [`Self::forward`], or with [`set_chunked_loss`](Self::set_chunked_loss) the same loss
    /// through [`linear_cross_entropy`], without the whole logits.
    pub fn forward_loss(&self, input_ids: &Tensor, labels: &Tensor, attention_mask: Option<&Tensor>) -> Var {
        if !self.chunked_loss() {
            return Self::loss(&self.forward(input_ids, attention_mask), labels);
        }
        let hidden = self.transformer.forward_hidden(input_ids, attention_mask);
        let (b, t, e) = (hidden.dims()[0], hidden.dims()[1], hidden.dims()[2]);
        let w = self.lm_head.weight.var();
        let pad_classes_to = match HeadLayout::for_device(w.device()) {
            HeadLayout::Plain => 1,
            HeadLayout::PaddedWeight(multiple) => multiple,
        };
        let opts = LinearCrossEntropyOptions { pad_classes_to, ..Default::default() };
        linear_cross_entropy(&hidden.reshape([b * t, e]), &w, &shifted_targets(labels, b, t), &opts)
    }

    /// Hugging Face's causal-LM loss: position `t` predicts `labels[t + 1]`; labels equal to
    /// -100 are left out. `logits [B, T, V]`, `labels [B, T]`.
    pub fn loss(logits: &Var, labels: &Tensor) -> Var {
        let (b, t, v) = (logits.dims()[0], logits.dims()[1], logits.dims()[2]);
        crate::loss::cross_entropy(&logits.reshape([b * t, v]), &shifted_targets(labels, b, t))
    }
}

/// The causal-LM targets `[B * T]` of `labels [B, T]`: position `t`'s is `labels[t + 1]`, the
/// last position's is ignore_index. The labels move, not the logits: slicing the logits
/// instead copied the whole `[B, T - 1, V]` block forward and scattered its gradient back into
/// `[B, T, V]`; this way the logits stay a view and the last positions get zero gradient from
/// the loss's own masking.
fn shifted_targets(labels: &Tensor, b: usize, t: usize) -> Tensor {
    assert_eq!(
        labels.dims(),
        [b, t],
        "GPT-2 loss: labels must be [batch, seq] like the input ids and logits"
    );
    let pad = Tensor::full([b, 1], crate::loss::IGNORE_INDEX as f64, DType::I64, labels.device())
        .expect("a [batch, 1] tensor on the labels' device");
    Tensor::cat(&[labels.to_dtype(DType::I64).narrow(1, 1, t - 1), pad], 1).reshape([b * t])
}

/// How the head's product is computed. With GPT-2's vocabulary of 50257 the product's N is odd,
/// and cuBLAS falls back to its unaligned kernels for all three of the head's products; the
/// CPU's gemm has no such cliff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeadLayout {
    /// `hidden @ w^T` as it is.
    Plain,
    /// Through the weight padded with zero rows to a multiple of this many rows
    /// ([`head::padded_head_logits`]).
    PaddedWeight(usize),
}

impl HeadLayout {
    /// On CUDA the vocabulary padded to a multiple of 128 (50304 for GPT-2, nanoGPT's padded
    /// vocabulary: whole 128-wide tiles of the products); `OXTRAIN_DISABLE_PADDED_HEAD=1`
    /// runs the plain product, to compare.
    fn for_device(device: Device) -> HeadLayout {
        static PLAIN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let plain = *PLAIN.get_or_init(|| {
            std::env::var("OXTRAIN_DISABLE_PADDED_HEAD").is_ok_and(|v| !v.is_empty() && v != "0")
        });
        if device.is_cuda() && !plain {
            HeadLayout::PaddedWeight(128)
        } else {
            HeadLayout::Plain
        }
    }
}

/// `hidden @ w^T` in `layout`: always the plain product's values and gradients.
fn lm_head_logits(hidden: &Var, w: &Var, layout: HeadLayout) -> Var {
    match layout {
        HeadLayout::Plain => hidden.matmul(&w.t()),
        HeadLayout::PaddedWeight(multiple) => head::padded_head_logits(hidden, w, multiple),
    }
}

impl Module for Gpt2LMHeadModel {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("transformer", &self.transformer);
        v.child("lm_head", &self.lm_head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * scale).collect()
    }

    /// The padded heads give the unpadded head's logits, loss and gradients: the pad columns
    /// must be invisible to the loss and to both gradients.
    #[test]
    fn padded_head_matches_the_plain_product() {
        let (b, t, embd, vocab) = (2, 3, 4, 13);
        let run = |layout: HeadLayout| {
            let hidden =
                Var::parameter(Tensor::from_vec(seq(b * t * embd, 0.1), [b, t, embd], Device::Cpu).unwrap());
            let w = Var::parameter(
                Tensor::from_vec(seq(vocab * embd, 0.07), [vocab, embd], Device::Cpu).unwrap(),
            );
            let logits = lm_head_logits(&hidden, &w, layout);
            assert_eq!(logits.dims(), [b, t, vocab]);
            if let HeadLayout::PaddedWeight(multiple) = layout {
                assert_eq!(logits.tensor().strides()[1], vocab.next_multiple_of(multiple), "rows padded");
            }
            let labels = Tensor::from_vec(vec![1i64, 12, 0, 5, 7, 3], [b, t], Device::Cpu).unwrap();
            let loss = Gpt2LMHeadModel::loss(&logits, &labels);
            loss.backward();
            (
                logits.tensor().to_vec::<f32>(),
                loss.tensor().to_vec::<f32>(),
                hidden.grad().unwrap().to_vec::<f32>(),
                w.grad().unwrap().to_vec::<f32>(),
            )
        };
        let plain = run(HeadLayout::Plain);
        for layout in [HeadLayout::PaddedWeight(8), HeadLayout::PaddedWeight(128)] {
            // The CPU's gemm blocks a wider product differently, so the sums may round apart
            // in the last bit; anything the pad rows leaked in would be far larger.
            let padded = run(layout);
            let close = |a: &[f32], b: &[f32], what: &str| {
                assert_eq!(a.len(), b.len(), "{layout:?}: {what}");
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{layout:?}: {what}: {x} vs {y}");
                }
            };
            close(&plain.0, &padded.0, "logits");
            close(&plain.1, &padded.1, "loss");
            close(&plain.2, &padded.2, "hidden's gradient");
            close(&plain.3, &padded.3, "weight's gradient");
        }
        assert!(plain.3.iter().any(|g| *g != 0.0), "the weight gets a gradient");
    }

    /// The CUDA head (a weight padded to 50304 rows for GPT-2's 50257 tokens, logits rows 50304
    /// apart, the cross-entropy's gradient in that layout) against the plain head on the CPU:
    /// logits, loss and both gradients.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_padded_head_matches_the_plain_cpu_head() {
        let (b, t, embd, vocab) = (2, 5, 64, 50257);
        let run = |device: Device| {
            let hidden = Var::parameter(
                Tensor::from_vec(seq(b * t * embd, 0.05), [b, t, embd], Device::Cpu)
                    .unwrap()
                    .to_device(device)
                    .unwrap(),
            );
            let w = Var::parameter(
                Tensor::from_vec(seq(vocab * embd, 0.01), [vocab, embd], Device::Cpu)
                    .unwrap()
                    .to_device(device)
                    .unwrap(),
            );
            let layout = HeadLayout::for_device(device);
            let logits = lm_head_logits(&hidden, &w, layout);
            if layout == HeadLayout::PaddedWeight(128) {
                assert_eq!(logits.tensor().strides(), [t * 50304, 50304, 1], "rows padded to 50304");
            }
            let labels =
                Tensor::from_vec(vec![1i64, 50256, 0, 5, 7, 3, 9, 11, 40000, 2], [b, t], device).unwrap();
            let loss = Gpt2LMHeadModel::loss(&logits, &labels);
            loss.backward();
            let host = |x: &Tensor| x.to_device(Device::Cpu).unwrap();
            (
                host(logits.tensor()),
                loss.tensor().item(),
                host(&hidden.grad().unwrap()),
                host(&w.grad().unwrap()),
            )
        };
        let (want, got) = (run(Device::Cpu), run(Device::Cuda(0)));
        let close = oxtrain_tensor::testing::assert_close;
        close(&got.0, &want.0, 1e-4, 1e-5, "logits");
        assert!((got.1 - want.1).abs() <= 1e-5 * want.1.abs(), "loss {} vs {}", got.1, want.1);
        close(&got.2, &want.2, 1e-4, 1e-7, "hidden's gradient");
        close(&got.3, &want.3, 1e-4, 1e-8, "weight's gradient");
    }

    /// Logits, loss and every parameter's gradient of one step of a small GPT-2 (odd
    /// vocabulary, MLP and projections wide enough for the fused products) on `device`.
    fn step(
        model: &Gpt2LMHeadModel,
        ids: &Tensor,
        low: Option<DType>,
        device: Device,
    ) -> (Tensor, f64, Vec<(String, Tensor)>) {
        let ids = ids.to_device(device).unwrap();
        let f = || {
            let logits = model.forward(&ids, None);
            (logits.clone(), Gpt2LMHeadModel::loss(&logits, &ids))
        };
        let (logits, loss) = match low {
            Some(d) => oxtrain_autograd::autocast(d, f),
            None => f(),
        };
        loss.backward();
        let host = |t: &Tensor| t.to_device(Device::Cpu).unwrap().to_dtype(DType::F64);
        let grads =
            model.named_parameters().into_iter().map(|(n, p)| (n, host(&p.grad().unwrap()))).collect();
        (host(logits.tensor()), loss.tensor().to_dtype(DType::F64).item(), grads)
    }

    /// GPT-2 on CUDA (bias and GELU epilogues, the head's padded rows) against the same weights
    /// on the CPU (the composed ops): logits, loss and every gradient, in f32 and under bf16
    /// autocast on both.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn cuda_step_matches_the_cpu() {
        let config = Gpt2Config {
            vocab_size: 1003,
            n_positions: 32,
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            ..Gpt2Config::gpt2()
        };
        let cpu = Gpt2LMHeadModel::new(&config, Device::Cpu).unwrap();
        let gpu = Gpt2LMHeadModel::new(&config, Device::Cuda(0)).unwrap();
        let state: std::collections::HashMap<String, Tensor> = cpu.state_dict().into_iter().collect();
        gpu.load_state_dict(&state, true).unwrap();
        for m in [&cpu, &gpu] {
            m.eval();
        }
        let ids =
            Tensor::from_vec((0..2 * 24).map(|i| (i * 389 % 1003) as i64).collect(), [2, 24], Device::Cpu)
                .unwrap();
        // f32: cuBLASLt's GELU uses a fast tanh; bf16: 8 bits, rounded at other places fused.
        for (low, rtol) in [(None, 2e-3), (Some(DType::BF16), 5e-2)] {
            for m in [&cpu, &gpu] {
                m.named_parameters().iter().for_each(|(_, p)| p.zero_grad());
            }
            let (want_logits, want_loss, want_grads) = step(&cpu, &ids, low, Device::Cpu);
            let (logits, loss, grads) = step(&gpu, &ids, low, Device::Cuda(0));
            let close = |got: &Tensor, want: &Tensor, what: &str| {
                let scale = want.abs().max_all().item();
                oxtrain_tensor::testing::assert_close(
                    got,
                    want,
                    rtol,
                    rtol * scale,
                    &format!("{low:?} {what}"),
                );
            };
            close(&logits, &want_logits, "logits");
            assert!((loss - want_loss).abs() <= rtol * want_loss.abs(), "{low:?} loss {loss} vs {want_loss}");
            for ((name, g), (_, w)) in grads.iter().zip(&want_grads) {
                close(g, w, &format!("gradient of {name}"));
            }
        }
    }
}
