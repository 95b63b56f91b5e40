//! The loop's checkpoints: the one `checkpoint.resume` names, found and restored into the
//! live run (model, optimizer, schedule, grad scaler, every RNG, the data position, the
//! loop's counters); saves on the config's triggers (every N steps, every M minutes, at the
//! end, on SIGTERM/SIGINT) through the background writer, with every rank agreeing on when.
//!
//! Two test hooks, read from the environment and active only on a first start (not after an
//! elastic restart, `TORCHELASTIC_RESTART_COUNT` > 0), let process-level tests kill a run at a
//! point they choose:
//! - `OXTRAIN_TEST_HALT_AFTER_STEP=K[:RANK]`: after step K (its save, if any, committed) the
//!   loop of RANK (default: every rank) prints a line naming its pid and waits, until SIGTERM
//!   or SIGINT (then the next step saves and the run stops) or SIGKILL;
//! - `OXTRAIN_TEST_PAUSE_CHECKPOINT=STEP:FRACTION`: the writer of step STEP's checkpoint
//!   stops for ever once FRACTION of its bytes are written (at the latest just before the
//!   manifest), after printing a line naming its pid.

use super::{Strategy, TrainError};
use crate::checkpoint::manifest::MANIFEST;
use crate::checkpoint::{
    latest_valid, Checkpoint, CheckpointConfig as WriterConfig, CheckpointError, Checkpointer, Problem,
    ProgressFn, SavePolicy, SaveReason, SaveTriggers, WriteProgress,
};
use crate::config::{Config, OnSaveError};
use crate::runtime::{as_zero, as_zero_mut};
use crate::tasks::Task;
use oxtrain_datasets::SamplerState;
use oxtrain_nn::amp::GradScaler;
use oxtrain_nn::lr_scheduler::LrScheduler;
use oxtrain_nn::optim::Optimizer;
use oxtrain_nn::Module;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The run's checkpoint folder: `checkpoint.dir`, or `<log.dir>/checkpoints`.
pub fn checkpoint_dir(config: &Config) -> PathBuf {
    match config.checkpoint.dir.as_str() {
        "" => PathBuf::from(&config.log.dir).join(crate::checkpoint::layout::CHECKPOINTS_DIR),
        d => PathBuf::from(d),
    }
}

/// The loop's own counters, in the checkpoint's extra JSON, so that the logged loss windows
/// and the summary continue as if the run had never stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Counters {
    pub skipped: usize,
    pub window_loss: f64,
    pub window_steps: usize,
    pub window_units: usize,
    pub run_units: usize,
}

/// Where a resumed run goes on.
pub(crate) struct Start {
    pub step: usize,
    pub epoch: usize,
    /// Batches left in `epoch` (0: it was used up at the save; the loop starts the next).
    pub epoch_left: usize,
    pub counters: Counters,
    /// Saved on another number of ranks: this run's epochs have another length.
    pub resharded: bool,
}

/// Everything of the live run a checkpoint holds.
pub(crate) struct RunState<'a> {
    pub step: usize,
    pub epoch: usize,
    pub model: &'a dyn Module,
    /// Under ZeRO-1 each rank's holds its own shard, saved in its own part.
    pub optimizer: &'a dyn Optimizer,
    pub schedule: &'a dyn LrScheduler,
    pub scaler: &'a GradScaler,
    pub data: SamplerState,
    pub config: &'a Config,
    pub counters: Counters,
}

/// Whether this process was started again by an elastic launcher (the test hooks are off then).
fn restarted() -> bool {
    std::env::var("TORCHELASTIC_RESTART_COUNT").is_ok_and(|c| c.trim() != "0")
}

