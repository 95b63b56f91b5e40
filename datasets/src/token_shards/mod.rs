//! Pre-tokenized corpora in llm.c's binary shard format, read by mmap.
//!
//! A shard (llm.c's `dev/data/data_common.py`, `write_datafile`) is a header of 256
//! little-endian int32 (`[0]` magic, `[1]` version, `[2]` token count, the rest zero) followed
//! by the tokens: u16 for GPT-2 (magic 20240520, version 1), u32 for Llama 3 (magic 20240801,
//! version 7). nanoGPT's `.bin` files are the same tokens without the header; they are refused
//! here (wrong magic) rather than guessed at.
//!
//! [`TokenShards`] opens a list of shards and reads them as one stream of tokens, shard after
//! shard, so blocks of the language-model dataset may span a shard boundary and the stream is
//! exactly what the text path ([`crate::LmDataset::from_files`]) would have packed.

#[cfg(test)]
mod tests;
mod writer;

pub use writer::{write_shard, ShardWriter};

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::path::{Path, PathBuf};

/// int32 values in a shard's header.
pub const HEADER_INTS: usize = 256;
pub const HEADER_BYTES: usize = HEADER_INTS * 4;

/// How wide a shard's tokens are, with the header values llm.c writes for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWidth {
    /// llm.c's "gpt-2" format: vocabularies up to 65536 ids.
    U16,
    /// llm.c's "llama-3" format.
    U32,
}

impl TokenWidth {
    pub const fn magic(self) -> i32 {
        match self {
            TokenWidth::U16 => 20240520,
            TokenWidth::U32 => 20240801,
        }
    }

    pub const fn version(self) -> i32 {
        match self {
            TokenWidth::U16 => 1,
            TokenWidth::U32 => 7,
        }
    }

    pub const fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// The narrowest format that holds every id of a vocabulary of `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> TokenWidth {
        if vocab_size <= 1 << 16 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }

    fn from_magic(magic: i32) -> Option<TokenWidth> {
        [TokenWidth::U16, TokenWidth::U32].into_iter().find(|w| w.magic() == magic)
    }
}

/// Why a file is not a usable token shard.
#[derive(Debug, thiserror::Error)]
pub enum ShardProblem {
    #[error("{len} bytes, shorter than the {HEADER_BYTES}-byte header (truncated or not a shard)")]
    ShortHeader { len: u64 },
    #[error(
        "magic number {found}, neither {} (llm.c GPT-2, u16 tokens) nor {} (llm.c Llama 3, u32 \
         tokens); a nanoGPT .bin has no header and is not read",
        TokenWidth::U16.magic(),
        TokenWidth::U32.magic()
    )]
    Magic { found: i32 },
    #[error("version {found} where magic {magic} has version {expected}")]
    Version { magic: i32, found: i32, expected: i32 },
    #[error("the header counts {count} tokens, a negative number")]
    NegativeCount { count: i32 },
    #[error(
        "the header counts {count} tokens ({expected} bytes with the header), the file holds {len} bytes"
    )]
    Length { count: usize, expected: u64, len: u64 },
    #[error("token {token} does not fit the u16 format (vocabulary over 65536 ids: write the u32 format)")]
    TokenTooWide { token: u32 },
    #[error("no shards: {0}")]
    NoShards(&'static str),
}

fn shard_error(path: &Path, problem: ShardProblem) -> Error {
    Error::TokenShard { path: path.to_path_buf(), problem }
}

/// One shard, mapped into memory.
pub struct TokenShard {
    path: PathBuf,
    map: Mmap,
    width: TokenWidth,
    len: usize,
}

impl std::fmt::Debug for TokenShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenShard({}, {} tokens of {:?})", self.path.display(), self.len, self.width)
    }
}

impl TokenShard {
    /// Maps `path` and checks its header against its length.
    pub fn open(path: impl AsRef<Path>) -> Result<TokenShard> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read only; a shard changed on disk while training reads changed
        // tokens (as a file read would), never memory outside the map.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (width, len) = check_header(&map).map_err(|p| shard_error(path, p))?;
        Ok(TokenShard { path: path.to_path_buf(), map, width, len })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn width(&self) -> TokenWidth {
        self.width
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn body(&self) -> &[u8] {
        &self.map[HEADER_BYTES..]
    }

    /// Tokens `start..start + out.len()` of this shard into `out`.
    fn read_into(&self, start: usize, out: &mut [i64]) {
        let w = self.width.bytes();
        let bytes = &self.body()[start * w..(start + out.len()) * w];
        match self.width {
            TokenWidth::U16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = u16::from_le_bytes([b[0], b[1]]) as i64;
                }
            }
            TokenWidth::U32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64;
                }
            }
        }
    }

    /// The largest token id in the shard (0 for an empty one).
    pub fn max_token(&self) -> u32 {
        match self.width {
            TokenWidth::U16 => {
                self.body().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).max()
            }
            TokenWidth::U32 => {
                self.body().chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).max()
            }
        }
        .unwrap_or(0)
    }
}

