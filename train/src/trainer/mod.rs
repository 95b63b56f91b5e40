//! One training loop for every task and every strategy: autocast, the f16 loss scaler,
//! gradient accumulation (no all-reduce until the last micro-batch), clipping, the schedule,
//! evaluation at the interval, a stop (or skip) on a NaN or infinite loss, metrics, progress
//! and the final model folder.

mod checkpointing;
pub mod nonfinite;
pub mod optim;
mod run;
mod run_dir;
mod save;
mod window;

pub use crate::runtime::{autocast_dtype, make_strategy, placement, Strategy, TrainError};
pub use checkpointing::checkpoint_dir;
pub use save::{read_model_dir, write_model_dir};

use crate::config::Config;
use crate::runtime::Placement;
use crate::tasks::{self, Evaluation, Task};
use std::path::PathBuf;

/// What a finished run reached.
#[derive(Clone, Debug)]
pub struct Summary {
    pub steps: usize,
    pub epochs: usize,
    pub seconds: f64,
    /// Mean training loss of the last logged window.
    pub train_loss: f64,
    pub eval: Option<Evaluation>,
    /// Throughput of the whole run (units over every rank per second).
    pub throughput: f64,
    pub unit: &'static str,
    pub metrics: PathBuf,
    /// The folder with model.safetensors and config.toml, when one was written.
    pub model_dir: Option<PathBuf>,
    pub skipped_steps: usize,
    /// This process's rank (the summary is printed by rank 0).
    pub rank: usize,
    /// Set when SIGTERM or SIGINT stopped the run early: what was saved, and how to go on.
    pub interrupted: Option<String>,
    /// Optimizer steps this process ran: fewer than `steps` after a resume, 0 when the
    /// checkpoint resumed from was already the end of the run.
    pub steps_here: usize,
}

impl Summary {
    /// The last line of a run, for a person.
    pub fn line(&self) -> String {
        if let Some(why) = &self.interrupted {
            return format!("stopped after {} steps: {why}", self.steps);
        }
        let mut s = if self.steps_here == 0 {
            // Resumed from the run's last step: no time or loss of this process to report.
            format!(
                "done: the checkpoint resumed from is step {}, the end of this run ({} epochs); nothing \
                 left to train (raise train.epochs or train.steps to go on)",
                self.steps, self.epochs
            )
        } else {
            format!(
                "done: {} steps ({} epochs) in {:.1} s, {:.1} {}, train loss {:.4}",
                self.steps, self.epochs, self.seconds, self.throughput, self.unit, self.train_loss
            )
        };
        if let Some(e) = &self.eval {
            s += &format!(", eval loss {:.4}", e.loss);
            for (k, v) in &e.metrics {
                match k.as_str() {
                    "perplexity" => s += &format!(", perplexity {v:.2}"),
                    _ => s += &format!(", {k} {:.2}%", 100.0 * v),
                }
            }
        }
        if self.skipped_steps > 0 {
            s += &format!(", {} steps skipped (non-finite loss or gradient)", self.skipped_steps);
        }
        s += &format!("; metrics in {}", self.metrics.display());
        if let Some(d) = &self.model_dir {
            s += &format!(", model in {}", d.display());
        }
        s
    }
}

/// Trains what the config says and returns the summary.
pub fn train(config: &Config) -> Result<Summary, TrainError> {
    let place = placement(config)?;
    oxtrain_tensor::manual_seed(config.train.seed);
    tasks::with_task(config, place, Fit(place))
}

/// [`fit`] as the work [`tasks::with_task`] hands the config's task to.
struct Fit(Placement);

impl tasks::WithTask for Fit {
    type Output = Summary;
    fn run<T: Task>(self, task: T) -> Result<Summary, TrainError> {
        fit(task, self.0)
    }
}

/// How far the run goes: optimizer steps per epoch, epochs, total steps.
fn plan(config: &Config, batches_per_epoch: usize) -> Result<run::Plan, TrainError> {
    let accum = config.train.grad_accum;
    let per_epoch = batches_per_epoch / accum;
    if per_epoch == 0 {
        return Err(TrainError::AccumOverEpoch { batches_per_epoch, grad_accum: accum });
    }
    let total = match config.train.steps {
        0 => config.train.epochs * per_epoch,
        s => s,
    };
    Ok(run::Plan { per_epoch, epochs: total.div_ceil(per_epoch), total })
}

/// The loop. The task gives model, batches and metrics; the strategy gives the model wrapper,
/// `no_sync` and the sums over ranks; the loop knows neither the task nor the backend.
pub fn fit<T: Task>(task: T, place: Placement) -> Result<Summary, TrainError> {
    let plan = plan(task.config(), task.batches_per_epoch())?;
    let mut trainer = run::Trainer::new(&task, place, plan)?;
    let result = trainer.start().and_then(|()| trainer.run());
    if result.is_err() {
        // Whatever follows (the error) starts on its own line.
        trainer.progress.finish();
    }
    result
}
