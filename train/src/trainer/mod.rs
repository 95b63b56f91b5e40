//! One training loop for every task and every strategy: autocast, the f16 loss scaler,
//! gradient accumulation (no all-reduce until the last micro-batch), clipping, the schedule,
//! evaluation at the interval, a stop (or skip) on a NaN or infinite loss, metrics, progress
//! and the final model folder.

mod checkpointing;
pub mod nonfinite;
pub mod optim;
mod run_dir;
mod save;
mod window;

pub use crate::runtime::{autocast_dtype, make_strategy, placement, Strategy, TrainError};
pub use checkpointing::checkpoint_dir;
pub use save::{read_model_dir, write_model_dir};

use crate::checkpoint::SaveReason;
use crate::config::{Config, PrecisionDtype};
use crate::metrics::{unix_time, EvalRecord, MetricsLog, Progress, StepRecord};
use crate::runtime::Placement;
use crate::tasks::{self, Evaluation, Task};
use oxtrain_autograd::autocast;
use oxtrain_nn::amp::{GradScaler, GradScalerConfig};
use oxtrain_nn::optim::clip_grad_norm_;
use oxtrain_nn::Module;
use std::path::PathBuf;
use std::time::Instant;

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
fn plan(config: &Config, batches_per_epoch: usize) -> Result<(usize, usize, usize), TrainError> {
    let accum = config.train.grad_accum;
    let per_epoch = batches_per_epoch / accum;
    if per_epoch == 0 {
        return Err(TrainError::Data(format!(
            "an epoch has {batches_per_epoch} batches on this rank, fewer than train.grad_accum = {accum}: lower \
             train.grad_accum or data.batch_size"
        )));
    }
    let total = match config.train.steps {
        0 => config.train.epochs * per_epoch,
        s => s,
    };
    Ok((per_epoch, total.div_ceil(per_epoch), total))
}

