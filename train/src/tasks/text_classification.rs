//! Text classification: BERT for sequence classification (all-MiniLM-L6-v2 or any BERT
//! folder, or random init) on `{"text", "label"}` lines; accuracy and loss.

use super::finetune::{replace_head, tune, Tuned, BERT_LORA};
use super::{finish_eval, Evaluation, Placement, Task, TaskResult};
use crate::config::Config;
use crate::runtime::{Strategy, TrainError};
use oxtrain_autograd::{no_grad, Var};
use oxtrain_datasets::{ByteTokenizer, DistributedSampler, TextClassificationDataset, Tokenizer};
use oxtrain_models::{BertConfig, BertForSequenceClassification};
use oxtrain_nn::Module;
use oxtrain_tensor::{DType, Tensor};
use std::path::Path;
use std::sync::Mutex;

/// `data.tokenizer`, else `init_from/tokenizer.json` when there is one, else bytes.
pub fn tokenizer_for(config: &Config) -> TaskResult<Box<dyn Tokenizer>> {
    let beside = Path::new(&config.model.init_from).join("tokenizer.json");
    let path = match config.data.tokenizer.as_str() {
        "" if !config.model.init_from.is_empty() && beside.is_file() => beside,
        "" => return Ok(Box::new(ByteTokenizer)),
        p => p.into(),
    };
    hf_tokenizer(&path, format!("data.tokenizer = {:?}", path.display().to_string()))
}

/// A Hugging Face tokenizer.json as a [`Tokenizer`], its end-of-text token found by name;
/// `context` says where the path came from in an error.
pub fn hf_tokenizer(path: &Path, context: String) -> TaskResult<Box<dyn Tokenizer>> {
    let tok = oxtrain_models::Tokenizer::from_file(path).map_err(|e| TrainError::data(context, e))?;
    let eos = ["<|endoftext|>", "[SEP]", "</s>"].iter().find_map(|t| tok.token_to_id(t));
    let vocab = tok.inner().get_vocab_size(true);
    Ok(Box::new(oxtrain_datasets::text::FnTokenizer {
        encode: move |text: &str| {
            tok.inner().encode(text, true).map(|e| e.get_ids().to_vec()).unwrap_or_default()
        },
        eos_token_id: eos,
        vocab_size: vocab,
    }))
}

pub struct TextClassification {
    config: Config,
    place: Placement,
    train: TextClassificationDataset,
    val: Option<TextClassificationDataset>,
    sampler: Mutex<DistributedSampler>,
    tokenizer: Box<dyn Tokenizer>,
    num_labels: usize,
    autocast: Option<DType>,
}

fn read(path: &str, key: &str) -> TaskResult<TextClassificationDataset> {
    let ds = TextClassificationDataset::from_jsonl(path).map_err(|e| TrainError::data(key, e))?;
    if ds.is_empty() {
        return Err(TrainError::NoLines { key: key.to_string(), path: path.into() });
    }
    Ok(ds)
}

/// (ids, mask, labels) of `indices`, on `device`.
type Batch = (Tensor, Tensor, Tensor);

impl TextClassification {
    pub fn new(config: &Config, place: Placement) -> TaskResult<Self> {
        let d = &config.data;
        let train = read(&d.train, "data.train")?;
        let val = match d.val.as_str() {
            "" => None,
            v => Some(read(v, "data.val")?),
        };
        let max_label =
            train.labels.iter().chain(val.iter().flat_map(|v| &v.labels)).copied().max().unwrap_or(0);
        if let Some(bad) = train.labels.iter().find(|&&l| l < 0) {
            return Err(TrainError::NegativeLabel { label: *bad });
        }
        let num_labels = match config.model.num_classes {
            0 => (max_label + 1).max(2) as usize,
            n => n,
        };
        if train.len() < d.batch_size * place.world_size {
            return Err(TrainError::TooFewLines {
                lines: train.len(),
                batch_size: d.batch_size,
                world_size: place.world_size,
            });
        }
        let sampler = DistributedSampler::new(train.len(), place.world_size, place.rank)
            .map_err(|e| TrainError::data("", e))?
            .shuffle(true)
            .seed(config.train.seed)
            .drop_last(true);
        let mut config = config.clone();
        // Saved with every checkpoint: evaluation and `export --merge-lora` rebuild the same head.
        config.model.num_classes = num_labels;
        Ok(TextClassification {
            tokenizer: tokenizer_for(&config)?,
            autocast: crate::runtime::autocast_dtype(&config),
            config,
            place,
            train,
            val,
            sampler: Mutex::new(sampler),
            num_labels,
        })
    }