/// The step directory `checkpoint.resume` names, if any; prints (on rank 0) which one and
/// why newer ones were skipped.
fn find(config: &Config, rank: usize, say: &dyn Fn(&str)) -> Result<Option<PathBuf>, TrainError> {
    let resume = config.checkpoint.resume.as_str();
    if resume.is_empty() {
        return Ok(None);
    }
    let latest = resume == "latest";
    let folder = if latest { checkpoint_dir(config) } else { PathBuf::from(resume) };
    if !latest && folder.join(MANIFEST).is_file() {
        say(&format!("resuming from {} (checkpoint.resume)", folder.display()));
        return Ok(Some(folder));
    }
    if !latest && !folder.is_dir() {
        return Err(CheckpointError::NotFound {
            dir: folder,
            why: " (checkpoint.resume names no such folder)".into(),
            hint: "use \"latest\", a step directory, or a run's checkpoints folder".into(),
        }
        .into());
    }
    let found = latest_valid(&folder)?;
    if rank == 0 {
        for s in &found.skipped {
            say(&format!("skipped checkpoint {}: {}", s.path.display(), s.problem));
        }
    }
    if let Some(p) = found.path() {
        if rank == 0 {
            let (_, m) = found.chosen.as_ref().expect("a path comes with its manifest");
            // Epochs are counted from 1 wherever a person reads them; the manifest keeps the index.
            say(&format!("resuming from {} (step {}, epoch {})", p.display(), m.step, m.epoch + 1));
        }
        return Ok(Some(p.to_path_buf()));
    }
    // Only unfinished writes (or nothing at all): no saved state is lost by starting afresh,
    // which is what an elastic restart before the first checkpoint needs.
    if latest && found.skipped.iter().all(|s| s.problem == Problem::Partial) {
        say(&format!("no complete checkpoint in {} yet; starting from step 0", folder.display()));
        return Ok(None);
    }
    let why =
        found.skipped.iter().map(|s| format!("; skipped {}: {}", s.path.display(), s.problem)).collect();
    let hint = "start without --resume, or point it at a checkpoint directory".into();
    Err(CheckpointError::NotFound { dir: folder, why, hint }.into())
}

/// The `section.key`s whose values differ between a checkpoint's config and this run's,
/// leaving out those that may change between the two starts of one run.
fn config_differences(saved: &str, now: &Config) -> Vec<String> {
    let (Ok(saved), Ok(now)) = (toml::from_str::<toml::Table>(saved), toml::Table::try_from(now)) else {
        return vec!["(the saved config.toml does not parse)".into()];
    };
    let mut keys = Vec::new();
    for (section, values) in &now {
        let (Some(values), old) = (values.as_table(), saved.get(section).and_then(|v| v.as_table())) else {
            continue;
        };
        for (key, value) in values {
            let name = format!("{section}.{key}");
            let ignored = ["checkpoint.resume", "log.progress", "log.overwrite"].contains(&name.as_str());
            if !ignored && old.and_then(|o| o.get(key)) != Some(value) {
                keys.push(name);
            }
        }
    }
    keys
}

/// Finds and restores the checkpoint `checkpoint.resume` names, if any. Call it last before
/// the loop: it sets the process-wide generator, which building the model has drawn from.
pub(crate) fn resume<T: Task>(
    config: &Config,
    task: &T,
    strategy: &Strategy<T::Model>,
    optimizer: &mut dyn Optimizer,
    schedule: &mut dyn LrScheduler,
    scaler: &mut GradScaler,
    say: &dyn Fn(&str),
) -> Result<Option<Start>, TrainError> {
    let (rank, world) = (strategy.rank(), strategy.world_size());
    let path = find(config, rank, say)?;
    if world > 1 {
        // Every rank looked on its own; they must have picked the same step (or none).
        let mine = path.as_ref().map_or(-1.0, |p| step_of(p).map_or(-2.0, |s| s as f64));
        let sum = strategy.sum(&[mine]).map_err(|e| TrainError::comm("", e))?[0];
        if sum != mine * world as f64 {
            return Err(TrainError::CheckpointsDiffer { rank, found: path });
        }
    }
    let Some(path) = path else { return Ok(None) };
    let c = Checkpoint::load(&path, rank, world)?;
    if let Some(saved) = c.config_toml() {
        let diff = config_differences(saved, config);
        if rank == 0 && !diff.is_empty() {
            say(&format!(
                "note: this run's config differs from the checkpoint's in {}; going on with this run's values",
                diff.join(", ")
            ));
        }
    }
    if c.resharded() && rank == 0 {
        say(&format!(
            "resuming {} ranks' checkpoint on {world}: the data position and any ZeRO-1 shards are re-partitioned",
            c.manifest().world_size
        ));
    }
    c.restore_model(strategy.module())?;
    match as_zero_mut(optimizer) {
        Some(zero) => zero.load_shard_states(&c.zero_parts()?).map_err(CheckpointError::from)?,
        None => c.restore_optimizer(optimizer)?,
    }
    c.restore_scheduler(schedule)?;
    c.restore_grad_scaler(scaler)?;
    let data = c.sampler().ok_or_else(|| CheckpointError::Restore {
        path: path.clone(),
        what: "the data position",
        message: "this checkpoint was saved without one".into(),
    })?;
    let epoch_left = task.restore_data_state(data)?;
    let counters = serde_json::from_value(c.extra().clone()).unwrap_or_default();
    c.restore_rng();
    let resharded = c.resharded();
    Ok(Some(Start { step: c.step() as usize, epoch: c.epoch() as usize, epoch_left, counters, resharded }))
}

fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("step-")?.parse().ok()
}

/// The save side: the background writer, the triggers, and the test hooks.
pub(crate) struct Saver {
    writer: Checkpointer,
    on_error: OnSaveError,
    policy: SavePolicy,
    last_saved: Option<usize>,
    rank: usize,
    halt_after: Option<(usize, Option<usize>)>,
}

impl Saver {
    /// Starts the writer (it clears this rank's unfinished writes: call after [`resume`]).
    pub fn new(config: &Config, rank: usize, world_size: usize) -> Result<Saver, TrainError> {
        let c = &config.checkpoint;
        let writer = Checkpointer::new(WriterConfig {
            dir: checkpoint_dir(config),
            keep_last: Some(c.keep_last),
            keep_every: (c.keep_every > 0).then_some(c.keep_every as u64),
            rank,
            world_size,
            on_progress: pause_hook(rank),
        })?;
        let policy = SavePolicy::new(SaveTriggers {
            every_steps: (c.every_steps > 0).then_some(c.every_steps as u64),
            every: (c.every_minutes > 0.0).then(|| Duration::from_secs_f64(c.every_minutes * 60.0)),
            at_end: c.at_end,
            on_signal: true,
        })?;
        let halt_after =
            std::env::var("OXTRAIN_TEST_HALT_AFTER_STEP").ok().filter(|_| !restarted()).map(|v| {
                let (step, rank) = v.split_once(':').map_or((v.as_str(), None), |(s, r)| (s, Some(r)));
                (step.trim().parse().unwrap_or(usize::MAX), rank.and_then(|r| r.trim().parse().ok()))
            });
        Ok(Saver { writer, on_error: c.on_save_error, last_saved: None, policy, rank, halt_after })
    }

    /// After each optimizer step: whether to save now, and why, the same on every rank (a
    /// signal or a timer on one rank is a save on all, or their parts would be of other steps).
    pub fn due<M: Module>(
        &mut self,
        step: usize,
        strategy: &Strategy<M>,
    ) -> Result<Option<SaveReason>, TrainError> {
        let local = self.policy.due(step as u64);
        if strategy.world_size() == 1 {
            return Ok(local);
        }
        let flag = |r: SaveReason| if local == Some(r) { 1.0 } else { 0.0 };
        let votes = strategy
            .sum(&[flag(SaveReason::Signal), flag(SaveReason::Time)])
            .map_err(|e| TrainError::comm("", e))?;
        Ok(if votes[0] > 0.0 {
            Some(SaveReason::Signal)
        } else if local == Some(SaveReason::Steps) {
            local
        } else if votes[1] > 0.0 {
            Some(SaveReason::Time)
        } else {
            None
        })
    }