/// The format and token count of a shard's bytes, or why they are not one.
fn check_header(bytes: &[u8]) -> std::result::Result<(TokenWidth, usize), ShardProblem> {
    let len = bytes.len() as u64;
    if bytes.len() < HEADER_BYTES {
        return Err(ShardProblem::ShortHeader { len });
    }
    let int = |i: usize| i32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (magic, version, count) = (int(0), int(1), int(2));
    let width = TokenWidth::from_magic(magic).ok_or(ShardProblem::Magic { found: magic })?;
    if version != width.version() {
        return Err(ShardProblem::Version { magic, found: version, expected: width.version() });
    }
    let count = usize::try_from(count).map_err(|_| ShardProblem::NegativeCount { count })?;
    let expected = (HEADER_BYTES + count * width.bytes()) as u64;
    if expected != len {
        return Err(ShardProblem::Length { count, expected, len });
    }
    Ok((width, count))
}

/// The header llm.c writes before `count` tokens of `width`.
pub fn header(width: TokenWidth, count: usize) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    let count = i32::try_from(count).expect("llm.c's header counts fewer than 2^31 tokens");
    for (i, v) in [width.magic(), width.version(), count].into_iter().enumerate() {
        h[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    h
}

/// The shard files `spec` names: a folder (its `*.bin` files), a glob pattern
/// (`data/fineweb_train_*.bin`) or one file; sorted by name, as llm.c reads them.
pub fn shard_paths(spec: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(spec);
    let pattern = if path.is_dir() {
        path.join("*.bin").to_string_lossy().into_owned()
    } else if spec.contains(['*', '?', '[']) {
        spec.to_string()
    } else {
        return Ok(vec![path.to_path_buf()]);
    };
    let bad = |e: glob::PatternError| Error::Config(format!("{spec:?} is not a usable glob pattern: {e}"));
    let mut paths = Vec::new();
    for entry in glob::glob(&pattern).map_err(bad)? {
        let p = entry.map_err(|e| Error::io(e.path().to_path_buf(), e.into()))?;
        if p.is_file() {
            paths.push(p);
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(shard_error(
            path,
            ShardProblem::NoShards("no file matches; run `oxtrain tokenize` first"),
        ));
    }
    Ok(paths)
}

/// Shards read as one stream of tokens, in the order given.
#[derive(Debug)]
pub struct TokenShards {
    shards: Vec<TokenShard>,
    /// Where each shard starts in the stream, and the stream's length last.
    starts: Vec<usize>,
}

impl TokenShards {
    pub fn open(paths: &[PathBuf]) -> Result<TokenShards> {
        let shards = paths.iter().map(TokenShard::open).collect::<Result<Vec<_>>>()?;
        let mut starts = vec![0];
        for s in &shards {
            starts.push(starts.last().expect("starts at 0") + s.len());
        }
        Ok(TokenShards { shards, starts })
    }

    /// The shards `spec` names (see [`shard_paths`]).
    pub fn from_spec(spec: &str) -> Result<TokenShards> {
        TokenShards::open(&shard_paths(spec)?)
    }

    pub fn shards(&self) -> &[TokenShard] {
        &self.shards
    }

    pub fn len(&self) -> usize {
        *self.starts.last().expect("starts at 0")
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens `start..start + out.len()` of the stream into `out`, across shards as needed.
    pub fn read_into(&self, mut start: usize, mut out: &mut [i64]) {
        assert!(start + out.len() <= self.len(), "TokenShards::read_into past the end");
        while !out.is_empty() {
            let s = self.starts.partition_point(|&b| b <= start) - 1;
            let take = out.len().min(self.starts[s + 1] - start);
            let (here, rest) = out.split_at_mut(take);
            self.shards[s].read_into(start - self.starts[s], here);
            (start, out) = (start + take, rest);
        }
    }

    /// The largest token id of all shards (0 when empty), to check a vocabulary against.
    pub fn max_token(&self) -> u32 {
        self.shards.iter().map(TokenShard::max_token).max().unwrap_or(0)
    }
}
