//! Writing shards: a stream of tokens cut into files of a fixed token count, named as llm.c's
//! data scripts name theirs (`NAME_val_000000.bin`, `NAME_train_000001.bin`, ...).

use super::{header, shard_error, ShardProblem, TokenWidth};
use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Cuts a stream of tokens into shards of `shard_tokens` tokens (the last one shorter).
pub struct ShardWriter {
    dir: PathBuf,
    name: String,
    shard_tokens: usize,
    width: TokenWidth,
    /// The first shard is the validation split (llm.c: `fineweb_val_000000.bin`).
    val_first: bool,
    pending: Vec<u32>,
    written: Vec<PathBuf>,
    tokens: usize,
}

impl ShardWriter {
    /// Shards `dir/NAME_train_NNNNNN.bin` of `shard_tokens` tokens each (up to llm.c's limit of
    /// 2^31 - 1), the first one `NAME_val_000000.bin` when `val_first`.
    pub fn new(
        dir: impl Into<PathBuf>,
        name: &str,
        shard_tokens: usize,
        width: TokenWidth,
        val_first: bool,
    ) -> Result<ShardWriter> {
        if shard_tokens == 0 || shard_tokens > i32::MAX as usize {
            return Err(Error::Config(format!(
                "shard size {shard_tokens} tokens: use 1 to {} (llm.c's header counts in an int32)",
                i32::MAX
            )));
        }
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(ShardWriter {
            dir,
            name: name.to_string(),
            shard_tokens,
            width,
            val_first,
            pending: Vec::new(),
            written: Vec::new(),
            tokens: 0,
        })
    }

    /// Appends tokens to the stream, writing every shard that fills up.
    pub fn push(&mut self, mut tokens: &[u32]) -> Result<()> {
        while !tokens.is_empty() {
            let take = tokens.len().min(self.shard_tokens - self.pending.len());
            self.pending.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.pending.len() == self.shard_tokens {
                self.write_pending()?;
            }
        }
        Ok(())
    }

    /// Tokens pushed so far.
    pub fn tokens(&self) -> usize {
        self.tokens + self.pending.len()
    }

    /// Writes the last, partial shard; returns every shard written, in order.
    pub fn finish(mut self) -> Result<Vec<PathBuf>> {
        if !self.pending.is_empty() {
            self.write_pending()?;
        }
        Ok(self.written)
    }

    fn write_pending(&mut self) -> Result<()> {
        let index = self.written.len();
        let split = if self.val_first && index == 0 { "val" } else { "train" };
        let path = self.dir.join(format!("{}_{split}_{index:06}.bin", self.name));
        write_shard(&path, &self.pending, self.width)?;
        self.tokens += self.pending.len();
        self.pending.clear();
        self.written.push(path);
        Ok(())
    }
}

/// One shard file: written beside its final name, then renamed, so a stopped run never
/// leaves a truncated shard under a shard's name.
pub fn write_shard(path: &Path, tokens: &[u32], width: TokenWidth) -> Result<()> {
    let mut bytes = Vec::with_capacity(super::HEADER_BYTES + tokens.len() * width.bytes());
    bytes.extend_from_slice(&header(width, tokens.len()));
    match width {
        TokenWidth::U16 => {
            for &t in tokens {
                let t16 = u16::try_from(t)
                    .map_err(|_| shard_error(path, ShardProblem::TokenTooWide { token: t }))?;
                bytes.extend_from_slice(&t16.to_le_bytes());
            }
        }
        TokenWidth::U32 => bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes())),
    }
    let partial = path.with_extension("bin.partial");
    let mut file = std::fs::File::create(&partial).map_err(|e| Error::io(&partial, e))?;
    file.write_all(&bytes).and_then(|_| file.sync_all()).map_err(|e| Error::io(&partial, e))?;
    std::fs::rename(&partial, path).map_err(|e| Error::io(path, e))
}
