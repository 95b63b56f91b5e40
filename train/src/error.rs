//! `oxtrain::Error`: every crate's error behind one type, so `?` works across crates in user
//! code. Each variant keeps the crate's own error (match on it, or read its message: the
//! messages already say what failed and what to do).

/// Any error of the oxtrain crates, or of the program around them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Tensors: files, devices, memory, the GPU driver.
    #[error(transparent)]
    Tensor(#[from] oxtrain_tensor::Error),

    /// A state dict that does not fit a module (`load_state_dict`).
    #[error(transparent)]
    Load(#[from] oxtrain_nn::LoadError),

    /// `optim.freeze` patterns that do not fit the model.
    #[error(transparent)]
    Freeze(#[from] oxtrain_nn::FreezeError),

    /// LoRA adapters that do not fit the model, or PEFT files that cannot be read or written.
    #[error(transparent)]
    Lora(#[from] oxtrain_nn::lora::LoraError),

    /// Models: configs, checkpoints, tokenizers.
    #[error(transparent)]
    Model(#[from] oxtrain_models::ModelError),

    /// Datasets and loaders: images, text files, loader settings.
    #[error(transparent)]
    Data(#[from] oxtrain_datasets::Error),

    /// Communication: bootstrap, peers, backends.
    #[error(transparent)]
    Comm(#[from] oxtrain_comm::CommError),

    /// DistributedDataParallel: wrapping a model (same model on every rank, dtypes, bucket
    /// sizes) and reducing its gradients.
    #[error(transparent)]
    Ddp(#[from] oxtrain_ddp::DdpError),

    /// A backward pass whose end-of-backward work failed (under DDP: a collective that failed
    /// or timed out, a parameter that got no gradient), from `loss.try_backward()`.
    #[error(transparent)]
    Backward(#[from] oxtrain_autograd::BackwardError),

    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// A config file or override that does not parse or check (`Config::load`).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),

    /// A checkpoint that cannot be written, found or trusted.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),

    /// `oxtrain launch`: its arguments, or a rank that failed.
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),

    /// Why a run (or an evaluation, an export) stopped; its config and checkpoint errors come
    /// as [`Error::Config`] and [`Error::Checkpoint`], so each has one place to match.
    /// Boxed: a `TrainError` holds an `Error` as its source.
    #[error(transparent)]
    Train(Box<crate::runtime::TrainError>),

    /// Anything else (a user's own errors): see [`Error::other`].
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps any other error (`io::Error::other` style).
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Other(error.into())
    }
}

impl From<crate::runtime::TrainError> for Error {
    fn from(error: crate::runtime::TrainError) -> Error {
        use crate::runtime::TrainError;
        match error {
            TrainError::Config(e) => Error::Config(e),
            TrainError::Checkpoint(e) => Error::Checkpoint(e),
            other => Error::Train(Box::new(other)),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Fallible calls of several crates, joined with `?` in one function of user code.
    fn user_code(dir: &Path, step: u32) -> Result<()> {
        match step {
            0 => drop(oxtrain_tensor::safetensors::load_all(dir.join("no-such.safetensors"))?),
            1 => drop(oxtrain_models::Gpt2Config::from_file(dir.join("no-such-config.json"))?),
            2 => {
                let transform = oxtrain_datasets::ImageTransform::imagenet_train(32);
                drop(oxtrain_datasets::ImageFolder::new(dir.join("no-such-folder"), transform)?)
            }
            _ => drop(std::fs::read(dir.join("no-such-file"))?),
        }
        Ok(())
    }

    #[test]
    fn question_mark_crosses_every_crate() {
        let dir = std::env::temp_dir().join(format!("oxtrain-error-{}", std::process::id()));
        assert!(matches!(user_code(&dir, 0), Err(Error::Tensor(_))));
        assert!(matches!(user_code(&dir, 1), Err(Error::Model(_))));
        assert!(matches!(user_code(&dir, 2), Err(Error::Data(_))));
        assert!(matches!(user_code(&dir, 3), Err(Error::Io(_))));

        let load = oxtrain_nn::LoadError::Mismatch {
            missing: vec!["w".into()],
            unexpected: vec![],
            mismatched: vec![],
        };
        let load = Error::from(load);
        assert!(matches!(load, Error::Load(_)) && load.to_string().contains("missing: w"), "{load}");

        let comm =
            Error::from(oxtrain_comm::CommError::MissingVariable { var: "RANK", launcher: "torchrun-style" });
        assert!(matches!(comm, Error::Comm(_)) && comm.to_string().contains("RANK is not set"));

        let other = Error::other("the trainer's own reason");
        assert_eq!(other.to_string(), "the trainer's own reason");
    }

    /// The trainer's errors join the rest: a typed variant to match on, whose message is the
    /// trainer's, and config errors in one place whether they came through a run or not.
    #[test]
    fn trainer_errors_are_one_of_the_variants() {
        use crate::runtime::TrainError;
        use std::error::Error as _;

        let bad_override = crate::config::Config::load::<&str>(None, &["no_such_section.key=1"]).unwrap_err();
        let through_run = Error::from(TrainError::from(bad_override));
        assert!(matches!(through_run, Error::Config(_)), "{through_run:?}");

        let missing = std::env::temp_dir().join(format!("oxtrain-no-such-data-{}", std::process::id()));
        let data = oxtrain_datasets::image_folder::find_classes(&missing).unwrap_err();
        let train = TrainError::data("data.train", data);
        let message = train.to_string();
        let error = Error::from(train);
        let Error::Train(train) = &error else { panic!("not Error::Train: {error:?}") };
        let TrainError::Data { source, .. } = &**train else { panic!("not TrainError::Data: {train:?}") };
        assert!(matches!(**source, Error::Data(_)), "{source:?}");
        assert_eq!(error.to_string(), message);
        assert_eq!(train.source().map(|s| s.to_string()), Some(source.to_string()));
    }
}
