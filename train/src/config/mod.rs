//! The training config: one TOML file with the sections `model`, `data`, `optim`, `schedule`,
//! `precision`, `train`, `ddp`, `checkpoint` and `log`, every key with a default, and
//! command-line `key=value` overrides checked like the file.
//!
//! ```
//! use oxtrain::config::Config;
//! let config = Config::load(None, &["optim.lr=0.05", "train.epochs=3"]).unwrap();
//! assert_eq!(config.optim.lr, 0.05);
//! let err = Config::load(None, &["train.epoch=3"]).unwrap_err();
//! assert!(err.to_string().contains("did you mean `epochs`"));
//! ```

mod check;
mod error;
mod load;
mod sections;
#[cfg(test)]
mod tests;

pub use check::{enum_name, parse_device};
pub use error::ConfigError;
pub use sections::*;

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The whole config. `Config::default()` is the built-in example.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub data: DataConfig,
    pub optim: OptimConfig,
    pub schedule: ScheduleConfig,
    pub precision: PrecisionConfig,
    pub train: TrainConfig,
    pub ddp: DdpSection,
    pub checkpoint: CheckpointConfig,
    pub log: LogConfig,
    pub lora: LoraSection,
}

impl Config {
    /// The config of `file` (or the defaults), with `overrides` (`section.key=value`) applied
    /// on top, then checked.
    pub fn load<S: AsRef<str>>(file: Option<&Path>, overrides: &[S]) -> Result<Config, ConfigError> {
        load::load(file, overrides)
    }

    /// Parses TOML text (as from a file named `origin`) with overrides, then checks it.
    pub fn from_toml_str<S: AsRef<str>>(
        text: &str,
        origin: &str,
        overrides: &[S],
    ) -> Result<Config, ConfigError> {
        load::from_str(text, origin, overrides)
    }

    /// Checks values that the types alone cannot: sizes of zero, learning rates that are
    /// negative, NaN or absurd, a model and data kind that do not go together.
    pub fn check(&self) -> Result<(), ConfigError> {
        check::check(self)
    }

    /// The resolved config as TOML, every key shown (`oxtrain config --print`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("every config value has a TOML form")
    }
}
