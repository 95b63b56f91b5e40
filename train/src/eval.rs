//! `oxtrain eval --checkpoint DIR`: the model of a model folder or checkpoint, evaluated on
//! its config's evaluation data or on `--data`: top-1/top-5 for images, perplexity for
//! language models, accuracy and loss for classification.

use crate::config::{Config, DataKind};
use crate::runtime::{placement, Strategy, TrainError};
use crate::tasks::{self, Evaluation, Task, WithTask};
use crate::trainer::read_model_dir;
use oxtrain_nn::Module;
use std::path::Path;

/// The checkpoint's config (with `overrides` and `data` applied) and its evaluation.
pub fn evaluate_checkpoint<S: AsRef<str>>(
    dir: &Path,
    data: Option<&str>,
    overrides: &[S],
) -> Result<(Config, Evaluation), TrainError> {
    let (saved, weights) = read_model_dir(dir)?;
    let mut config =
        Config::from_toml_str(&saved.to_toml(), &dir.join("config.toml").display().to_string(), overrides)?;
    if let Some(d) = data {
        // The tasks read their class list and tokenizer from the training side: point both at
        // the data to evaluate.
        config.data.val = d.into();
        if config.data.kind != DataKind::SyntheticShapes {
            config.data.train = d.into();
        }
    }
    if config.data.val.is_empty() && config.data.kind != DataKind::SyntheticShapes {
        return Err(TrainError::NoValData);
    }
    config.check()?;
    let place = placement(&config)?;
    let eval = tasks::with_task(&config, place, Evaluate { weights: &weights })?;
    Ok((config, eval))
}

/// A task's model with the saved weights, evaluated on its evaluation data.
struct Evaluate<'a> {
    weights: &'a Path,
}

impl WithTask for Evaluate<'_> {
    type Output = Evaluation;
    fn run<T: Task>(self, task: T) -> Result<Evaluation, TrainError> {
        let model = task.build_model()?;
        model
            .load_safetensors(self.weights, true)
            .map_err(|e| TrainError::model(self.weights.display().to_string(), e))?;
        let strategy = Strategy::single(model);
        task.evaluate(&strategy)?.ok_or_else(|| TrainError::NoEvalData)
    }
}
