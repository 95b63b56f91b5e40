//! A host copy of the training state at one step: what [`super::Checkpointer::save`] writes.
//! Taking it is the only part of a save the training step waits for.

use super::error::{CheckpointError, Result};
use super::image::{safetensors_image, AlignedBuf};
use super::write::{Content, PartFile};
use super::writer::Job;
use crossbeam_channel::Sender;
use oxtrain_datasets::SamplerState;
use oxtrain_ddp::ShardState;
use oxtrain_nn::amp::GradScaler;
use oxtrain_nn::lr_scheduler::LrScheduler;
use oxtrain_nn::optim::Optimizer;
use oxtrain_nn::Module;
use oxtrain_tensor::{default_generator_state, Generator, GeneratorState, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use super::layout::{rank_file, CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE};
/// The optimizer's param_groups JSON, in the safetensors metadata (as `OptimizerState::save`).
pub(crate) const GROUPS_KEY: &str = "param_groups";

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
    /// The writer, which starts on each file as soon as it is complete (none once saved).
    pub(crate) hand_over: Option<HandOver>,
    /// Complete files not handed over: those recalled from another Checkpointer's writer.
    pub(crate) held: Vec<PartFile>,
    pub(crate) config_toml: Option<String>,
    pub(crate) trainer: TrainerState,
    pub(crate) rank: RankState,
}

/// The memory of an earlier save's file images, by file name.
pub(crate) type Staging = HashMap<String, AlignedBuf>;

/// A snapshot's way to its writer thread.
pub(crate) struct HandOver {
    pub jobs: Sender<Job>,
    /// Set while the snapshot is neither saved nor dropped.
    pub open: Arc<AtomicBool>,
}

impl Snapshot {
    pub(crate) fn new(
        step: u64,
        epoch: u64,
        (rank, world_size): (usize, usize),
        staging: Staging,
        hand_over: HandOver,
    ) -> Snapshot {
        Snapshot {
            writes_replicated: rank == 0,
            staging,
            hand_over: Some(hand_over),
            held: Vec::new(),
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
            self.hand_over(PartFile { name: MODEL_FILE.into(), content: Content::Image(image) })?;
        }
        Ok(self)
    }

    /// The optimizer's state (momentum, moments, step counts) and hyper-parameters, written by
    /// rank 0 (every rank holds the same).
    pub fn optimizer(mut self, opt: &dyn Optimizer) -> Result<Snapshot> {
        if self.writes_replicated {
            // The live buffers, copied once into the file's image (not first into a state_dict copy).
            let state = opt.state_dict_shared();
            let metadata = HashMap::from([(GROUPS_KEY.to_string(), state.param_groups_json())]);
            let tensors: Vec<_> = state.tensors.into_iter().collect();
            self.optimizer_file(&tensors, metadata)?;
        }
        Ok(self)
    }

    /// A sharded optimizer's state (ZeRO-1): every rank writes its own part
    /// (`ShardState::to_safetensors`) into its part of the checkpoint.
    pub fn sharded_optimizer(mut self, part: &ShardState) -> Result<Snapshot> {
        let (tensors, metadata) = part.to_safetensors();
        self.optimizer_file(&tensors, metadata)?;
        Ok(self)
    }

    fn optimizer_file(
        &mut self,
        tensors: &[(String, Tensor)],
        metadata: HashMap<String, String>,
    ) -> Result<()> {
        let reuse = self.staging.remove(OPTIMIZER_FILE);
        let image = safetensors_image(tensors, Some(&metadata), reuse, Path::new(OPTIMIZER_FILE))?;
        self.hand_over(PartFile { name: OPTIMIZER_FILE.into(), content: Content::Image(image) })
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

    /// Hands a complete file to the writer thread, which starts writing it at once.
    fn hand_over(&mut self, file: PartFile) -> Result<()> {
        let step = self.step();
        let sent = self.hand_over.as_ref().map(|h| h.jobs.send(Job::File { step, file }));
        match sent {
            Some(Ok(())) => Ok(()),
            _ => Err(CheckpointError::WriterGone("it exited".into())),
        }
    }

    /// The files of this rank's part not handed over yet (the small ones, written when the
    /// snapshot is saved).
    pub(crate) fn take_files(&mut self) -> Vec<PartFile> {
        let mut files = std::mem::take(&mut self.held);
        if self.writes_replicated {
            let trainer = serde_json::to_vec_pretty(&self.trainer).expect("trainer state serialises");
            files.push(PartFile { name: TRAINER_FILE.into(), content: Content::Bytes(trainer) });
            if let Some(toml) = self.config_toml.take() {
                files.push(PartFile { name: CONFIG_FILE.into(), content: Content::Bytes(toml.into_bytes()) });
            }
        }
        let rank = serde_json::to_vec_pretty(&self.rank).expect("rank state serialises");
        files.push(PartFile { name: rank_file(self.rank.rank), content: Content::Bytes(rank) });
        files
    }

    /// Memory of the previous save that this one did not use (its model or optimizer left out).
    pub(crate) fn take_staging(&mut self) -> Staging {
        std::mem::take(&mut self.staging)
    }
}

impl Drop for Snapshot {
    /// A snapshot dropped unsaved (an error part-way through building it): the writer discards
    /// the files it was handed and keeps their memory for the next save.
    fn drop(&mut self) {
        if let Some(h) = self.hand_over.take() {
            h.open.store(false, Ordering::Release);
            let _ = h.jobs.send(Job::Abandon(std::mem::take(&mut self.staging)));
        }
    }
}
