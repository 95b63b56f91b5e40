//! BERT's pieces with Hugging Face's names: `embeddings`, `encoder.layer.{i}` with
//! `attention.self.{query,key,value}`, `attention.output.{dense,LayerNorm}`,
//! `intermediate.dense`, `output.{dense,LayerNorm}`.

use super::BertConfig;
use crate::gpt2::Activation;
use oxtrain_autograd::Var;
use oxtrain_nn::functional::{dropout, scaled_dot_product_attention_with};
use oxtrain_nn::{
    init, Embedding, EmbeddingConfig, Forward, LayerNorm, LayerNormConfig, Linear, Module, TrainingFlag,
    Visitor,
};
use oxtrain_tensor::{DType, Device, Result, Tensor};

/// A linear layer initialised N(0, initializer_range) with a zero bias (`_init_weights`).
fn linear(i: usize, o: usize, c: &BertConfig, device: Device) -> Result<Linear> {
    let l = Linear::new(i, o, device)?;
    init::normal_(&l.weight.tensor(), 0.0, c.initializer_range, None);
    if let Some(b) = &l.bias {
        init::zeros_(&b.tensor());
    }
    Ok(l)
}

fn layer_norm(c: &BertConfig, device: Device) -> Result<LayerNorm> {
    LayerNorm::with_config(
        [c.hidden_size],
        LayerNormConfig { eps: c.layer_norm_eps, ..Default::default() },
        device,
    )
}

fn embedding(n: usize, c: &BertConfig, padding_idx: Option<usize>, device: Device) -> Result<Embedding> {
    let e = Embedding::with_config(
        n,
        c.hidden_size,
        EmbeddingConfig { padding_idx, ..Default::default() },
        device,
    )?;
    let w = e.weight.tensor();
    init::normal_(&w, 0.0, c.initializer_range, None);
    if let Some(p) = padding_idx {
        w.narrow(0, p, 1).zero_();
    }
    Ok(e)
}

/// `BertEmbeddings`: word + position + token-type embeddings, layer norm, dropout.
#[derive(Debug)]
pub struct BertEmbeddings {
    pub word_embeddings: Embedding,
    pub position_embeddings: Embedding,
    pub token_type_embeddings: Embedding,
    /// `LayerNorm` in the state dict.
    pub layer_norm: LayerNorm,
    p: f64,
    training: TrainingFlag,
}

impl BertEmbeddings {
    pub(crate) fn new(c: &BertConfig, device: Device) -> Result<BertEmbeddings> {
        Ok(BertEmbeddings {
            word_embeddings: embedding(c.vocab_size, c, c.pad_token_id, device)?,
            position_embeddings: embedding(c.max_position_embeddings, c, None, device)?,
            token_type_embeddings: embedding(c.type_vocab_size, c, None, device)?,
            layer_norm: layer_norm(c, device)?,
            p: c.hidden_dropout_prob,
            training: TrainingFlag::default(),
        })
    }

    /// `input_ids [B, T]`, `token_type_ids [B, T]` (zeros when `None`); positions `0..T`.
    pub fn forward_ids(&self, input_ids: &Tensor, token_type_ids: Option<&Tensor>) -> Var {
        let t = input_ids.dims()[1];
        let max = self.position_embeddings.weight.dims()[0];
        assert!(t <= max, "BERT: a sequence of {t} tokens is longer than max_position_embeddings = {max}");
        let device = input_ids.device();
        let positions =
            Tensor::arange(0.0, t as f64, 1.0, DType::I64, device).expect("positions on the input's device");
        let types = match token_type_ids {
            Some(tt) => tt.clone(),
            None => Tensor::zeros(input_ids.dims(), DType::I64, device)
                .expect("token types on the input's device"),
        };
        let x = self
            .word_embeddings
            .forward_ids(input_ids)
            .add(&self.token_type_embeddings.forward_ids(&types))
            .add(&self.position_embeddings.forward_ids(&positions));
        dropout(&self.layer_norm.forward(&x), self.p, self.training.get())
    }
}

impl Module for BertEmbeddings {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("word_embeddings", &self.word_embeddings);
        v.child("position_embeddings", &self.position_embeddings);
        v.child("token_type_embeddings", &self.token_type_embeddings);
        v.child("LayerNorm", &self.layer_norm);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

/// `BertSelfAttention`: the query/key/value projections and scaled dot-product attention.
#[derive(Debug)]
pub struct BertSelfAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub num_heads: usize,
    p: f64,
    training: TrainingFlag,
}

