//! Text datasets: a language-model dataset of packed token blocks, and a classification dataset
//! of `{"text": ..., "label": ...}` lines. Tokenizers plug in through [`Tokenizer`]; the
//! byte-level [`ByteTokenizer`] is built in for tests and examples.

use crate::dataset::{Dataset, Sample};
use crate::error::{Error, Result};
use crate::rng::SampleRng;
use crate::token_shards::TokenShards;
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// Text to token ids.
pub trait Tokenizer: Send + Sync {
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The id appended after each document when documents are packed together, if any.
    fn eos_token_id(&self) -> Option<u32> {
        None
    }
    fn vocab_size(&self) -> usize;
}

/// One token per UTF-8 byte (ids 0..=255) and an end-of-text id 256.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
    fn eos_token_id(&self) -> Option<u32> {
        Some(256)
    }
    fn vocab_size(&self) -> usize {
        257
    }
}

/// A tokenizer from a function, for tokenizers defined elsewhere.
pub struct FnTokenizer<F: Fn(&str) -> Vec<u32> + Send + Sync> {
    pub encode: F,
    pub eos_token_id: Option<u32>,
    pub vocab_size: usize,
}

impl<F: Fn(&str) -> Vec<u32> + Send + Sync> Tokenizer for FnTokenizer<F> {
    fn encode(&self, text: &str) -> Vec<u32> {
        (self.encode)(text)
    }
    fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// The documents of a file: a `.txt` is one document, a `.jsonl` one per line's `"text"`.
pub fn documents(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let jsonl = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("jsonl"));
    if !jsonl {
        return Ok(vec![text]);
    }
    let mut docs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad_record(path, n, format!("not JSON: {e}")))?;
        let t = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad_record(path, n, "no string field \"text\""))?;
        docs.push(t.to_string());
    }
    Ok(docs)
}

fn bad_record(path: &Path, line0: usize, reason: impl Into<String>) -> Error {
    Error::BadRecord { path: path.to_path_buf(), line: line0 + 1, reason: reason.into() }
}

/// Documents tokenized and packed end to end (with the tokenizer's end-of-text id between
/// them), cut into blocks of `block_size + 1` tokens that overlap by one: block `i` gives
/// `input = tokens[i*T .. i*T + T]` and `target = tokens[i*T + 1 .. i*T + T + 1]`.
#[derive(Clone, Debug)]
pub struct LmDataset {
    tokens: Tokens,
    block_size: usize,
}

/// The token stream: tokenized at start-up, or pre-tokenized shards read by mmap.
#[derive(Clone, Debug)]
enum Tokens {
    Owned(Vec<u32>),
    Shards(Arc<TokenShards>),
}

impl Tokens {
    fn len(&self) -> usize {
        match self {
            Tokens::Owned(t) => t.len(),
            Tokens::Shards(s) => s.len(),
        }
    }

    /// Tokens `start..start + out.len()` into `out`.
    fn read_into(&self, start: usize, out: &mut [i64]) {
        match self {
            Tokens::Owned(t) => {
                let n = out.len();
                for (o, &v) in out.iter_mut().zip(&t[start..start + n]) {
                    *o = v as i64;
                }
            }
            Tokens::Shards(s) => s.read_into(start, out),
        }
    }
}

impl LmDataset {
    /// From `.txt` and `.jsonl` files, in the order given.
    pub fn from_files(paths: &[PathBuf], tokenizer: &dyn Tokenizer, block_size: usize) -> Result<LmDataset> {
        if block_size == 0 {
            return Err(Error::Config(
                "LmDataset: block_size is 0; set it to the tokens per training sequence (1 or more)".into(),
            ));
        }
        let mut tokens = Vec::new();
        for p in paths {
            for doc in documents(p)? {
                tokens.extend(tokenizer.encode(&doc));
                tokens.extend(tokenizer.eos_token_id());
            }
        }
        Ok(LmDataset::from_tokens(tokens, block_size))
    }

    pub fn from_tokens(tokens: Vec<u32>, block_size: usize) -> LmDataset {
        assert!(block_size > 0, "LmDataset: block_size must be positive");
        LmDataset { tokens: Tokens::Owned(tokens), block_size }
    }

    /// From llm.c token shards (see [`crate::token_shards`]), read as one stream in the
    /// order given: the blocks are those [`LmDataset::from_files`] makes of the same tokens.
    pub fn from_shards(shards: TokenShards, block_size: usize) -> Result<LmDataset> {
        if block_size == 0 {
            return Err(Error::Config(
                "LmDataset: block_size is 0; set it to the tokens per training sequence (1 or more)".into(),
            ));
        }
        Ok(LmDataset { tokens: Tokens::Shards(Arc::new(shards)), block_size })
    }

