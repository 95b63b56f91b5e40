//! `oxtrain tokenize`: text corpora to llm.c token shards, once, so that runs with
//! `data.kind = "token_shards"` start without tokenizing again.
//!
//! Documents are read as `data.kind = "text_lm"` reads them (a `.txt` file is one document, a
//! `.jsonl` file one per line's `"text"`), tokenized in parallel (rayon, a batch of documents
//! at a time) and packed in order with the tokenizer's end-of-text id after each, so the shards
//! hold exactly the stream that `text_lm` would have trained on.

use crate::runtime::TrainError;
use crate::tasks::text_classification::hf_tokenizer;
use oxtrain_datasets::text::documents;
use oxtrain_datasets::token_shards::{ShardWriter, TokenWidth};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// What to tokenize and where the shards go.
#[derive(Clone, Debug)]
pub struct TokenizeSpec {
    pub tokenizer: PathBuf,
    pub out: PathBuf,
    pub inputs: Vec<PathBuf>,
    /// Tokens per shard (llm.c's FineWeb script: 10^8).
    pub shard_tokens: usize,
    /// File names: `NAME_train_000000.bin`, ...
    pub name: String,
    /// The first shard is `NAME_val_000000.bin`, the validation split (llm.c's convention).
    pub val_first: bool,
    /// Draw a progress bar on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
}

/// What was written.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizeSummary {
    pub shards: Vec<PathBuf>,
    pub tokens: usize,
    pub documents: usize,
    pub width: TokenWidth,
}

/// Text of this many bytes is tokenized in parallel before its tokens are written.
const BATCH_BYTES: usize = 16 << 20;

/// Tokenizes `spec.inputs` into shards under `spec.out`.
pub fn tokenize(spec: &TokenizeSpec) -> Result<TokenizeSummary, TrainError> {
    let tok =
        hf_tokenizer(&spec.tokenizer, format!("--tokenizer {:?}", spec.tokenizer.display().to_string()))?;
    let width = TokenWidth::for_vocab(tok.vocab_size());
    let data_err = |what: &Path, e| TrainError::data(format!("{}", what.display()), e);
    let mut writer = ShardWriter::new(&spec.out, &spec.name, spec.shard_tokens, width, spec.val_first)
        .map_err(|e| data_err(&spec.out, e))?;
    let total_bytes: u64 =
        spec.inputs.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let bar = progress_bar(spec.progress, total_bytes);
    let mut documents_seen = 0;
    let mut batch: Vec<String> = Vec::new();
    let flush = |batch: &mut Vec<String>, writer: &mut ShardWriter| -> Result<(), TrainError> {
        let encoded: Vec<Vec<u32>> = batch.par_iter().map(|d| tok.encode(d)).collect();
        for ids in &encoded {
            writer.push(ids).map_err(|e| data_err(&spec.out, e))?;
            writer.push(tok.eos_token_id().as_slice()).map_err(|e| data_err(&spec.out, e))?;
        }
        bar.inc(batch.iter().map(|d| d.len() as u64).sum());
        batch.clear();
        Ok(())
    };
    for input in &spec.inputs {
        for doc in documents(input).map_err(|e| data_err(input, e))? {
            documents_seen += 1;
            batch.push(doc);
            if batch.iter().map(String::len).sum::<usize>() >= BATCH_BYTES {
                flush(&mut batch, &mut writer)?;
            }
        }
    }
    flush(&mut batch, &mut writer)?;
    bar.finish_and_clear();
    let tokens = writer.tokens();
    let shards = writer.finish().map_err(|e| data_err(&spec.out, e))?;
    Ok(TokenizeSummary { shards, tokens, documents: documents_seen, width })
}

fn progress_bar(on: bool, total_bytes: u64) -> indicatif::ProgressBar {
    if !on {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_bytes);
    let style = indicatif::ProgressStyle::with_template(
        "tokenizing {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
    )
    .expect("a valid template");
    bar.set_style(style);
    bar
}

impl TokenizeSummary {
    /// The lines `oxtrain tokenize` prints: what was written and the keys that train on it.
    pub fn report(&self, spec: &TokenizeSpec) -> String {
        let format = match self.width {
            TokenWidth::U16 => "u16 tokens, llm.c's GPT-2 format",
            TokenWidth::U32 => "u32 tokens, llm.c's Llama 3 format",
        };
        let pattern =
            |split: &str| spec.out.join(format!("{}_{split}_*.bin", spec.name)).display().to_string();
        let mut s = format!(
            "wrote {} tokens of {} documents into {} shard(s) in {} ({format})\ntrain on them with: \
             data.kind=token_shards data.train={:?}",
            self.tokens,
            self.documents,
            self.shards.len(),
            spec.out.display(),
            pattern("train"),
        );
        if spec.val_first {
            s += &format!(" data.val={:?}", pattern("val"));
            if self.shards.len() < 2 {
                s = format!(
                    "{s}\nno training shard: the corpus fits in the validation shard; lower --shard-tokens"
                );
            }
        }
        s += &format!(" data.tokenizer={:?}", spec.tokenizer.display().to_string());
        s
    }
}
