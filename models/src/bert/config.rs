//! `BertConfig` as Hugging Face writes it in `config.json`.

use crate::error::{read_json, ModelError, Result};
use std::collections::BTreeMap;
use std::path::Path;

fn default_act() -> String {
    "gelu".into()
}
fn default_pdrop() -> f64 {
    0.1
}
fn default_eps() -> f64 {
    1e-12
}
fn default_init_range() -> f64 {
    0.02
}
fn default_type_vocab() -> usize {
    2
}
fn default_max_pos() -> usize {
    512
}

/// The fields of Hugging Face's `BertConfig` that shape the model; the rest of a
/// `config.json` is ignored. Missing fields take `BertConfig`'s defaults.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_pdrop")]
    pub hidden_dropout_prob: f64,
    #[serde(default = "default_pdrop")]
    pub attention_probs_dropout_prob: f64,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub pad_token_id: Option<usize>,
    /// Dropout before the classifier; `None` means `hidden_dropout_prob`.
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    /// Class names by index; their count is `num_labels` (2 when absent, as in Hugging Face).
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
}

impl BertConfig {
    /// Reads a Hugging Face `config.json` and [checks](BertConfig::check) it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        let config: BertConfig = read_json(path)?;
        config.check().map_err(|e| e.in_file(path))?;
        Ok(config)
    }

    /// Whether the numbers can make a model: heads that split `hidden_size` evenly, a known
    /// activation. [`BertModel::new`](super::BertModel::new) calls it.
    pub fn check(&self) -> Result<()> {
        let (hs, h) = (self.hidden_size, self.num_attention_heads);
        if h == 0 || !hs.is_multiple_of(h) {
            return Err(ModelError::BadConfig {
                model: "BERT",
                reason: format!(
                    "hidden_size ({hs}) must be divisible by num_attention_heads ({h}): each head \
                     takes hidden_size / num_attention_heads channels"
                ),
            });
        }
        crate::gpt2::Activation::parse(&self.hidden_act)?;
        Ok(())
    }

    /// The number of classes of a sequence-classification head.
    pub fn num_labels(&self) -> usize {
        self.id2label.as_ref().map_or(2, BTreeMap::len)
    }

    /// BERT-base (uncased): 12 layers, 768 wide, 12 heads.
    pub fn bert_base() -> BertConfig {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: default_act(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            initializer_range: 0.02,
            pad_token_id: Some(0),
            classifier_dropout: None,
            id2label: None,
        }
    }
}