impl Module for BertSelfAttention {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("query", &self.query);
        v.child("key", &self.key);
        v.child("value", &self.value);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

impl BertSelfAttention {
    /// `x [B, T, H]`, `mask` additive `[B, 1, 1, T]`.
    fn forward_masked(&self, x: &Var, mask: Option<&Tensor>) -> Var {
        let (b, t, e) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let h = self.num_heads;
        let heads = |v: Var| v.reshape([b, t, h, e / h]).transpose(1, 2);
        let (q, k, v) =
            (heads(self.query.forward(x)), heads(self.key.forward(x)), heads(self.value.forward(x)));
        let p = if self.training.get() { self.p } else { 0.0 };
        let y = scaled_dot_product_attention_with(&q, &k, &v, mask, p, false, None);
        y.transpose(1, 2).reshape([b, t, e])
    }
}

/// `dense`, dropout, residual add and `LayerNorm` (`BertSelfOutput` and `BertOutput`).
#[derive(Debug)]
pub struct BertResidual {
    pub dense: Linear,
    /// `LayerNorm` in the state dict.
    pub layer_norm: LayerNorm,
    p: f64,
    training: TrainingFlag,
}

impl BertResidual {
    fn new(i: usize, c: &BertConfig, device: Device) -> Result<BertResidual> {
        Ok(BertResidual {
            dense: linear(i, c.hidden_size, c, device)?,
            layer_norm: layer_norm(c, device)?,
            p: c.hidden_dropout_prob,
            training: TrainingFlag::default(),
        })
    }

    fn forward(&self, x: &Var, residual: &Var) -> Var {
        let y = dropout(&self.dense.forward(x), self.p, self.training.get());
        // The residual add and the norm as one op; the sum itself is not needed after it.
        self.layer_norm.forward_add(residual, &y).1
    }
}

impl Module for BertResidual {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("dense", &self.dense);
        v.child("LayerNorm", &self.layer_norm);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

/// `BertAttention`: `self` and `output`.
#[derive(Debug)]
pub struct BertAttention {
    pub self_: BertSelfAttention,
    pub output: BertResidual,
}

impl Module for BertAttention {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("self", &self.self_);
        v.child("output", &self.output);
    }
}

/// `BertIntermediate`: `dense` and the activation.
#[derive(Debug)]
pub struct BertIntermediate {
    pub dense: Linear,
    pub act: Activation,
}

impl Module for BertIntermediate {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("dense", &self.dense);
    }
}

/// One post-norm encoder layer (`BertLayer`).
#[derive(Debug)]
pub struct BertLayer {
    pub attention: BertAttention,
    pub intermediate: BertIntermediate,
    pub output: BertResidual,
}

impl BertLayer {
    pub(crate) fn new(c: &BertConfig, act: Activation, device: Device) -> Result<BertLayer> {
        let (hs, h) = (c.hidden_size, c.num_attention_heads);
        assert!(
            h > 0 && hs.is_multiple_of(h),
            "BERT: hidden_size ({hs}) must be divisible by num_attention_heads ({h})"
        );
        let p = c.attention_probs_dropout_prob;
        Ok(BertLayer {
            attention: BertAttention {
                self_: BertSelfAttention {
                    query: linear(hs, hs, c, device)?,
                    key: linear(hs, hs, c, device)?,
                    value: linear(hs, hs, c, device)?,
                    num_heads: h,
                    p,
                    training: TrainingFlag::default(),
                },
                output: BertResidual::new(hs, c, device)?,
            },
            intermediate: BertIntermediate { dense: linear(hs, c.intermediate_size, c, device)?, act },
            output: BertResidual::new(c.intermediate_size, c, device)?,
        })
    }

    /// `x [B, T, H]`, `mask` the additive padding mask `[B, 1, 1, T]`.
    pub fn forward_masked(&self, x: &Var, mask: Option<&Tensor>) -> Var {
        let a = self.attention.output.forward(&self.attention.self_.forward_masked(x, mask), x);
        let i = self.intermediate.act.apply(&self.intermediate.dense.forward(&a));
        self.output.forward(&i, &a)
    }
}

impl Module for BertLayer {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("attention", &self.attention);
        v.child("intermediate", &self.intermediate);
        v.child("output", &self.output);
    }
}