    /// Copies the state to host memory and hands it to the writer thread.
    pub fn save(&mut self, s: RunState<'_>) -> Result<(), TrainError> {
        let extra = serde_json::to_value(&s.counters).expect("counters are JSON");
        // Taking a snapshot waits for the previous write and reports its failure; handing
        // this one over may too.
        let writer = &mut self.writer;
        let saved = (|| {
            let snap = writer.snapshot(s.step as u64, s.epoch as u64)?.model(s.model)?;
            let snap = match as_zero(s.optimizer) {
                Some(zero) => snap.sharded_optimizer(&zero.shard_state()?)?,
                None => snap.optimizer(s.optimizer)?,
            };
            let snap = snap
                .scheduler(s.schedule)
                .grad_scaler(s.scaler)
                .config_toml(s.config.to_toml())
                .extra(extra)
                .sampler(s.data);
            writer.save(snap)
        })();
        self.tolerate(saved)?;
        self.last_saved = Some(s.step);
        Ok(())
    }

    /// A write error under `checkpoint.on_save_error`: the run's error with "stop"; with
    /// "continue" a warning (the last complete checkpoint is still there) and `None`.
    fn tolerate<T>(&self, r: Result<T, CheckpointError>) -> Result<Option<T>, TrainError> {
        match (r, self.on_error) {
            (Ok(v), _) => Ok(Some(v)),
            (Err(e), OnSaveError::Continue) => {
                eprintln!(
                    "warning (rank {}): a checkpoint was not saved: {e}; training goes on \
                     (checkpoint.on_save_error = \"continue\")",
                    self.rank
                );
                Ok(None)
            }
            (Err(e), OnSaveError::Stop) => Err(e.into()),
        }
    }

    /// The end of the run: saves unless this very step was just saved (or `at_end` is off).
    pub fn save_at_end(&mut self, s: RunState<'_>) -> Result<(), TrainError> {
        if self.policy.at_end() && self.last_saved != Some(s.step) {
            self.save(s)?;
        }
        Ok(())
    }

    /// Waits for the save in flight; returns the directory of this rank's last committed part.
    pub fn wait(&mut self) -> Result<Option<PathBuf>, TrainError> {
        let waited = self.writer.wait().map(|s| s.map(|s| s.path.clone()));
        Ok(self.tolerate(waited)?.flatten())
    }

    /// The test hook `OXTRAIN_TEST_HALT_AFTER_STEP`: call after each step's save.
    pub fn test_halt(&mut self, step: usize) -> Result<(), TrainError> {
        let Some((at, rank)) = self.halt_after else { return Ok(()) };
        if step != at || rank.is_some_and(|r| r != self.rank) {
            return Ok(());
        }
        self.wait()?;
        // One write of the whole line: eprintln! writes its pieces one by one to the
        // unbuffered stderr, and two ranks sharing a pipe interleaved them mid-line.
        let line = format!(
            "oxtrain: test hook: rank {} (pid {}) halted after step {step}\n",
            self.rank,
            std::process::id()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        while !self.policy.stop_requested() {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// The test hook `OXTRAIN_TEST_PAUSE_CHECKPOINT=STEP:FRACTION`, as the writer's progress call.
fn pause_hook(rank: usize) -> Option<ProgressFn> {
    let value = std::env::var("OXTRAIN_TEST_PAUSE_CHECKPOINT").ok().filter(|_| !restarted())?;
    let (step, fraction) = value.split_once(':')?;
    let (step, fraction): (u64, f64) = (step.trim().parse().ok()?, fraction.trim().parse().ok()?);
    let fired = AtomicBool::new(false);
    Some(Arc::new(move |p: &WriteProgress| {
        let reached = p.file == MANIFEST || p.written as f64 >= fraction * p.total as f64;
        if p.step == step && reached && !fired.swap(true, Ordering::SeqCst) {
            eprintln!(
                "oxtrain: test hook: rank {rank} (pid {}) paused writing the checkpoint of step {step} in {} after \
                 {} of about {} bytes",
                std::process::id(),
                p.file,
                p.written,
                p.total
            );
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }))
}