    /// The shards the tokens come from, if they do.
    pub fn shards(&self) -> Option<&TokenShards> {
        match &self.tokens {
            Tokens::Shards(s) => Some(s),
            Tokens::Owned(_) => None,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.tokens.len().saturating_sub(1) / self.block_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Block `i` as (input, target), each `block_size` tokens.
    pub fn get(&self, i: usize) -> (Vec<i64>, Vec<i64>) {
        assert!(i < self.len(), "LmDataset::get: block {i} of {}", self.len());
        let t = self.block_size;
        let mut block = vec![0i64; t + 1];
        self.tokens.read_into(i * t, &mut block);
        (block[..t].to_vec(), block[1..].to_vec())
    }

    /// Blocks `indices` as `[B, T]` i64 input and target tensors.
    pub fn batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for &i in indices {
            let (a, b) = self.get(i);
            x.extend(a);
            y.extend(b);
        }
        let shape = [indices.len(), self.block_size];
        Ok((Tensor::from_vec(x, shape, Device::Cpu)?, Tensor::from_vec(y, shape, Device::Cpu)?))
    }
}

/// Through the [`crate::DataLoader`], a sample is the whole block of `T + 1` tokens (i64) and
/// the label its index: `input = block.narrow(1, 0, T)`, `target = block.narrow(1, 1, T)`.
impl Dataset for LmDataset {
    fn len(&self) -> usize {
        LmDataset::len(self)
    }
    fn sample(&self) -> Sample {
        Sample { shape: vec![self.block_size + 1], dtype: DType::I64 }
    }
    fn load_into(&self, index: usize, _rng: &mut SampleRng, out: &mut [u8]) -> Result<i64> {
        let t = self.block_size;
        let out: &mut [i64] = bytemuck::cast_slice_mut(out);
        self.tokens.read_into(index * t, &mut out[..t + 1]);
        Ok(index as i64)
    }
}

/// Lines of `{"text": "...", "label": ...}`; a label is an integer, or a string mapped to the
/// index of its name among the sorted distinct names.
#[derive(Clone, Debug)]
pub struct TextClassificationDataset {
    pub texts: Vec<String>,
    pub labels: Vec<i64>,
    /// The label names when labels were strings (index = label).
    pub label_names: Option<Vec<String>>,
}

impl TextClassificationDataset {
    pub fn from_jsonl(path: impl AsRef<Path>) -> Result<TextClassificationDataset> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut texts = Vec::new();
        let mut raw = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad_record(path, n, format!("not JSON: {e}")))?;
            let t = v
                .get("text")
                .and_then(|t| t.as_str())
                .ok_or_else(|| bad_record(path, n, "no string field \"text\""))?;
            let label = v.get("label").cloned().ok_or_else(|| bad_record(path, n, "no field \"label\""))?;
            if !(label.is_i64() || label.is_string()) {
                return Err(bad_record(path, n, format!("label {label} is neither an integer nor a string")));
            }
            texts.push(t.to_string());
            raw.push((n, label));
        }
        let strings = raw.iter().filter(|(_, l)| l.is_string()).count();
        if strings != 0 && strings != raw.len() {
            return Err(bad_record(
                path,
                raw.iter().find(|(_, l)| !l.is_string()).map_or(0, |r| r.0),
                "labels mix integers and strings",
            ));
        }
        if strings == 0 {
            let labels = raw.iter().map(|(_, l)| l.as_i64().expect("checked integer")).collect();
            return Ok(TextClassificationDataset { texts, labels, label_names: None });
        }
        let names: BTreeMap<String, i64> =
            raw.iter().map(|(_, l)| (l.as_str().expect("checked string").to_string(), 0)).collect();
        let index: BTreeMap<String, i64> =
            names.keys().enumerate().map(|(i, k)| (k.clone(), i as i64)).collect();
        let labels = raw.iter().map(|(_, l)| index[l.as_str().expect("checked string")]).collect();
        Ok(TextClassificationDataset { texts, labels, label_names: Some(index.into_keys().collect()) })
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    pub fn get(&self, i: usize) -> (&str, i64) {
        (&self.texts[i], self.labels[i])
    }

    /// Examples `indices` tokenized, truncated to `max_len` and right-padded with `pad_id` to
    /// the longest: `(input_ids [B, L], attention_mask [B, L], labels [B])`, all i64.
    pub fn batch(
        &self,
        indices: &[usize],
        tokenizer: &dyn Tokenizer,
        max_len: usize,
        pad_id: u32,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let encoded: Vec<Vec<u32>> = indices
            .iter()
            .map(|&i| tokenizer.encode(&self.texts[i]).into_iter().take(max_len).collect())
            .collect();
        let len = encoded.iter().map(Vec::len).max().unwrap_or(0);
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for e in &encoded {
            ids.extend(e.iter().map(|&v| v as i64).chain(std::iter::repeat_n(pad_id as i64, len - e.len())));
            mask.extend(std::iter::repeat_n(1i64, e.len()).chain(std::iter::repeat_n(0, len - e.len())));
        }
        let labels: Vec<i64> = indices.iter().map(|&i| self.labels[i]).collect();
        let shape = [indices.len(), len];
        Ok((
            Tensor::from_vec(ids, shape, Device::Cpu)?,
            Tensor::from_vec(mask, shape, Device::Cpu)?,
            Tensor::from_vec(labels, [indices.len()], Device::Cpu)?,
        ))
    }
}
