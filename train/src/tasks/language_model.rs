//! Language modelling: GPT-2 (random init at any size, or from a safetensors / Hugging Face
//! folder) on text files packed into blocks; the loss is the next-token cross-entropy and the
//! evaluation reports perplexity.

use super::finetune::{tune, Tuned, GPT2_LORA};
use super::text_classification::tokenizer_for;
use super::{finish_eval, Evaluation, Placement, Task, TaskResult};
use crate::config::{Config, DataKind};
use crate::runtime::{Strategy, TrainError};
use oxtrain_autograd::{no_grad, Var};
use oxtrain_datasets::{DataLoader, DistributedSampler, LmDataset, LoaderConfig, TokenShards};
use oxtrain_models::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_nn::Module;
use oxtrain_tensor::{DType, Tensor};
use std::path::{Path, PathBuf};

pub struct LanguageModel {
    config: Config,
    place: Placement,
    train: DataLoader<LmDataset>,
    val: Option<DataLoader<LmDataset>>,
    vocab_size: usize,
    autocast: Option<DType>,
}

fn dataset(
    config: &Config,
    path: &str,
    key: &str,
    tok: &dyn oxtrain_datasets::Tokenizer,
) -> TaskResult<LmDataset> {
    let block = config.data.block_size;
    let ds = match config.data.kind {
        DataKind::TokenShards => TokenShards::from_spec(path).and_then(|s| LmDataset::from_shards(s, block)),
        _ => LmDataset::from_files(&[PathBuf::from(path)], tok, block),
    }
    .map_err(|e| TrainError::data(format!("{key} = {path:?}"), e))?;
    if ds.is_empty() {
        return Err(TrainError::TooFewTokens {
            key: key.to_string(),
            path: PathBuf::from(path),
            tokens: ds.num_tokens(),
            block_size: block,
        });
    }
    Ok(ds)
}

/// The vocabulary the data needs: the tokenizer's; for token shards without a tokenizer
/// (data.tokenizer, or one beside model.init_from), GPT-2's, whose ids llm.c's u16 shards hold.
fn data_vocab(config: &Config, tok: &dyn oxtrain_datasets::Tokenizer) -> usize {
    let no_tokenizer = config.data.tokenizer.is_empty()
        && !Path::new(&config.model.init_from).join("tokenizer.json").is_file();
    if config.data.kind == DataKind::TokenShards && no_tokenizer {
        Gpt2Config::gpt2().vocab_size
    } else {
        tok.vocab_size()
    }
}

