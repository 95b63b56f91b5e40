//! `oxtrain eval --checkpoint DIR`: the model of a model folder or checkpoint, evaluated on
//! its config's evaluation data or on `--data`: top-1/top-5 for images, perplexity for
//! language models, accuracy and loss for classification.

use crate::config::{Config, DataKind, ModelName};
use crate::tasks::{self, Evaluation, Task};
use crate::trainer::{placement, read_model_dir, Strategy, TrainError};
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
        return Err(TrainError::Data(
            "the checkpoint's config has no data.val: pass the data to evaluate with --data PATH".into(),
        ));
    }
    config.check()?;
    let place = placement(&config)?;
    let eval = match config.model.name {
        ModelName::Gpt2 => run(tasks::language_model::LanguageModel::new(&config, place)?, &weights)?,
        ModelName::Bert => {
            run(tasks::text_classification::TextClassification::new(&config, place)?, &weights)?
        }
        _ => run(tasks::image::ImageClassification::new(&config, place)?, &weights)?,
    };
    Ok((config, eval))
}

fn run<T: Task>(task: T, weights: &Path) -> Result<Evaluation, TrainError> {
    let model = task.build_model()?;
    model
        .load_safetensors(weights, true)
        .map_err(|e| TrainError::Model(format!("{}: {e}", weights.display())))?;
    let strategy = Strategy::single(model);
    task.evaluate(&strategy)?.ok_or_else(|| TrainError::Data("no evaluation data".into()))
}
