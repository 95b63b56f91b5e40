//! Reading a checkpoint back and restoring it into the live objects of a run.

use super::discover::verify_checkpoint;
use super::error::{io, CheckpointError, Result};
use super::layout::part_name;
use super::manifest::{verify, Manifest};
use super::snapshot::{
    rank_file, RankState, TrainerState, CONFIG_FILE, GROUPS_KEY, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE,
};
use oxtrain_datasets::SamplerState;
use oxtrain_ddp::ShardState;
use oxtrain_nn::amp::GradScaler;
use oxtrain_nn::lr_scheduler::LrScheduler;
use oxtrain_nn::optim::{Optimizer, OptimizerState};
use oxtrain_nn::Module;
use oxtrain_tensor::{set_default_generator_state, GeneratorState, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A verified checkpoint, as seen by one rank: rank 0's replicated state and this rank's own.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    manifest: Manifest,
    trainer: TrainerState,
    rank: RankState,
    config_toml: Option<String>,
    /// Saved by another number of ranks than this run's.
    resharded: bool,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(io(path, "reading"))?;
    serde_json::from_str(&text).map_err(|e| CheckpointError::Restore {
        path: path.to_path_buf(),
        what: "its JSON",
        message: e.to_string(),
    })
}

impl Checkpoint {
    /// Opens step directory `path` for `rank` of `world_size`, after checking every file of
    /// every rank's part against its manifest. The checkpoint may come from another number of
    /// ranks ([`Checkpoint::resharded`]): a rank the saving run did not have reads rank 0's part
    /// (its data position, which the sampler re-deals; its generators are not restored).
    pub fn load(path: impl AsRef<Path>, rank: usize, world_size: usize) -> Result<Checkpoint> {
        let path = path.as_ref().to_path_buf();
        let manifest = verify_checkpoint(&path)?
            .map_err(|problem| CheckpointError::Invalid { path: path.clone(), problem })?;
        let trainer: TrainerState = read_json(&path.join(TRAINER_FILE))?;
        let part_rank = if rank < manifest.world_size { rank } else { 0 };
        let own = path.parent().unwrap_or(Path::new(".")).join(part_name(manifest.step, part_rank));
        if part_rank != 0 {
            // verify_checkpoint checked it; this is the same check, kept for a clear error if
            // the part changed since.
            verify(&own)?.map_err(|problem| CheckpointError::Invalid { path: own.clone(), problem })?;
        }
        let rank = part_rank;
        let resharded = manifest.world_size != world_size;
        let rank_state: RankState = read_json(&own.join(rank_file(rank)))?;
        let config = path.join(CONFIG_FILE);
        let config_toml = match std::fs::read_to_string(&config) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&config, "reading")(e)),
        };
        Ok(Checkpoint { path, manifest, trainer, rank: rank_state, config_toml, resharded })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the saving run had another number of ranks than this one (the state is then
    /// re-partitioned: ZeRO-1 shards, the data position; the per-rank generators are not kept).
    pub fn resharded(&self) -> bool {
        self.resharded
    }

    /// Every rank's optimizer part of a ZeRO-1 save, in rank order, whatever this run's world
    /// size (`ZeroOptimizer::load_shard_states` re-partitions them).
    pub fn zero_parts(&self) -> Result<Vec<ShardState>> {
        (0..self.manifest.world_size)
            .map(|r| {
                let dir = match r {
                    0 => self.path.clone(),
                    r => self.path.parent().unwrap_or(Path::new(".")).join(part_name(self.manifest.step, r)),
                };
                let file = dir.join(OPTIMIZER_FILE);
                let restore_err = |message: String| CheckpointError::Restore {
                    path: file.clone(),
                    what: "the sharded optimizer state",
                    message,
                };
                let st = oxtrain_tensor::safetensors::load(&file).map_err(|e| restore_err(e.to_string()))?;
                if !ShardState::is_shard(st.metadata()) {
                    return Err(restore_err(
                        "it was saved without ddp.shard_optimizer: resume with ddp.shard_optimizer = false"
                            .into(),
                    ));
                }
                ShardState::from_safetensors(&st, &file).map_err(|e| restore_err(e.to_string()))
            })
            .collect()
    }

    /// The optimizer steps taken when it was saved.
    pub fn step(&self) -> u64 {
        self.trainer.step
    }

    pub fn epoch(&self) -> u64 {
        self.trainer.epoch
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn config_toml(&self) -> Option<&str> {
        self.config_toml.as_deref()
    }

    pub fn extra(&self) -> &serde_json::Value {
        &self.trainer.extra
    }

    /// This rank's data position, to pass to `DataLoader::load_state_dict`.
    pub fn sampler(&self) -> Option<&SamplerState> {
        self.rank.sampler.as_ref()
    }

    /// A generator the trainer saved with `Snapshot::generator`.
    pub fn generator(&self, name: &str) -> Option<GeneratorState> {
        self.rank.generators.get(name).copied()
    }

    /// The model file's tensors by name, on the CPU.
    pub fn model_state(&self) -> Result<HashMap<String, Tensor>> {
        Ok(oxtrain_tensor::safetensors::load_all(self.path.join(MODEL_FILE))?.into_iter().collect())
    }

    /// Loads every parameter and buffer into `model` (strict: every name must match).
    pub fn restore_model(&self, model: &dyn Module) -> Result<()> {
        let state = self.model_state()?;
        model.load_state_dict(&state, true).map_err(|e| CheckpointError::Restore {
            path: self.path.join(MODEL_FILE),
            what: "the model",
            message: e.to_string(),
        })?;
        Ok(())
    }

    /// Restores the optimizer's state and hyper-parameters (saved unsharded).
    pub fn restore_optimizer(&self, opt: &mut dyn Optimizer) -> Result<()> {
        // Rank 0's replicated file is everyone's (ZeRO-1's shards: `zero_parts`).
        let path = self.path.join(OPTIMIZER_FILE);
        let restore_err =
            |message: String| CheckpointError::Restore { path: path.clone(), what: "the optimizer", message };
        if !path.exists() {
            return Err(restore_err("this checkpoint was saved without an optimizer".into()));
        }
        let file = oxtrain_tensor::safetensors::load(&path)?;
        if ShardState::is_shard(file.metadata()) {
            return Err(restore_err(
                "it holds one rank's shard, saved with ddp.shard_optimizer = true: resume with it on \
                 (on any number of ranks)"
                    .into(),
            ));
        }
        let groups = file
            .metadata()
            .get(GROUPS_KEY)
            .ok_or_else(|| restore_err(format!("no `{GROUPS_KEY}` metadata")))?;
        let param_groups = OptimizerState::parse_param_groups(groups)?;
        let mut tensors = BTreeMap::new();
        for name in file.names() {
            tensors.insert(name.clone(), file.get(name)?);
        }
        opt.load_state_dict(&OptimizerState { tensors, param_groups }).map_err(|e| restore_err(e.to_string()))
    }

    pub fn restore_scheduler(&self, sched: &mut dyn LrScheduler) -> Result<()> {
        let path = self.path.join(TRAINER_FILE);
        let state = self.trainer.scheduler.as_ref().ok_or_else(|| CheckpointError::Restore {
            path: path.clone(),
            what: "the LR schedule",
            message: "this checkpoint was saved without one".into(),
        })?;
        sched.load_state_dict(state).map_err(|e| CheckpointError::Restore {
            path,
            what: "the LR schedule",
            message: e.to_string(),
        })
    }

    pub fn restore_grad_scaler(&self, scaler: &mut GradScaler) -> Result<()> {
        let state = self.trainer.grad_scaler.as_ref().ok_or_else(|| CheckpointError::Restore {
            path: self.path.join(TRAINER_FILE),
            what: "the grad scaler",
            message: "this checkpoint was saved without one".into(),
        })?;
        scaler.load_state_dict(state);
        Ok(())
    }

    /// Sets the process-wide generator (dropout, `Tensor::rand`) to where it was at the save.
    pub fn restore_rng(&self) {
        set_default_generator_state(self.rank.default_generator);
    }
}