    fn batch(&self, ds: &TextClassificationDataset, indices: &[usize]) -> TaskResult<Batch> {
        let pad = 0;
        let (ids, mask, labels) = ds
            .batch(indices, self.tokenizer.as_ref(), self.config.data.max_length, pad)
            .map_err(|e| TrainError::data("", e))?;
        let dev = self.place.device;
        let to = |t: Tensor| t.to_device(dev).map_err(|e| TrainError::data("", e));
        Ok((to(ids)?, to(mask)?, to(labels)?))
    }
}

/// The BERT shape: `init_from`'s config.json when it is a folder with one, else BERT-base with
/// the tokenizer's vocabulary; then the config's size keys and `num_labels` classes.
pub fn bert_config(config: &Config, tokenizer_vocab: usize, num_labels: usize) -> TaskResult<BertConfig> {
    let m = &config.model;
    let json = Path::new(&m.init_from).join("config.json");
    let mut c = if !m.init_from.is_empty() && json.is_file() {
        BertConfig::from_file(&json).map_err(|e| TrainError::model("", e))?
    } else {
        let mut c = BertConfig::bert_base();
        c.vocab_size = tokenizer_vocab;
        c
    };
    let set = |v: usize, f: &mut usize| {
        if v != 0 {
            *f = v
        }
    };
    set(m.layers, &mut c.num_hidden_layers);
    set(m.hidden_size, &mut c.hidden_size);
    set(m.heads, &mut c.num_attention_heads);
    set(m.intermediate_size, &mut c.intermediate_size);
    set(m.max_positions, &mut c.max_position_embeddings);
    set(m.vocab_size, &mut c.vocab_size);
    if m.dropout >= 0.0 {
        (c.hidden_dropout_prob, c.attention_probs_dropout_prob) = (m.dropout, m.dropout);
    }
    c.id2label = Some((0..num_labels).map(|i| (i.to_string(), format!("LABEL_{i}"))).collect());
    if c.hidden_size % c.num_attention_heads != 0 {
        return Err(TrainError::HeadsDoNotDivide {
            model: "BERT",
            width: c.hidden_size,
            heads: c.num_attention_heads,
        });
    }
    if config.data.max_length > c.max_position_embeddings {
        return Err(TrainError::LongerThanPositions {
            setting: "data.max_length",
            length: config.data.max_length,
            positions: c.max_position_embeddings,
            advice: "lower it",
        });
    }
    Ok(c)
}

/// BERT of the config's shape with `model.init_from`'s weights when given; a classifier of
/// another number of classes than the checkpoint's starts fresh, and `rank` 0 says so.
pub fn build_bert(
    config: &Config,
    tokenizer_vocab: usize,
    num_labels: usize,
    place: Placement,
) -> TaskResult<BertForSequenceClassification> {
    let model =
        BertForSequenceClassification::new(&bert_config(config, tokenizer_vocab, num_labels)?, place.device)
            .map_err(|e| TrainError::model("", e))?;
    let init = &config.model.init_from;
    if init.is_empty() {
        return Ok(model);
    }
    let mut state = oxtrain_models::loading::read_checkpoint(init)
        .map_err(|e| TrainError::model("model.init_from", e))?;
    if let Some(head) = replace_head(&model, &mut state, "classifier") {
        if place.rank == 0 {
            println!("{head}");
        }
    }
    model.load_state(state).map_err(|e| TrainError::model("model.init_from", e))?;
    Ok(model)
}

