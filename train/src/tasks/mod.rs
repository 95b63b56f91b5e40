//! What the loop trains: each task builds its model, its batches and its evaluation from the
//! config; the loop in [`crate::trainer`] is the same for all of them.

pub mod finetune;
pub mod image;
pub mod language_model;
pub mod text_classification;

use crate::config::{Config, ModelName};
pub use crate::runtime::Placement;
use crate::runtime::{Strategy, TrainError};
use oxtrain_autograd::Var;
use oxtrain_datasets::SamplerState;
use oxtrain_nn::Module;

/// An evaluation: the mean loss and the task's metrics (`accuracy`, `top5`, `perplexity`).
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub metrics: Vec<(String, f64)>,
    pub samples: usize,
}

impl Evaluation {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

pub type TaskResult<T> = Result<T, TrainError>;

/// Work done with whichever task a config names (training it, evaluating it): the caller
/// writes it once for every task, and [`with_task`] is the one place a model picks its task.
pub trait WithTask {
    type Output;
    fn run<T: Task>(self, task: T) -> TaskResult<Self::Output>;
}

/// Builds the task of `config` (by `model.name`) and hands it to `work`.
pub fn with_task<W: WithTask>(config: &Config, place: Placement, work: W) -> TaskResult<W::Output> {
    match config.model.name {
        ModelName::Gpt2 => work.run(language_model::LanguageModel::new(config, place)?),
        ModelName::Bert => work.run(text_classification::TextClassification::new(config, place)?),
        _ => work.run(image::ImageClassification::new(config, place)?),
    }
}

/// A training task: model, data and metrics.
pub trait Task {
    type Model: Module + 'static;
    type Batch;

    /// The run's config with what the data resolved (an image task's class list): what
    /// checkpoints and the model folder save.
    fn config(&self) -> &Config;

    /// What throughput counts: "img/s", "tokens/s", "samples/s".
    fn unit(&self) -> &'static str;

    /// What the task trains, for the start-up line.
    fn describe(&self) -> String;

    fn build_model(&self) -> TaskResult<Self::Model>;

    /// Batches of one epoch on this rank.
    fn batches_per_epoch(&self) -> usize;

    /// This rank's batches of `epoch`, on the task's device.
    fn batches(&self, epoch: u64) -> Box<dyn Iterator<Item = TaskResult<Self::Batch>> + '_>;

    /// Starts loading the first batches of `epoch` in the background (the loop's first epoch,
    /// while the model is built); later epochs load ahead by themselves. Nothing by default.
    fn prefetch(&self, _epoch: u64) {}

    /// This rank's position in its training data (epoch, samples used), for a checkpoint.
    fn data_state(&self) -> SamplerState;

    /// Continues from a saved position: the next `batches(state.epoch)` goes on from there.
    /// Returns the batches left in that epoch (0: it was used up; the loop starts the next).
    fn restore_data_state(&self, state: &SamplerState) -> TaskResult<usize>;

    /// Units (images, tokens, texts) in a batch, for throughput.
    fn units(&self, batch: &Self::Batch) -> usize;

    /// Files this rank's loaders met that did not decode and were replaced or skipped (the
    /// metrics' `bad_files`).
    fn bad_files(&self) -> usize {
        0
    }

    /// Files the GPU decoder refused and the CPU decoded instead, so far on this rank (None
    /// when nothing is decoded on the GPU; the metrics' `gpu_decode_fallbacks`).
    fn gpu_decode_fallbacks(&self) -> Option<usize> {
        None
    }

    /// The training loss of `batch` (forward included).
    fn loss(&self, model: &Self::Model, batch: &Self::Batch) -> Var;

    /// The whole evaluation set, every rank its share, summed over ranks; `None` without one.
    fn evaluate(&self, strategy: &Strategy<Self::Model>) -> TaskResult<Option<Evaluation>>;
}

/// Sums `(loss_sum, counts...)` over ranks and makes an [`Evaluation`] with `names[i] =
/// counts[i] / samples`.
pub(crate) fn finish_eval<M: Module>(
    strategy: &Strategy<M>,
    loss_sum: f64,
    samples: usize,
    counts: &[(&str, f64)],
) -> TaskResult<Evaluation> {
    let mut values = vec![loss_sum, samples as f64];
    values.extend(counts.iter().map(|(_, v)| *v));
    let summed = strategy.sum(&values).map_err(|e| TrainError::comm("", e))?;
    let n = summed[1].max(1.0);
    Ok(Evaluation {
        loss: summed[0] / n,
        metrics: counts.iter().zip(&summed[2..]).map(|((name, _), v)| (name.to_string(), v / n)).collect(),
        samples: summed[1] as usize,
    })
}

/// `DataLoader::load_state_dict` with the error a resumed run shows.
pub(crate) fn restore_loader<D: oxtrain_datasets::Dataset>(
    loader: &oxtrain_datasets::DataLoader<D>,
    state: &SamplerState,
) -> TaskResult<usize> {
    // Saved on another number of ranks: the same global order, dealt to this world.
    loader
        .load_state_dict_any_world(state)
        .map_err(|e| TrainError::data("the checkpoint's data position does not fit this run's data", e))?;
    Ok(loader.remaining_batches())
}