/// Every token of the shards (train, then val) has a row in a vocabulary of `vocab`.
fn check_shard_ids(sets: &[(&'static str, Option<&LmDataset>)], vocab: usize) -> TaskResult<()> {
    for (key, set) in sets {
        if let Some(shards) = set.and_then(|s| s.shards()) {
            let token = shards.max_token();
            if token as usize >= vocab {
                return Err(TrainError::TokenOutOfVocab { key, token, vocab });
            }
        }
    }
    Ok(())
}

/// The GPT-2 shape: `init_from`'s config.json when it is a folder with one, else GPT-2 small;
/// then the config's size keys, and the tokenizer's vocabulary when no other is given.
pub fn gpt2_config(config: &Config, tokenizer_vocab: usize) -> TaskResult<Gpt2Config> {
    let m = &config.model;
    let json = Path::new(&m.init_from).join("config.json");
    let mut c = if !m.init_from.is_empty() && json.is_file() {
        Gpt2Config::from_file(&json).map_err(|e| TrainError::model("", e))?
    } else {
        let mut c = Gpt2Config::gpt2();
        c.vocab_size = tokenizer_vocab;
        c
    };
    let set = |v: usize, field: &mut usize| {
        if v != 0 {
            *field = v
        }
    };
    set(m.layers, &mut c.n_layer);
    set(m.hidden_size, &mut c.n_embd);
    set(m.heads, &mut c.n_head);
    set(m.max_positions, &mut c.n_positions);
    set(m.vocab_size, &mut c.vocab_size);
    if m.intermediate_size != 0 {
        c.n_inner = Some(m.intermediate_size);
    }
    if m.dropout >= 0.0 {
        (c.embd_pdrop, c.attn_pdrop, c.resid_pdrop) = (m.dropout, m.dropout, m.dropout);
    }
    if c.n_embd % c.n_head != 0 {
        return Err(TrainError::HeadsDoNotDivide { model: "GPT-2", width: c.n_embd, heads: c.n_head });
    }
    if config.data.block_size > c.n_positions {
        return Err(TrainError::LongerThanPositions {
            setting: "data.block_size",
            length: config.data.block_size,
            positions: c.n_positions,
            advice: "lower it or raise model.max_positions",
        });
    }
    if c.vocab_size < tokenizer_vocab {
        return Err(TrainError::VocabTooSmall { model: c.vocab_size, tokenizer: tokenizer_vocab });
    }
    Ok(c)
}

/// GPT-2 of the config's shape (a vocabulary of `tokenizer_vocab` unless set), with
/// `model.init_from`'s weights when given.
pub fn build_gpt2(
    config: &Config,
    tokenizer_vocab: usize,
    device: oxtrain_tensor::Device,
) -> TaskResult<Gpt2LMHeadModel> {
    let c = gpt2_config(config, tokenizer_vocab)?;
    let model = Gpt2LMHeadModel::new(&c, device).map_err(|e| TrainError::model("", e))?;
    if !config.model.init_from.is_empty() {
        model.load_weights(&config.model.init_from).map_err(|e| TrainError::model("model.init_from", e))?;
    }
    Ok(model)
}

impl LanguageModel {
    pub fn new(config: &Config, place: Placement) -> TaskResult<Self> {
        let d = &config.data;
        let tok = tokenizer_for(config)?;
        let train_set = dataset(config, &d.train, "data.train", tok.as_ref())?;
        let val_set = match d.val.as_str() {
            "" => None,
            v => Some(dataset(config, v, "data.val", tok.as_ref())?),
        };
        if train_set.len() < d.batch_size * place.world_size {
            return Err(TrainError::TooFewBlocks {
                blocks: train_set.len(),
                block_size: d.block_size,
                batch_size: d.batch_size,
                world_size: place.world_size,
            });
        }
        let loader = |set: LmDataset, shuffle: bool, drop_last: bool| -> TaskResult<DataLoader<LmDataset>> {
            let sampler = DistributedSampler::new(set.len(), place.world_size, place.rank)
                .map_err(|e| TrainError::data("", e))?
                .shuffle(shuffle)
                .seed(config.train.seed);
            let lc = LoaderConfig {
                batch_size: d.batch_size,
                num_workers: 0,
                seed: config.train.seed,
                drop_last,
                pin_memory: oxtrain_datasets::PinMemory::Off,
                ..LoaderConfig::default()
            };
            DataLoader::new(set, sampler, lc).map_err(|e| TrainError::data("", e))
        };
        Ok(LanguageModel {
            config: config.clone(),
            place,
            train: loader(train_set, true, true)?,
            val: val_set.map(|v| loader(v, false, false)).transpose()?,
            vocab_size: data_vocab(config, tok.as_ref()),
            autocast: crate::runtime::autocast_dtype(config),
        })
    }

    /// `[B, T+1]` blocks to (inputs, labels) `[B, T]`: the model's loss shifts the labels.
    fn split(&self, block: Tensor) -> TaskResult<(Tensor, Tensor)> {
        let t = self.config.data.block_size;
        let x = block.narrow(1, 0, t).contiguous();
        let x = x.to_device(self.place.device).map_err(|e| TrainError::data("", e))?;
        Ok((x.clone(), x))
    }
}

impl Task for LanguageModel {
    type Model = Tuned<Gpt2LMHeadModel>;
    type Batch = (Tensor, Tensor);

    fn config(&self) -> &Config {
        &self.config
    }

    fn unit(&self) -> &'static str {
        "tokens/s"
    }

    fn describe(&self) -> String {
        format!(
            "gpt2 on {} tokens ({} blocks of {})",
            self.train.dataset().num_tokens(),
            self.train.dataset().len(),
            self.config.data.block_size
        )
    }

    fn build_model(&self) -> TaskResult<Tuned<Gpt2LMHeadModel>> {
        let vocab = gpt2_config(&self.config, self.vocab_size)?.vocab_size;
        let val = self.val.as_ref().map(|v| v.dataset());
        check_shard_ids(&[("data.train", Some(self.train.dataset())), ("data.val", val)], vocab)?;
        let mut model = build_gpt2(&self.config, self.vocab_size, self.place.device)?;
        model.transformer.set_activation_checkpointing(self.config.train.activation_checkpointing.is_on());
        model.set_chunked_loss(self.config.train.chunked_loss);
        tune(model, &self.config, GPT2_LORA)
    }

    fn batches_per_epoch(&self) -> usize {
        self.train.len()
    }

    fn batches(&self, epoch: u64) -> Box<dyn Iterator<Item = TaskResult<(Tensor, Tensor)>> + '_> {
        Box::new(self.train.epoch(epoch).map(move |b| {
            let mut b = b.map_err(|e| TrainError::data("", e))?;
            self.split(b.images())
        }))
    }

    fn data_state(&self) -> oxtrain_datasets::SamplerState {
        self.train.state_dict()
    }

    fn restore_data_state(&self, state: &oxtrain_datasets::SamplerState) -> TaskResult<usize> {
        super::restore_loader(&self.train, state)
    }

    fn units(&self, batch: &(Tensor, Tensor)) -> usize {
        batch.0.elem_count()
    }

    fn loss(&self, model: &Tuned<Gpt2LMHeadModel>, (x, y): &(Tensor, Tensor)) -> Var {
        model.forward_loss(x, y, None)
    }

    fn evaluate(&self, strategy: &Strategy<Tuned<Gpt2LMHeadModel>>) -> TaskResult<Option<Evaluation>> {
        let Some(val) = &self.val else { return Ok(None) };
        let model = strategy.module();
        model.eval();
        let (mut loss_sum, mut samples) = (0.0, 0usize);
        for b in val.epoch(0) {
            let mut b = b.map_err(|e| TrainError::data("", e))?;
            let (x, y) = self.split(b.images())?;
            let loss = no_grad(|| match self.autocast {
                Some(dt) => oxtrain_autograd::autocast(dt, || self.loss(model, &(x.clone(), y.clone()))),
                None => self.loss(model, &(x.clone(), y.clone())),
            });
            // Every block predicts block_size - 1 tokens; weigh blocks equally.
            let n = x.dims()[0];
            loss_sum += loss.tensor().to_dtype(DType::F32).item() * n as f64;
            samples += n;
        }
        model.train(true);
        let mut e = finish_eval(strategy, loss_sum, samples, &[])?;
        e.metrics.push(("perplexity".into(), e.loss.exp()));
        Ok(Some(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape checks are variants a caller can match, with the numbers that failed.
    #[test]
    fn shape_refusals_are_typed_variants() {
        let mut config = Config::default();
        (config.model.hidden_size, config.model.heads) = (100, 12);
        let err = gpt2_config(&config, 256).unwrap_err();
        assert!(
            matches!(err, TrainError::HeadsDoNotDivide { model: "GPT-2", width: 100, heads: 12 }),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("model: GPT-2: the width 100 is not a multiple of the 12 heads"));

        let mut config = Config::default();
        (config.model.max_positions, config.data.block_size) = (64, 128);
        let err = gpt2_config(&config, 256).unwrap_err();
        let TrainError::LongerThanPositions { setting, length, positions, .. } = err else {
            panic!("not LongerThanPositions: {err:?}")
        };
        assert_eq!((setting, length, positions), ("data.block_size", 128, 64));

        let mut config = Config::default();
        (config.model.vocab_size, config.data.block_size) = (100, 16);
        let err = gpt2_config(&config, 256).unwrap_err();
        assert!(matches!(err, TrainError::VocabTooSmall { model: 100, tokenizer: 256 }), "{err:?}");
    }
}
