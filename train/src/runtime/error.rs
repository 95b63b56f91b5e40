//! Why a run stopped. Each failure of another crate keeps that crate's error as its source
//! (through [`crate::Error`], which holds every crate's error), under a variant that says which
//! part of the run failed and a `context` that says what it was doing; the messages read as
//! "data: data.train = \"...\": <the crate's message>". The source is boxed (an `Error` can hold
//! a `TrainError`): match on it through the field (`TrainError::Data { source, .. }`, then
//! `**source`); `source()` gives the same error for reporters that walk the chain.

use crate::Error;
use std::path::PathBuf;

/// `context: ` before the source's message, or nothing when there is no context.
fn lead(context: &str) -> String {
    if context.is_empty() {
        String::new()
    } else {
        format!("{context}: ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Reading, decoding or batching the data failed (or moving a batch to the device).
    #[error("data: {}{source}", lead(context))]
    Data {
        context: String,
        #[source]
        source: Box<Error>,
    },
    /// Building, loading or checking the model failed.
    #[error("model: {}{source}", lead(context))]
    Model {
        context: String,
        #[source]
        source: Box<Error>,
    },
    /// The device named by `train.device` could not be opened.
    #[error("device: {}{source}", lead(context))]
    Device {
        context: String,
        #[source]
        source: Box<Error>,
    },
    /// A collective, the process group or the launcher's variables failed.
    #[error("communication: {}{source}", lead(context))]
    Comm {
        context: String,
        #[source]
        source: Box<Error>,
    },
    /// A backward pass whose end-of-backward work failed (under DDP: a collective that failed
    /// or timed out). `step` and `epoch` count from 1, as the console does.
    #[error("communication: DDP backward of step {step} (epoch {epoch}): {source}")]
    Backward {
        step: usize,
        epoch: usize,
        #[source]
        source: oxtrain_autograd::BackwardError,
    },
    /// The ranks of a resumed run found different newest checkpoints (`found` is this rank's,
    /// `None` when it found none): each rank must see the same checkpoint folder.
    #[error(
        "communication: the ranks found different checkpoints to resume from (rank {rank}: {}); is the \
         checkpoint folder shared by every rank of this node?",
        found.as_ref().map_or("none".into(), |p| p.display().to_string())
    )]
    CheckpointsDiffer { rank: usize, found: Option<std::path::PathBuf> },
    /// The image folder `path` (the setting `key`) holds class folders that the training data
    /// does not: the model has no label for them.
    #[error(
        "data: {key} = {:?}: the class folder(s) {} are not among the {} classes the model is trained on ({}); \
         remove them or train with them",
        path.display().to_string(),
        unknown.join(", "),
        classes.len(),
        classes.join(", ")
    )]
    UnknownClasses { key: String, path: PathBuf, unknown: Vec<String>, classes: Vec<String> },
    /// The training folder `path` holds fewer than two class folders.
    #[error(
        "data: data.train = {:?}: one class folder ({}): a classifier needs at least two classes, each a folder \
         of its images under data.train",
        path.display().to_string(),
        classes.join(", ")
    )]
    OneClass { path: PathBuf, classes: Vec<String> },
    /// `what` went bad ("the loss is NaN", "a gradient is inf"); `advice` names the first bad
    /// tensor and what to do.
    #[error("{what} at step {step} (epoch {epoch}); {advice}")]
    NonFinite { what: String, step: usize, epoch: usize, advice: String },
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A fresh start in a folder that holds a run: what is there and the three ways on.
    #[error(
        "{} holds an earlier run ({}{}); continue it with `oxtrain train --resume`, start a new run \
         in another folder with log.dir=..., or delete it and start afresh with `oxtrain train --overwrite`",
        dir.display(),
        found.iter().take(3).map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        if found.len() > 3 { format!(" and {} more", found.len() - 3) } else { String::new() }
    )]
    RunExists { dir: std::path::PathBuf, found: Vec<std::path::PathBuf> },
    /// The model's width does not split into its attention heads.
    #[error("model: {model}: the width {width} is not a multiple of the {heads} heads; change model.hidden_size or model.heads")]
    HeadsDoNotDivide { model: &'static str, width: usize, heads: usize },
    /// A sequence setting (`data.block_size`, `data.max_length`) longer than the model reaches.
    #[error("model: {setting} = {length} is longer than the model's {positions} positions; {advice}")]
    LongerThanPositions { setting: &'static str, length: usize, positions: usize, advice: &'static str },
    #[error("model: the model's vocabulary ({model}) is smaller than the tokenizer's ({tokenizer})")]
    VocabTooSmall { model: usize, tokenizer: usize },
    /// Token shards holding an id the model has no embedding for.
    #[error(
        "data: {key} holds the token id {token}, outside the model's vocabulary of {vocab}; set data.tokenizer \
         to the tokenizer.json the shards were written with, or model.vocab_size above {token}"
    )]
    TokenOutOfVocab { key: &'static str, token: u32, vocab: usize },
    /// `dir` lacks the files of a model folder; `problem` says which.
    #[error("model: {} is not a model folder: {problem}", dir.display())]
    NotAModelFolder { dir: PathBuf, problem: String },
    /// A text-classification file without one usable line.
    #[error("data: {key} = {:?} has no lines of {{\"text\": ..., \"label\": ...}}", path.display().to_string())]
    NoLines { key: String, path: PathBuf },
    #[error("data: data.train has the label {label}; labels are 0, 1, 2, ... or names")]
    NegativeLabel { label: i64 },
    #[error(
        "data: data.train has {lines} lines, fewer than data.batch_size = {batch_size} x {world_size} process(es); \
         lower data.batch_size"
    )]
    TooFewLines { lines: usize, batch_size: usize, world_size: usize },
    #[error(
        "data: data.batch_size = {batch_size} on {world_size} process(es) needs {} training images per step, but \
         {} has {images}; lower data.batch_size to at most {}",
        batch_size * world_size,
        dir.display(),
        (images / world_size).max(1)
    )]
    TooFewImages { dir: PathBuf, images: usize, batch_size: usize, world_size: usize },
    /// A token file shorter than one block and its next token.
    #[error(
        "data: {key} = {:?} has {tokens} tokens, fewer than one block of data.block_size + 1 = {}; lower \
         data.block_size",
        path.display().to_string(),
        block_size + 1
    )]
    TooFewTokens { key: String, path: PathBuf, tokens: usize, block_size: usize },
    #[error(
        "data: data.train has {blocks} blocks of {block_size} tokens, fewer than data.batch_size = {batch_size} x \
         {world_size} process(es); lower data.batch_size or data.block_size"
    )]
    TooFewBlocks { blocks: usize, block_size: usize, batch_size: usize, world_size: usize },
    #[error(
        "data: an epoch has {batches_per_epoch} batches on this rank, fewer than train.grad_accum = {grad_accum}: \
         lower train.grad_accum or data.batch_size"
    )]
    AccumOverEpoch { batches_per_epoch: usize, grad_accum: usize },
    /// `data.bad_files = "skip"` under DDP: ranks would train on batches of different sizes.
    #[error(
        "data: data.bad_files = \"skip\" leaves a batch short wherever a file does not decode, so the {world_size} \
         ranks would train on batches of different sizes; use \"replace\" (another sample takes the bad one's \
         place) or \"fail\""
    )]
    SkipUnderDdp { world_size: usize },
    /// `oxtrain eval` of a checkpoint whose config names no validation data, without `--data`.
    #[error("data: the checkpoint's config has no data.val: pass the data to evaluate with --data PATH")]
    NoValData,
    #[error("data: no evaluation data")]
    NoEvalData,
    /// A file or folder of the run's output (metrics, plots, the model folder) could not be
    /// written; `source` is why (mostly `Error::Io`).
    #[error("cannot write {}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
}

impl TrainError {
    pub(crate) fn output(path: &std::path::Path, source: impl Into<Error>) -> TrainError {
        TrainError::Output { path: path.to_path_buf(), source: Box::new(source.into()) }
    }

    /// A data failure caused by `source` while doing `context` ("" when the source says all).
    pub(crate) fn data(context: impl Into<String>, source: impl Into<Error>) -> TrainError {
        TrainError::Data { context: context.into(), source: Box::new(source.into()) }
    }

    pub(crate) fn model(context: impl Into<String>, source: impl Into<Error>) -> TrainError {
        TrainError::Model { context: context.into(), source: Box::new(source.into()) }
    }

    pub(crate) fn device(context: impl Into<String>, source: impl Into<Error>) -> TrainError {
        TrainError::Device { context: context.into(), source: Box::new(source.into()) }
    }

    pub(crate) fn comm(context: impl Into<String>, source: impl Into<Error>) -> TrainError {
        TrainError::Comm { context: context.into(), source: Box::new(source.into()) }
    }
}
