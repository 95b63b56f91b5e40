//! `GPT2Config` as Hugging Face writes it in `config.json`.

use crate::error::{read_json, ModelError, Result};
use std::path::Path;

fn default_eps() -> f64 {
    1e-5
}
fn default_pdrop() -> f64 {
    0.1
}
fn default_act() -> String {
    "gelu_new".into()
}
fn default_true() -> bool {
    true
}
fn default_init_range() -> f64 {
    0.02
}

/// The fields of Hugging Face's `GPT2Config` that shape the model; the rest of a
/// `config.json` is ignored. Missing fields take `GPT2Config`'s defaults.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    /// The longest sequence (rows of `wpe`).
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Width of the MLP's hidden layer; `None` means `4 * n_embd`.
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "default_act")]
    pub activation_function: String,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_pdrop")]
    pub embd_pdrop: f64,
    #[serde(default = "default_pdrop")]
    pub attn_pdrop: f64,
    #[serde(default = "default_pdrop")]
    pub resid_pdrop: f64,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
}

impl Gpt2Config {
    /// Reads a Hugging Face `config.json` and [checks](Gpt2Config::check) it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Gpt2Config> {
        let path = path.as_ref();
        let config: Gpt2Config = read_json(path)?;
        config.check().map_err(|e| e.in_file(path))?;
        Ok(config)
    }

    /// Whether the numbers can make a model: heads that split `n_embd` evenly, a known
    /// activation. [`Gpt2Model::new`](super::Gpt2Model::new) calls it.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(ModelError::BadConfig { model: "GPT-2", reason });
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!(
                "n_embd ({}) must be divisible by n_head ({}): each head takes n_embd / n_head channels",
                self.n_embd, self.n_head
            ));
        }
        super::Activation::parse(&self.activation_function)?;
        Ok(())
    }

    /// GPT-2 small (124M): 12 layers, 768 wide, 12 heads, 1024 positions, 50257 tokens.
    pub fn gpt2() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: None,
            activation_function: default_act(),
            layer_norm_epsilon: 1e-5,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            resid_pdrop: 0.1,
            initializer_range: 0.02,
            tie_word_embeddings: true,
            scale_attn_weights: true,
        }
    }

    pub fn inner_dim(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}