/// The loop. The task gives model, batches and metrics; the strategy gives the model wrapper,
/// `no_sync` and the sums over ranks; the loop knows neither the task nor the backend.
pub fn fit<T: Task>(task: T, place: Placement) -> Result<Summary, TrainError> {
    let config = task.config();
    let strategy = make_strategy(task.build_model()?, config, place)?;
    let (rank, world) = (strategy.rank(), strategy.world_size());
    let (per_epoch, epochs, total) = plan(config, task.batches_per_epoch())?;
    let lr = optim::base_lr(config, world);
    let mut opt = optim::build_optimizer(config, strategy.module(), lr);
    let mut schedule = optim::build_schedule(config, opt.as_mut(), total, per_epoch);
    let amp = autocast_dtype(config);
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: config.precision.init_scale,
        growth_interval: config.precision.growth_interval,
        enabled: config.precision.dtype == PrecisionDtype::F16,
        ..Default::default()
    });
    let params = strategy.module().parameters();
    let named_params = strategy.module().named_parameters();
    let mut guard = nonfinite::NonFiniteGuard::new(config, world, scaler.is_enabled());
    let run_dir = PathBuf::from(&config.log.dir);
    let progress = Progress::new(config.log.progress, rank, total, epochs);
    let say = |line: &str| progress.println(line);
    run_dir::claim(config, rank)?;
    // Last before the loop: restoring sets the generator that building the model drew from.
    let start =
        checkpointing::resume(config, &task, &strategy, opt.as_mut(), schedule.as_mut(), &mut scaler, &say)?;
    // Every rank has looked before any writer clears its unfinished writes.
    strategy.barrier().map_err(TrainError::Comm)?;
    let mut saver = checkpointing::Saver::new(config, rank, world)?;
    let mut log = match &start {
        Some(s) => MetricsLog::resume(&run_dir, rank == 0, config.log.plots, s.step)?,
        None => MetricsLog::create(&run_dir, rank == 0, config.log.plots)?,
    };
    progress.println(&format!(
        "oxtrain train: {}; {} on {:?}, {}; {} steps of {} x {} x {} samples",
        task.describe(),
        strategy.describe(),
        place.device,
        crate::config::enum_name(&config.precision.dtype),
        total,
        config.data.batch_size,
        world,
        config.train.grad_accum
    ));
    if let Some(w) = optim::warmup_warning(config, total, per_epoch).filter(|_| rank == 0) {
        progress.warn(&w);
    }

    let accum = config.train.grad_accum;
    let counters = start.as_ref().map(|s| s.counters.clone()).unwrap_or_default();
    let mut step = start.as_ref().map_or(0, |s| s.step);
    guard.skipped = counters.skipped;
    let mut window = window::LossWindow::new(counters.window_loss, counters.window_steps);
    let mut window_units = counters.window_units;
    let (mut run_units, mut last_eval) = (counters.run_units, None);
    // Throughput counts what this process trained: the restored counters hold units trained
    // before the stop, in time this process did not measure.
    let (start_step, start_units, mut timed_units) = (step, run_units, 0usize);
    let first_epoch = start.as_ref().map_or(0, |s| s.epoch);
    // A save at the very end of an epoch resumes with the next one.
    let mut skip_first_epoch = start.as_ref().is_some_and(|s| s.epoch_left == 0);
    let (mut interrupted, mut last_epoch) = (None, first_epoch);
    let mut window_start = Instant::now();
    let mut train_loss = f64::NAN;
    let run_start = Instant::now();
    let evaluate =
        |log: &mut MetricsLog, step: usize, epoch: usize| -> Result<Option<Evaluation>, TrainError> {
            let Some(e) = task.evaluate(&strategy)? else { return Ok(None) };
            let mut line = format!("eval at step {step}: loss {:.4}", e.loss);
            for (k, v) in &e.metrics {
                line += &format!(", {k} {v:.4}");
            }
            progress.println(&line);
            log.log_eval(EvalRecord {
                step,
                epoch,
                loss: e.loss,
                metrics: e.metrics.clone(),
                wall_time: unix_time(),
                elapsed: log.elapsed(),
            })?;
            Ok(Some(e))
        };
    // What a save writes at the current step of `$epoch`: a macro, as it borrows the loop's
    // locals where a function would take a dozen arguments.
    macro_rules! run_state {
        ($epoch:expr) => {
            checkpointing::RunState {
                step,
                epoch: $epoch,
                model: strategy.module(),
                optimizer: opt.as_ref(),
                schedule: schedule.as_ref(),
                scaler: &scaler,
                data: task.data_state(),
                config,
                counters: checkpointing::Counters {
                    skipped: guard.skipped,
                    window_loss: window.loss,
                    window_steps: window.steps,
                    window_units,
                    run_units,
                },
            }
        };
    }
    let epoch_range = if step >= total {
        progress.println(&format!(
            "the checkpoint of step {step} is the end of this run ({total} steps): evaluating and writing \
             the final model only"
        ));
        0..0
    } else {
        first_epoch..epochs
    };
    'epochs: for epoch in epoch_range {
        progress.start_epoch(epoch);
        last_epoch = epoch;
        let mut micro = 0usize;
        let batches: Box<dyn Iterator<Item = tasks::TaskResult<T::Batch>> + '_> =
            if std::mem::take(&mut skip_first_epoch) {
                Box::new(std::iter::empty())
            } else {
                task.batches(epoch as u64)
            };
        for batch in batches {
            let batch = batch?;
            micro += 1;
            let last = micro == accum;
            let loss = strategy.forward(|m| match amp {
                Some(dt) => autocast(dt, || task.loss(m, &batch)),
                None => task.loss(m, &batch),
            });
            window.add_micro(loss.tensor(), accum);
            // "skip" decides before the update: a host read per micro-batch, its documented cost.
            let verdict = match guard.checks_every_step() {
                true => guard.loss(loss.tensor().item(), step + 1, epoch + 1, &named_params),
                false => nonfinite::Verdict::Go,
            };
            match verdict {
                nonfinite::Verdict::Go => {}
                nonfinite::Verdict::Skip(message) => {
                    progress.println(&message);
                    opt.zero_grad();
                    window.discard_step();
                    micro = 0;
                    continue;
                }
                nonfinite::Verdict::Stop(e) => {
                    progress.finish();
                    return Err(e);
                }
            }
            let scaled = scaler.scale(&loss.mul_scalar(1.0 / accum as f64));
            // Under DDP the end of backward waits for the gradient all-reduces: a peer that
            // failed or a host cut off is the communicator's error here (its timeout, naming
            // the missing ranks), which ends the run with that message instead of a panic.
            let backward =
                if last { scaled.try_backward() } else { strategy.no_sync(|| scaled.try_backward()) };
            if let Err(e) = backward {
                progress.finish();
                return Err(TrainError::Comm(format!(
                    "DDP backward of step {} (epoch {}): {e}",
                    step + 1,
                    epoch + 1
                )));
            }
            let units = task.units(&batch);
            window_units += units;
            run_units += units;
            timed_units += units;
            if !last {
                continue;
            }
            micro = 0;
            let verdict = match guard.checks_every_step() {
                true => guard.gradients(step + 1, epoch + 1, &named_params),
                false => nonfinite::Verdict::Go,
            };
            match verdict {
                nonfinite::Verdict::Go => {}
                nonfinite::Verdict::Skip(message) => {
                    progress.println(&message);
                    opt.zero_grad();
                    window.discard_step();
                    continue;
                }
                nonfinite::Verdict::Stop(e) => {
                    progress.finish();
                    return Err(e);
                }
            }
            if config.train.clip_grad_norm > 0.0 {
                scaler.unscale_(opt.as_mut());
                clip_grad_norm_(&params, config.train.clip_grad_norm, 2.0);
            }
            let step_lr = opt.lr(0);
            let grad_flag = if guard.checks_every_step() { None } else { guard.gradient_flag(&named_params) };
            scaler.step(opt.as_mut());
            scaler.update();
            opt.zero_grad();
            schedule.step(opt.as_mut());
            step += 1;
            window.end_step(step, epoch + 1, grad_flag);
            progress.step();
            if step.is_multiple_of(config.log.every_steps) || step == total {
                if let Some(bad) = window.read(guard.judges_losses()) {
                    progress.finish();
                    return Err(guard.stop_at(bad, step));
                }
                let secs = window_start.elapsed().as_secs_f64().max(1e-9);
                train_loss = window.take_mean();
                let r = StepRecord {
                    kind: "train",
                    step,
                    epoch: epoch + 1,
                    loss: train_loss,
                    lr: step_lr,
                    throughput: (timed_units * world) as f64 / secs,
                    unit: task.unit(),
                    wall_time: unix_time(),
                    elapsed: log.elapsed(),
                    bad_files: task.bad_files(),
                };
                progress.record(&r, total);
                log.log_step(r)?;
                (window_units, timed_units) = (0, 0);
                window_start = Instant::now();
            }
            if config.train.eval_every > 0 && step.is_multiple_of(config.train.eval_every) {
                last_eval = evaluate(&mut log, step, epoch + 1)?.map(|e| (step, e));
            }
            if let Some(why) = saver.due(step, &strategy)? {
                // The checkpoint holds the window's sums: read it (a save copies to the host anyway).
                if let Some(bad) = window.read(guard.judges_losses()) {
                    progress.finish();
                    return Err(guard.stop_at(bad, step));
                }
                saver.save(run_state!(epoch))?;
                if why == SaveReason::Signal {
                    interrupted = Some(step);
                    break 'epochs;
                }
            }
            saver.test_halt(step)?;
            if step == total {
                break 'epochs;
            }
        }
        if config.train.eval_every == 0 && step < total {
            last_eval = evaluate(&mut log, step, epoch + 1)?.map(|e| (step, e));
        }
    }
    let seconds = run_start.elapsed().as_secs_f64();
    if let Some(at) = interrupted {
        // Preempted (Slurm, Kubernetes) or Ctrl-C: the save is on disk; end cleanly, exit 0.
        let saved = saver.wait()?;
        progress.finish();
        strategy.barrier().map_err(TrainError::Comm)?;
        let dir = saved.unwrap_or_else(|| checkpoint_dir(config));
        let why = format!(
            "SIGTERM/SIGINT: saved the checkpoint of step {at} to {}; continue with {}",
            dir.display(),
            run_dir::resume_command(world)
        );
        return Ok(Summary {
            steps: step,
            epochs: step.div_ceil(per_epoch),
            seconds,
            train_loss,
            eval: None,
            throughput: ((run_units - start_units) * world) as f64 / seconds.max(1e-9),
            unit: task.unit(),
            metrics: log.path().to_path_buf(),
            model_dir: None,
            skipped_steps: guard.skipped,
            rank,
            interrupted: Some(why),
            steps_here: step - start_step,
        });
    }
    let eval = match last_eval {
        Some((s, e)) if s == step => Some(e),
        _ => evaluate(&mut log, step, epochs)?,
    };
    progress.finish();
    saver.save_at_end(run_state!(last_epoch))?;
    saver.wait()?;
    let model_dir = if config.checkpoint.at_end && (rank == 0 || config.checkpoint.all_ranks) {
        let dir = match config.checkpoint.dir.as_str() {
            "" => run_dir.join("checkpoints"),
            d => PathBuf::from(d),
        };
        let name = if rank == 0 { "final".to_string() } else { format!("final-rank{rank}") };
        Some(write_model_dir(&dir.join(name), strategy.module(), config)?)
    } else {
        None
    };
    strategy.barrier().map_err(TrainError::Comm)?;
    Ok(Summary {
        steps: step,
        epochs: step.div_ceil(per_epoch),
        seconds,
        train_loss,
        eval,
        throughput: ((run_units - start_units) * world) as f64 / seconds.max(1e-9),
        unit: task.unit(),
        metrics: log.path().to_path_buf(),
        model_dir,
        skipped_steps: guard.skipped,
        rank,
        interrupted: None,
        steps_here: step - start_step,
    })
}
