//! BERT as Hugging Face's `BertModel` and `BertForSequenceClassification`, with their
//! state-dict names (`embeddings.word_embeddings.weight`,
//! `encoder.layer.0.attention.self.query.weight`, `pooler.dense.weight`, `bert.` + those and
//! `classifier.weight` in the classifier), plus sentence-transformers' mean pooling.

mod config;
mod layers;

pub use config::BertConfig;
pub use layers::{
    BertAttention, BertEmbeddings, BertIntermediate, BertLayer, BertResidual, BertSelfAttention,
};

use crate::gpt2::Activation;
use crate::list::List;
use crate::loading::{given_or_read, load_pretrained, read_checkpoint, NameRules};
use crate::mask::additive_mask;
use crate::Result;
use oxtrain_autograd::{checkpoint, Var};
use oxtrain_nn::functional::dropout;
use oxtrain_nn::{init, Forward, Linear, LoadReport, Module, TrainingFlag, Visitor};
use oxtrain_tensor::{Device, Tensor};
use std::path::Path;

/// Buffers older checkpoints saved that the model recomputes.
const IGNORED: &[&str] = &["embeddings.position_ids", "embeddings.token_type_ids"];

/// `BertEncoder`: the layers, `encoder.layer.{i}`.
#[derive(Debug)]
pub struct BertEncoder {
    pub layer: List<BertLayer>,
}

impl Module for BertEncoder {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("layer", &self.layer);
    }
}

/// `BertPooler`: `tanh(dense(hidden[:, 0]))`, the [CLS] summary.
#[derive(Debug)]
pub struct BertPooler {
    pub dense: Linear,
}

impl Module for BertPooler {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("dense", &self.dense);
    }
}

/// What [`BertModel::forward`] returns.
#[derive(Debug, Clone)]
pub struct BertOutput {
    /// `[B, T, hidden_size]`.
    pub last_hidden_state: Var,
    /// `[B, hidden_size]`, when the model has a pooler.
    pub pooler_output: Option<Var>,
}

/// The encoder without a head (`BertModel`).
#[derive(Debug)]
pub struct BertModel {
    pub embeddings: BertEmbeddings,
    pub encoder: BertEncoder,
    pub pooler: Option<BertPooler>,
    pub config: BertConfig,
    /// Run each layer under [`checkpoint`]: see [`BertModel::set_activation_checkpointing`].
    activation_checkpointing: bool,
}

impl BertModel {
    /// A freshly initialised model (N(0, initializer_range) weights as Hugging Face's
    /// `_init_weights`, from the global generator); `add_pooling_layer` as in `BertModel`.
    pub fn new(config: &BertConfig, add_pooling_layer: bool, device: Device) -> Result<BertModel> {
        config.check()?;
        let act = Activation::parse(&config.hidden_act)?;
        let layers: Vec<BertLayer> = (0..config.num_hidden_layers)
            .map(|_| BertLayer::new(config, act, device))
            .collect::<oxtrain_tensor::Result<_>>()?;
        let pooler = if add_pooling_layer {
            let dense = Linear::new(config.hidden_size, config.hidden_size, device)?;
            init::normal_(&dense.weight.tensor(), 0.0, config.initializer_range, None);
            if let Some(b) = &dense.bias {
                init::zeros_(&b.tensor());
            }
            Some(BertPooler { dense })
        } else {
            None
        };
        Ok(BertModel {
            embeddings: BertEmbeddings::new(config, device)?,
            encoder: BertEncoder { layer: layers.into_iter().collect() },
            pooler,
            config: config.clone(),
            activation_checkpointing: false,
        })
    }

    /// The model of a checkpoint (`BertModel.from_pretrained(path)`), with its pooler:
    /// `path_or_dir` and `config` as in
    /// [`Gpt2LMHeadModel::from_pretrained`](crate::Gpt2LMHeadModel::from_pretrained); built
    /// without random initialisation and filled from the file. A checkpoint of a model with a
    /// head (`bert.` names) loads too, its head left out.
    pub fn from_pretrained(
        path_or_dir: impl AsRef<Path>,
        config: impl Into<Option<BertConfig>>,
        device: Device,
    ) -> Result<BertModel> {
        let path = path_or_dir.as_ref();
        let config = given_or_read(config.into(), path, |p| BertConfig::from_file(p))?;
        let model = init::no_init_weights(|| BertModel::new(&config, true, device))?;
        model.load_weights(path)?;
        Ok(model)
    }

    /// Loads a checkpoint (folder, file or index; see [`read_checkpoint`]).
    pub fn load_weights(&self, path: impl AsRef<Path>) -> Result<LoadReport> {
        let rules = NameRules { base_prefix: "bert", ignore_suffixes: IGNORED, may_be_missing: &[] };
        load_pretrained(self, read_checkpoint(path)?, &rules)
    }

    /// Activation checkpointing per layer (`model.gradient_checkpointing_enable()` in Hugging
    /// Face): each layer keeps only its input in training and reruns its forward in
    /// backward, random masks replayed, so gradients are those without it, bit for bit.
    pub fn set_activation_checkpointing(&mut self, on: bool) {
        self.activation_checkpointing = on;
    }

    pub fn activation_checkpointing(&self) -> bool {
        self.activation_checkpointing
    }

