//! A host copy of the training state at one step: what [`super::Checkpointer::save`] writes.
//! Taking it is the only part of a save the training step waits for.

use super::error::Result;
use super::image::{safetensors_image, AlignedBuf, FileImage};
use super::write::{Content, PartFile};
use oxtrain_datasets::SamplerState;
use oxtrain_nn::amp::GradScaler;
use oxtrain_nn::lr_scheduler::LrScheduler;
use oxtrain_nn::optim::Optimizer;
use oxtrain_nn::Module;
use oxtrain_tensor::{default_generator_state, Generator, GeneratorState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_FILE: &str = "trainer.json";
pub const CONFIG_FILE: &str = "config.toml";
/// The optimizer's param_groups JSON, in the safetensors metadata (as `OptimizerState::save`).
pub(crate) const GROUPS_KEY: &str = "param_groups";

pub fn rank_file(rank: usize) -> String {
    format!("rank-{rank}.json")
}

/// The replicated, small state of rank 0: `trainer.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TrainerState {
    pub step: u64,
    pub epoch: u64,
    pub scheduler: Option<serde_json::Value>,
    pub grad_scaler: Option<BTreeMap<String, f64>>,
    pub extra: serde_json::Value,
}

/// What is each rank's own: `rank-R.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RankState {
    pub rank: usize,
    pub world_size: usize,
    /// The process-wide generator (dropout, `Tensor::rand`, init) on every device: CUDA draws
    /// advance the same Philox counter, so its seed and offset are the whole state.
    pub default_generator: GeneratorState,
    /// Generators of the trainer's own, by name.
    pub generators: BTreeMap<String, GeneratorState>,
    pub sampler: Option<SamplerState>,
}

/// The state of one step, copied to host memory. Build it with
/// [`super::Checkpointer::snapshot`]; on ranks other than 0 the replicated parts (model,
/// optimizer, schedule, scaler, config) are skipped without a copy, as rank 0 writes them.
pub struct Snapshot {
    pub(crate) writes_replicated: bool,
    /// Memory of the previous save's files, reused so a copy writes into memory that is
    /// already mapped (a fresh allocation costs page faults as long as the copy itself).
    pub(crate) staging: Staging,
    /// The model's and the optimizer's safetensors files, as they go to disk.
    pub(crate) model: Option<FileImage>,
    pub(crate) optimizer: Option<FileImage>,
    pub(crate) config_toml: Option<String>,
    pub(crate) trainer: TrainerState,
    pub(crate) rank: RankState,
}

/// The memory of an earlier save's file images, by file name.
pub(crate) type Staging = HashMap<String, AlignedBuf>;

impl Snapshot {
    pub(crate) fn new(step: u64, epoch: u64, rank: usize, world_size: usize, staging: Staging) -> Snapshot {
        Snapshot {
            writes_replicated: rank == 0,
            staging,
            model: None,
            optimizer: None,
            config_toml: None,
            trainer: TrainerState { step, epoch, extra: serde_json::Value::Null, ..Default::default() },
            rank: RankState {
                rank,
                world_size,
                default_generator: default_generator_state(),
                generators: BTreeMap::new(),
                sampler: None,
            },
        }
    }

    pub fn step(&self) -> u64 {
        self.trainer.step
    }

    /// The model's parameters and buffers by state_dict name (PyTorch's names).
    pub fn model(mut self, model: &dyn Module) -> Result<Snapshot> {
        if self.writes_replicated {
            let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
            let reuse = self.staging.remove(MODEL_FILE);
            let image =
                safetensors_image(&model.state_dict(), Some(&metadata), reuse, Path::new(MODEL_FILE))?;
            self.model = Some(image);
        }
        Ok(self)
    }

    /// The optimizer's state (momentum, moments, step counts) and hyper-parameters.
    pub fn optimizer(mut self, opt: &dyn Optimizer) -> Result<Snapshot> {
        if self.writes_replicated {
            // The live buffers, copied once into the file's image (not first into a state_dict copy).
            let state = opt.state_dict_shared();
            let metadata = HashMap::from([(GROUPS_KEY.to_string(), state.param_groups_json())]);
            let tensors: Vec<_> = state.tensors.into_iter().collect();
            let reuse = self.staging.remove(OPTIMIZER_FILE);
            let image = safetensors_image(&tensors, Some(&metadata), reuse, Path::new(OPTIMIZER_FILE))?;
            self.optimizer = Some(image);
        }
        Ok(self)
    }

    pub fn scheduler(mut self, sched: &dyn LrScheduler) -> Snapshot {
        if self.writes_replicated {
            self.trainer.scheduler = Some(sched.state_dict());
        }
        self
    }

    pub fn grad_scaler(mut self, scaler: &GradScaler) -> Snapshot {
        if self.writes_replicated {
            self.trainer.grad_scaler = Some(scaler.state_dict());
        }
        self
    }

    /// The resolved config, as TOML, so a resumed run can check it continues the same run.
    pub fn config_toml(mut self, toml: impl Into<String>) -> Snapshot {
        if self.writes_replicated {
            self.config_toml = Some(toml.into());
        }
        self
    }

    /// Anything else the trainer wants back (best metric, tokens seen), as JSON.
    pub fn extra(mut self, extra: serde_json::Value) -> Snapshot {
        if self.writes_replicated {
            self.trainer.extra = extra;
        }
        self
    }

    /// This rank's position in its data (`DataLoader::state_dict()` or the sampler's).
    pub fn sampler(mut self, state: SamplerState) -> Snapshot {
        self.rank.sampler = Some(state);
        self
    }

    /// A generator of the trainer's own (the default one is always saved).
    pub fn generator(mut self, name: impl Into<String>, gen: &Generator) -> Snapshot {
        self.rank.generators.insert(name.into(), gen.state());
        self
    }

    /// The files of this rank's part; the images' memory comes back from [`take_staging`]
    /// once written.
    pub(crate) fn into_files(self) -> Vec<PartFile> {
        let mut files = Vec::new();
        if self.writes_replicated {
            if let Some(image) = self.model {
                files.push(PartFile { name: MODEL_FILE.into(), content: Content::Image(image) });
            }
            if let Some(image) = self.optimizer {
                files.push(PartFile { name: OPTIMIZER_FILE.into(), content: Content::Image(image) });
            }
            let trainer = serde_json::to_vec_pretty(&self.trainer).expect("trainer state serialises");
            files.push(PartFile { name: TRAINER_FILE.into(), content: Content::Bytes(trainer) });
            if let Some(toml) = self.config_toml {
                files.push(PartFile { name: CONFIG_FILE.into(), content: Content::Bytes(toml.into_bytes()) });
            }
        }
        let rank = serde_json::to_vec_pretty(&self.rank).expect("rank state serialises");
        files.push(PartFile { name: rank_file(self.rank.rank), content: Content::Bytes(rank) });
        files
    }
}

/// The images' memory out of written `files`, to reuse in the next snapshot.
pub(crate) fn take_staging(files: Vec<PartFile>) -> Staging {
    files
        .into_iter()
        .filter_map(|f| match f.content {
            Content::Image(image) => Some((f.name, image.into_buffer())),
            Content::Bytes(_) => None,
        })
        .collect()
}
