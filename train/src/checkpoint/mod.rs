//! Checkpoints: everything needed to continue a run bit for bit, written atomically in the
//! background, found again after a crash, exported for PyTorch.
//!
//! # The API a training loop calls
//!
//! ```no_run
//! # use oxtrain::checkpoint::*;
//! # fn demo<D: oxtrain_datasets::Dataset>(model: &dyn oxtrain_nn::Module, opt: &mut dyn oxtrain_nn::optim::Optimizer,
//! #         loader: &oxtrain_datasets::DataLoader<D>,
//! #         total_steps: u64) -> Result<()> {
//! // Resume: the newest checkpoint whose checksums hold; the report names each skipped one.
//! // Look before starting a writer: a new writer clears this rank's unfinished writes.
//! let found = latest_valid("runs/r1/checkpoints")?;
//! eprintln!("{found}");
//! let mut step = 0;
//! if let Some(path) = found.path() {
//!     let c = Checkpoint::load(path, 0, 1)?;               // rank 0 of 1: checks the world size
//!     c.restore_model(model)?;
//!     c.restore_optimizer(opt)?;
//!     c.restore_rng();
//!     if let Some(s) = c.sampler() { loader.load_state_dict(s).map_err(|e| CheckpointError::Restore {
//!         path: path.into(), what: "the data loader", message: e.to_string() })?; }
//!     step = c.step();
//! }
//! let mut ckpt = Checkpointer::new(CheckpointConfig {
//!     keep_last: Some(3),
//!     keep_every: Some(10_000),
//!     ..CheckpointConfig::new("runs/r1/checkpoints")   // rank 0 of 1; set rank/world_size under DDP
//! })?;
//! let mut policy = SavePolicy::new(SaveTriggers { every_steps: Some(1000), ..Default::default() })?;
//! while step < total_steps {
//!     // ... one optimizer step ...
//!     step += 1;
//!     if let Some(why) = policy.due(step) {
//!         // The step waits only for this copy to host memory; writing happens on a thread.
//!         let snap = ckpt.snapshot(step, 0)?.model(model)?.optimizer(opt)?.sampler(loader.state_dict());
//!         ckpt.save(snap)?;                    // returns the previous save's error, if any
//!         if why == SaveReason::Signal {
//!             ckpt.finish()?;                  // preempted: the save is on disk; exit 0
//!             return Ok(());
//!         }
//!     }
//! }
//! if policy.at_end() {
//!     let snap = ckpt.snapshot(step, 0)?.model(model)?.optimizer(opt)?.sampler(loader.state_dict());
//!     ckpt.save(snap)?;
//! }
//! ckpt.finish()?;                              // waits for the last write; returns its error
//! # Ok(()) }
//! ```
//!
//! # What a checkpoint is
//!
//! ```text
//! <run>/checkpoints/step-000100/          rank 0's part, committed by one rename
//!     model.safetensors                   the model's state_dict, PyTorch's names (plain, loadable as is)
//!     optimizer.safetensors               state.<i>.<buffer> tensors; param_groups JSON in its metadata
//!     trainer.json                        step, epoch, LR schedule, grad scaler, the trainer's extra JSON
//!     config.toml                         the resolved config
//!     rank-0.json                         this rank's RNG (default generator, named ones) and sampler position
//!     manifest.json                       format, version, step, world size, every file's size and xxh3
//! <run>/checkpoints/step-000100.rank-1/   rank 1's own part under DDP: rank-1.json + manifest.json
//! ```
//!
//! Each part is written into a hidden temporary directory beside it, every file fsynced, the
//! manifest last, then renamed into place and the parent fsynced. A checkpoint is used only if
//! the manifest of every rank's part checks out (sizes and checksums). The loader's
//! augmentation draws come from streams keyed by (seed, epoch, index), so the sampler's
//! position is their whole state; dropout and init draw from the default generator.

mod discover;
mod durable;
mod error;
mod export;
mod image;
pub mod layout;
mod load;
pub mod manifest;
mod model_folder;
mod retention;
mod session;
mod snapshot;
mod triggers;
mod write;
mod writer;

pub use discover::{latest_valid, verify_checkpoint, Discovery, Skipped};
pub use error::{CheckpointError, Result};
pub use export::{export, Exported};
pub use layout::{
    part_name, rank_file, step_dir_name, CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE,
};
pub use load::Checkpoint;
pub use manifest::{Manifest, Problem};
pub use model_folder::write_model_folder;
pub use retention::to_remove;
pub use snapshot::Snapshot;
pub use triggers::{SavePolicy, SaveReason, SaveTriggers};
pub use write::{ProgressFn, WriteProgress};
pub use writer::{CheckpointConfig, Checkpointer, Saved};