    /// `input_ids [B, T]`, `attention_mask [B, T]` (1 = token, 0 = padding; all tokens when
    /// `None`), `token_type_ids [B, T]` (zeros when `None`).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
    ) -> BertOutput {
        assert!(
            input_ids.rank() == 2,
            "BERT: expected input_ids [batch, seq], got shape {:?}",
            input_ids.dims()
        );
        let t = input_ids.dims()[1];
        let mut x = self.embeddings.forward_ids(input_ids, token_type_ids);
        let mask = additive_mask(attention_mask, false, [t, t], x.dtype(), "BERT");
        for layer in &self.encoder.layer.0 {
            x = if self.activation_checkpointing {
                let (layer, mask) = (layer.clone(), mask.clone());
                checkpoint(move |x| layer.forward_masked(x, mask.as_ref()), &x)
            } else {
                layer.forward_masked(&x, mask.as_ref())
            };
        }
        let pooler_output = self.pooler.as_ref().map(|p| p.dense.forward(&x.select(1, 0)).tanh());
        BertOutput { last_hidden_state: x, pooler_output }
    }
}

impl Module for BertModel {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("embeddings", &self.embeddings);
        v.child("encoder", &self.encoder);
        if let Some(p) = &self.pooler {
            v.child("pooler", p);
        }
    }
}

/// sentence-transformers' mean pooling: the average of the token vectors of `hidden [B, T, H]`
/// where `attention_mask [B, T]` is 1 (padding left out), `[B, H]`.
pub fn mean_pooling(hidden: &Var, attention_mask: &Tensor) -> Var {
    let (b, t) = (hidden.dims()[0], hidden.dims()[1]);
    assert_eq!(
        attention_mask.dims(),
        [b, t],
        "mean_pooling: attention_mask must be [batch, seq] of the hidden states"
    );
    let m = attention_mask.to_dtype(hidden.dtype()).unsqueeze(2);
    let counts = m.sum(1, false).clamp(1e-9, f64::INFINITY);
    hidden.mul(&Var::constant(m)).sum(1, false).div(&Var::constant(counts))
}

/// Each row divided by its L2 norm (at least 1e-12), as `F.normalize(x, p=2, dim=1)`.
pub fn l2_normalize(x: &Var) -> Var {
    let norm = x.square().sum(-1, true).sqrt().clamp(1e-12, f64::INFINITY);
    x.div(&norm)
}

/// `BertForSequenceClassification`: `bert` (with pooler), dropout, `classifier`.
#[derive(Debug)]
pub struct BertForSequenceClassification {
    pub bert: BertModel,
    pub classifier: Linear,
    pub num_labels: usize,
    p: f64,
    training: TrainingFlag,
}

impl BertForSequenceClassification {
    /// A freshly initialised model with `config.num_labels()` classes.
    pub fn new(config: &BertConfig, device: Device) -> Result<BertForSequenceClassification> {
        BertForSequenceClassification::with_encoder(BertModel::new(config, true, device)?, config, device)
    }

    fn with_encoder(
        bert: BertModel,
        config: &BertConfig,
        device: Device,
    ) -> Result<BertForSequenceClassification> {
        let num_labels = config.num_labels();
        let classifier = Linear::new(config.hidden_size, num_labels, device)?;
        init::normal_(&classifier.weight.tensor(), 0.0, config.initializer_range, None);
        if let Some(b) = &classifier.bias {
            init::zeros_(&b.tensor());
        }
        Ok(BertForSequenceClassification {
            bert,
            classifier,
            num_labels,
            p: config.classifier_dropout.unwrap_or(config.hidden_dropout_prob),
            training: TrainingFlag::default(),
        })
    }

    /// The model of a checkpoint, `path_or_dir` and `config` as in
    /// [`BertModel::from_pretrained`]. The encoder is built without random initialisation and
    /// filled from the file. A `BertModel` checkpoint (no `bert.` prefix, no classifier) loads
    /// too: the classifier keeps its fresh initialisation, the usual start of fine-tuning
    /// ([`load_weights`](Self::load_weights) returns the report that lists it as missing).
    pub fn from_pretrained(
        path_or_dir: impl AsRef<Path>,
        config: impl Into<Option<BertConfig>>,
        device: Device,
    ) -> Result<BertForSequenceClassification> {
        let path = path_or_dir.as_ref();
        let config = given_or_read(config.into(), path, |p| BertConfig::from_file(p))?;
        // Only the encoder skips its initialisation: the classifier may be absent from the
        // checkpoint and must then start from Hugging Face's initialisation.
        let bert = init::no_init_weights(|| BertModel::new(&config, true, device))?;
        let model = BertForSequenceClassification::with_encoder(bert, &config, device)?;
        model.load_weights(path)?;
        Ok(model)
    }

    pub fn load_weights(&self, path: impl AsRef<Path>) -> Result<LoadReport> {
        self.load_state(read_checkpoint(path)?)
    }

    /// [`load_weights`](Self::load_weights) of tensors already read (with
    /// [`read_checkpoint`]), e.g. after a fine-tuning run put a new head in their place.
    pub fn load_state(
        &self,
        state: std::collections::HashMap<String, oxtrain_tensor::Tensor>,
    ) -> Result<LoadReport> {
        let rules = NameRules {
            base_prefix: "bert",
            ignore_suffixes: IGNORED,
            may_be_missing: &["classifier.weight", "classifier.bias"],
        };
        load_pretrained(self, state, &rules)
    }

    /// Logits `[B, num_labels]` from the pooled [CLS] output.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        token_type_ids: Option<&Tensor>,
    ) -> Var {
        let out = self.bert.forward(input_ids, attention_mask, token_type_ids);
        let pooled = out.pooler_output.expect("BertForSequenceClassification's bert has a pooler");
        self.classifier.forward(&dropout(&pooled, self.p, self.training.get()))
    }

    /// Hugging Face's loss for `num_labels > 1`: cross-entropy against `labels [B]`.
    pub fn loss(logits: &Var, labels: &Tensor) -> Var {
        crate::loss::cross_entropy(logits, labels)
    }
}

impl Module for BertForSequenceClassification {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("bert", &self.bert);
        v.child("classifier", &self.classifier);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}