impl Task for TextClassification {
    type Model = Tuned<BertForSequenceClassification>;
    type Batch = Batch;

    fn config(&self) -> &Config {
        &self.config
    }

    fn unit(&self) -> &'static str {
        "samples/s"
    }

    fn describe(&self) -> String {
        format!("bert on {} texts of {} labels", self.train.len(), self.num_labels)
    }

    fn build_model(&self) -> TaskResult<Tuned<BertForSequenceClassification>> {
        let mut model = build_bert(&self.config, self.tokenizer.vocab_size(), self.num_labels, self.place)?;
        model.bert.set_activation_checkpointing(self.config.train.activation_checkpointing.is_on());
        tune(model, &self.config, BERT_LORA)
    }

    fn batches_per_epoch(&self) -> usize {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner()).num_samples() / self.config.data.batch_size
    }

    fn batches(&self, epoch: u64) -> Box<dyn Iterator<Item = TaskResult<Batch>> + '_> {
        // From a restored position when it is of this epoch (a resumed run), else from the start.
        let indices = {
            let mut s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
            if s.epoch() != epoch || s.position() >= s.num_samples() {
                s.set_epoch(epoch);
            }
            s.remaining()
        };
        let b = self.config.data.batch_size;
        let chunks: Vec<Vec<usize>> = indices.chunks_exact(b).map(<[usize]>::to_vec).collect();
        Box::new(chunks.into_iter().map(move |c| {
            self.sampler.lock().unwrap_or_else(|e| e.into_inner()).advance(c.len());
            self.batch(&self.train, &c)
        }))
    }

    fn data_state(&self) -> oxtrain_datasets::SamplerState {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner()).state_dict()
    }

    fn restore_data_state(&self, state: &oxtrain_datasets::SamplerState) -> TaskResult<usize> {
        let mut s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        s.load_state_dict_any_world(state).map_err(|e| {
            TrainError::data("the checkpoint's data position does not fit this run's data", e)
        })?;
        Ok(s.num_samples().saturating_sub(s.position()) / self.config.data.batch_size)
    }

    fn units(&self, batch: &Batch) -> usize {
        batch.2.elem_count()
    }

    fn loss(&self, model: &Tuned<BertForSequenceClassification>, (ids, mask, labels): &Batch) -> Var {
        BertForSequenceClassification::loss(&model.forward(ids, Some(mask), None), labels)
    }

    fn evaluate(
        &self,
        strategy: &Strategy<Tuned<BertForSequenceClassification>>,
    ) -> TaskResult<Option<Evaluation>> {
        let Some(val) = &self.val else { return Ok(None) };
        let model = strategy.module();
        model.eval();
        let mine: Vec<usize> = (self.place.rank..val.len()).step_by(self.place.world_size).collect();
        let (mut loss_sum, mut right) = (0.0, 0.0);
        for chunk in mine.chunks(self.config.data.batch_size) {
            let (ids, mask, labels) = self.batch(val, chunk)?;
            let logits = no_grad(|| match self.autocast {
                Some(dt) => oxtrain_autograd::autocast(dt, || model.forward(&ids, Some(&mask), None)),
                None => model.forward(&ids, Some(&mask), None),
            });
            let logits = Var::constant(logits.tensor().to_dtype(DType::F32));
            loss_sum +=
                BertForSequenceClassification::loss(&logits, &labels).tensor().item() * chunk.len() as f64;
            right += logits.tensor().argmax(1, false).eq(&labels).to_dtype(DType::F32).sum_all().item();
        }
        model.train(true);
        finish_eval(strategy, loss_sum, mine.len(), &[("accuracy", right)]).map(Some)
    }
}
