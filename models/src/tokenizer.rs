//! Hugging Face tokenizers (`tokenizer.json`) to batches of id tensors.
//!
//! A thin layer over the `tokenizers` crate (built without network access or C libraries):
//! [`Tokenizer::encode_batch`] pads and truncates a batch of texts and returns the
//! `input_ids`, `attention_mask` and `token_type_ids` tensors the models take, as
//! `tokenizer(texts, padding=True, truncation=True, return_tensors="pt")` does.

use crate::{ModelError, Result};
use oxtrain_tensor::{Device, Tensor};
use std::path::{Path, PathBuf};
use tokenizers::{PaddingDirection, PaddingParams, PaddingStrategy, TruncationParams};

/// How [`Tokenizer::encode_batch`] pads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// To the longest sequence of the batch (`padding=True`).
    Longest,
    /// To exactly this length (`padding="max_length"`); longer sequences are truncated to it.
    Fixed(usize),
}

/// A tokenized batch: `[B, T]` tensors of int64, the dtype Hugging Face returns.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub input_ids: Tensor,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Tensor,
    pub token_type_ids: Tensor,
}

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({})", self.path.display())
    }
}

impl Tokenizer {
    /// Reads a `tokenizer.json` (a file, or a folder holding one).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path = path.join("tokenizer.json");
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        Ok(Tokenizer { inner, path })
    }

    /// The underlying `tokenizers::Tokenizer`, for everything this wrapper does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokenizes `texts` with special tokens ([CLS] ... [SEP] for BERT), truncates each to
    /// `max_length` tokens when given, pads as `padding` says, and returns `[B, T]` tensors on
    /// `device`. Padding uses the tokenizer's own pad token when `tokenizer.json` names one,
    /// else id 0, on the right unless the file says left.
    pub fn encode_batch(
        &self,
        texts: &[&str],
        padding: Padding,
        max_length: Option<usize>,
        device: Device,
    ) -> Result<Encoded> {
        let err =
            |e: tokenizers::Error| ModelError::Tokenizer { path: self.path.clone(), reason: e.to_string() };
        let mut tok = self.inner.clone();
        let limit = match padding {
            Padding::Fixed(n) => Some(max_length.map_or(n, |m| m.min(n))),
            Padding::Longest => max_length,
        };
        match limit {
            Some(max_length) => {
                let base = tok.get_truncation().cloned().unwrap_or_default();
                tok.with_truncation(Some(TruncationParams { max_length, ..base })).map_err(err)?;
            }
            None => {
                tok.with_truncation(None).map_err(err)?;
            }
        }
        let base = tok
            .get_padding()
            .cloned()
            .unwrap_or(PaddingParams { direction: PaddingDirection::Right, ..Default::default() });
        let strategy = match padding {
            Padding::Longest => PaddingStrategy::BatchLongest,
            Padding::Fixed(n) => PaddingStrategy::Fixed(n),
        };
        tok.with_padding(Some(PaddingParams { strategy, ..base }));
        let encodings = tok.encode_batch(texts.to_vec(), true).map_err(err)?;
        let b = encodings.len();
        let t = encodings.first().map_or(0, |e| e.get_ids().len());
        let collect = |f: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Result<Tensor> {
            let data: Vec<i64> = encodings.iter().flat_map(|e| f(e).iter().map(|&x| x as i64)).collect();
            Ok(Tensor::from_vec(data, [b, t], device)?)
        };
        Ok(Encoded {
            input_ids: collect(&|e| e.get_ids())?,
            attention_mask: collect(&|e| e.get_attention_mask())?,
            token_type_ids: collect(&|e| e.get_type_ids())?,
        })
    }
}
