//! The [`Trainer`]: the live state of one run (model wrapper, optimizer, schedule, scaler,
//! guard, saver, log, counters) and the loop over it, as torchtitan's `train.py` reads: a
//! loop of epochs over [`Trainer::train_step`], and each step over
//! [`Trainer::forward_backward`] per micro-batch. A checkpoint is [`Trainer::state_dict`];
//! a resume loads one into the trainer before the loop.

use super::checkpointing::{self, Counters, RunState, Saver};
use super::nonfinite::{NonFiniteGuard, Verdict};
use super::window::LossWindow;
use super::{optim, run_dir, Summary};
use crate::checkpoint::layout::final_dir_name;
use crate::checkpoint::SaveReason;
use crate::config::{Config, PrecisionDtype};
use crate::metrics::{unix_time, EvalRecord, MetricsLog, Progress, StepRecord};
use crate::runtime::{autocast_dtype, make_strategy, Placement, Strategy, TrainError};
use crate::tasks::{Evaluation, Task};
use oxtrain_autograd::{autocast, Var};
use oxtrain_nn::amp::{GradScaler, GradScalerConfig};
use oxtrain_nn::lr_scheduler::LrScheduler;
use oxtrain_nn::optim::{total_grad_norm, Optimizer};
use oxtrain_nn::Module;
use oxtrain_tensor::Tensor;
use std::path::PathBuf;
use std::time::Instant;

/// How far the run goes: optimizer steps per epoch, epochs, total steps.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    pub per_epoch: usize,
    pub epochs: usize,
    pub total: usize,
}

impl Plan {
    /// The plan of a run resumed at `step` inside `epoch`, with `left` of its steps to go, on a
    /// world whose epochs have `per_epoch` steps, after a checkpoint of another world size
    /// (whose epochs had another length). A run bound by steps keeps its total and goes on for
    /// as many epochs as that takes; one bound by epochs ends after its last epoch.
    pub fn resumed_elsewhere(self, step: usize, epoch: usize, left: usize, by_steps: bool) -> Plan {
        if by_steps {
            let after_this_epoch = self.total.saturating_sub(step + left);
            Plan { epochs: epoch + 1 + after_this_epoch.div_ceil(self.per_epoch), ..self }
        } else {
            Plan { total: step + left + self.epochs.saturating_sub(epoch + 1) * self.per_epoch, ..self }
        }
    }
}

/// Where an epoch left the run.
enum Flow {
    Next,
    /// The last step is done.
    Done,
    /// SIGTERM/SIGINT: the checkpoint of this step is saved.
    Interrupted(usize),
}

/// The loop's counters; a checkpoint holds them (as [`Counters`]) so the logged windows and the
/// summary go on as if the run had never stopped.
struct Tally {
    step: usize,
    window: LossWindow,
    window_units: usize,
    run_units: usize,
    /// Units and time this process trained (throughput leaves out what a checkpoint brought).
    timed_units: usize,
    start_step: usize,
    start_units: usize,
    window_start: Instant,
    train_loss: f64,
    /// The gradient norm of the last logged step, on the device until the log reads it.
    grad_norm: Option<Tensor>,
    last_eval: Option<(usize, Evaluation)>,
}

pub(super) struct Trainer<'a, T: Task> {
    task: &'a T,
    config: &'a Config,
    place: Placement,
    plan: Plan,
    strategy: Strategy<T::Model>,
    opt: Box<dyn Optimizer>,
    schedule: Box<dyn LrScheduler>,
    scaler: GradScaler,
    guard: NonFiniteGuard,
    saver: Option<Saver>,
    log: Option<MetricsLog>,
    pub progress: Progress,
    named_params: Vec<(String, Var)>,
    tally: Tally,
    /// The epoch and whether its batches were used up, from the checkpoint resumed.
    first_epoch: (usize, bool),
}

impl<'a, T: Task> Trainer<'a, T> {
    /// Builds the run's state from the task and its config (nothing restored yet).
    pub fn new(task: &'a T, place: Placement, plan: Plan) -> Result<Self, TrainError> {
        let config = task.config();
        let strategy = make_strategy(task.build_model()?, config, place)?;
        let world = strategy.world_size();
        let mut opt = optim::build_optimizer(config, &strategy, optim::base_lr(config, world))?;
        let schedule = optim::build_schedule(config, opt.as_mut(), plan.total, plan.per_epoch);
        let scaler = GradScaler::new(GradScalerConfig {
            init_scale: config.precision.init_scale,
            growth_interval: config.precision.growth_interval,
            enabled: config.precision.dtype == PrecisionDtype::F16,
            ..Default::default()
        });
        let guard = NonFiniteGuard::new(config, world, scaler.is_enabled());
        let progress = Progress::new(config.log.progress, strategy.rank(), plan.total, plan.epochs);
        let named_params = strategy.module().trainable_named_parameters();
        let tally = Tally {
            step: 0,
            window: LossWindow::new(0.0, 0),
            window_units: 0,
            run_units: 0,
            timed_units: 0,
            start_step: 0,
            start_units: 0,
            window_start: Instant::now(),
            train_loss: f64::NAN,
            grad_norm: None,
            last_eval: None,
        };
        Ok(Trainer {
            task,
            config,
            place,
            plan,
            strategy,
            opt,
            schedule,
            scaler,
            guard,
            saver: None,
            log: None,
            progress,
            named_params,
            tally,
            first_epoch: (0, false),
        })
    }

    /// Claims the run's folder, restores the checkpoint `checkpoint.resume` names (if any),
    /// starts the writer and the metrics, and says what the run is.
    pub fn start(&mut self) -> Result<(), TrainError> {
        let (config, rank) = (self.config, self.strategy.rank());
        run_dir::claim(config, rank)?;
        let resumed = self.load_state_dict()?;
        // Every rank has looked before any writer clears its unfinished writes.
        self.strategy.barrier().map_err(|e| TrainError::comm("", e))?;
        self.saver = Some(Saver::new(config, rank, self.strategy.world_size())?);
        let dir = PathBuf::from(&config.log.dir);
        self.log = Some(MetricsLog::open(&dir, rank == 0, &config.log, resumed)?);
        self.progress.println(&format!(
            "oxtrain train: {}; {} on {:?}, {}; {} steps of {} x {} x {} samples",
            self.task.describe(),
            self.strategy.describe(),
            self.place.device,
            crate::config::enum_name(&config.precision.dtype),
            self.plan.total,
            config.data.batch_size,
            self.strategy.world_size(),
            config.train.grad_accum
        ));
        if let Some(w) =
            optim::warmup_warning(config, self.plan.total, self.plan.per_epoch).filter(|_| rank == 0)
        {
            self.progress.warn(&w);
        }
        Ok(())
    }

    /// Everything of the live run a checkpoint holds, at the current step of `epoch`.
    fn state_dict(&self, epoch: usize) -> RunState<'_> {
        let t = &self.tally;
        RunState {
            step: t.step,
            epoch,
            model: self.strategy.module(),
            optimizer: self.opt.as_ref(),
            schedule: self.schedule.as_ref(),
            scaler: &self.scaler,
            data: self.task.data_state(),
            config: self.config,
            counters: Counters {
                skipped: self.guard.skipped,
                window_loss: t.window.loss,
                window_steps: t.window.steps,
                window_units: t.window_units,
                run_units: t.run_units,
            },
        }
    }

    /// Restores the checkpoint `checkpoint.resume` names into the live run; its step, if any.
    /// Last before the loop: restoring sets the generator that building the model drew from.
    fn load_state_dict(&mut self) -> Result<Option<usize>, TrainError> {
        let progress = &self.progress;
        let say = |line: &str| progress.println(line);
        let (opt, schedule) = (self.opt.as_mut(), self.schedule.as_mut());
        let start = checkpointing::resume(
            self.config,
            self.task,
            &self.strategy,
            opt,
            schedule,
            &mut self.scaler,
            &say,
        )?;
        let Some(s) = start else { return Ok(None) };
        let c = s.counters;
        self.guard.skipped = c.skipped;
        let t = &mut self.tally;
        (t.step, t.start_step, t.run_units, t.start_units) = (s.step, s.step, c.run_units, c.run_units);
        t.window = LossWindow::new(c.window_loss, c.window_steps);
        t.window_units = c.window_units;
        // A save at the very end of an epoch resumes with the next one.
        self.first_epoch = (s.epoch, s.epoch_left == 0);
        if s.resharded {
            let by_steps = self.config.train.steps > 0;
            let left = s.epoch_left / self.config.train.grad_accum;
            self.plan = self.plan.resumed_elsewhere(s.step, s.epoch, left, by_steps);
        }
        Ok(Some(s.step))
    }

    /// The epochs from where the run stands to its end, then the final evaluation, save and
    /// model folder.
    pub fn run(&mut self) -> Result<Summary, TrainError> {
        let run_start = Instant::now();
        let (first, used_up) = self.first_epoch;
        let mut last_epoch = first;
        if self.tally.step >= self.plan.total {
            self.progress.println(&format!(
                "the checkpoint of step {} is the end of this run ({} steps): evaluating and writing the final \
                 model only",
                self.tally.step, self.plan.total
            ));
        } else {
            // The first epoch's first batches load while the loop starts (later epochs load
            // ahead by themselves, during the end of the one before and its evaluation).
            self.task.prefetch(first as u64);
            for epoch in first..self.plan.epochs {
                last_epoch = epoch;
                match self.train_epoch(epoch, used_up && epoch == first)? {
                    Flow::Next if self.config.train.eval_every == 0 => self.evaluate(epoch + 1)?,
                    Flow::Next => {}
                    Flow::Done => break,
                    Flow::Interrupted(at) => return self.interrupted(at, run_start),
                }
            }
        }
        self.finish(last_epoch, run_start)
    }

    /// One epoch's optimizer steps (none when `used_up`: the checkpoint ended it).
    fn train_epoch(&mut self, epoch: usize, used_up: bool) -> Result<Flow, TrainError> {
        self.progress.start_epoch(epoch);
        let task = self.task;
        let batches: Box<dyn Iterator<Item = crate::tasks::TaskResult<T::Batch>> + 'a> =
            if used_up { Box::new(std::iter::empty()) } else { task.batches(epoch as u64) };
        let accum = self.config.train.grad_accum;
        let mut micro = 0usize;
        for batch in batches {
            micro += 1;
            if !self.forward_backward(&batch?, epoch, micro == accum)? {
                micro = 0;
                continue;
            }
            if micro < accum {
                continue;
            }
            micro = 0;
            if let Some(flow) = self.train_step(epoch)? {
                return Ok(flow);
            }
        }
        Ok(Flow::Next)
    }

    /// Forward and backward of one micro-batch (under DDP, the all-reduce only on the `last`);
    /// false when the guard skipped the step.
    fn forward_backward(&mut self, batch: &T::Batch, epoch: usize, last: bool) -> Result<bool, TrainError> {
        let (task, accum) = (self.task, self.config.train.grad_accum);
        let loss = self.strategy.forward(|m| match autocast_dtype(self.config) {
            Some(dt) => autocast(dt, || task.loss(m, batch)),
            None => task.loss(m, batch),
        });
        self.tally.window.add_micro(loss.tensor(), accum);
        // "skip" decides before the update: a host read per micro-batch, its documented cost.
        if self.guard.checks_every_step() {
            let value = loss.tensor().item();
            let verdict = self.guard.loss(value, self.tally.step + 1, epoch + 1, &self.named_params);
            if !self.go_on(verdict)? {
                return Ok(false);
            }
        }
        let scaled = self.scaler.scale(&loss.mul_scalar(1.0 / accum as f64));
        // Under DDP the end of backward waits for the gradient all-reduces: a peer that failed
        // or a host cut off is the communicator's error here (its timeout, naming the missing
        // ranks), which ends the run with that message instead of a panic.
        let backward =
            if last { scaled.try_backward() } else { self.strategy.no_sync(|| scaled.try_backward()) };
        backward.map_err(|source| TrainError::Backward {
            step: self.tally.step + 1,
            epoch: epoch + 1,
            source,
        })?;
        let units = task.units(batch);
        let t = &mut self.tally;
        (t.window_units, t.run_units, t.timed_units) =
            (t.window_units + units, t.run_units + units, t.timed_units + units);
        Ok(true)
    }

    /// A guard's verdict: go on, or skip (the step's gradients and losses dropped), or stop.
    fn go_on(&mut self, verdict: Verdict) -> Result<bool, TrainError> {
        match verdict {
            Verdict::Go => Ok(true),
            Verdict::Skip(message) => {
                self.progress.println(&message);
                self.opt.zero_grad();
                self.tally.window.discard_step();
                Ok(false)
            }
            Verdict::Stop(e) => Err(e),
        }
    }

    /// The optimizer step after the last micro-batch, then logging, evaluation and saves at
    /// their intervals; where the epoch goes from here (None: on).
    fn train_step(&mut self, epoch: usize) -> Result<Option<Flow>, TrainError> {
        let step = self.tally.step + 1;
        if self.guard.checks_every_step() {
            let verdict = self.guard.gradients(step, epoch + 1, &self.named_params);
            if !self.go_on(verdict)? {
                return Ok(None);
            }
        }
        self.tally.grad_norm = self.clip_or_measure(step)?;
        let lr = self.opt.lr(0);
        let grad_flag = match self.guard.checks_every_step() {
            true => None,
            false => self.guard.gradient_flag(&self.named_params),
        };
        self.scaler.step(self.opt.as_mut());
        self.scaler.update();
        self.opt.zero_grad();
        self.schedule.step(self.opt.as_mut());
        self.tally.step = step;
        self.tally.window.end_step(step, epoch + 1, grad_flag);
        self.progress.step();
        self.after_step(step, epoch, lr)
    }

    /// Clips the gradients (`train.clip_grad_norm`), and returns their norm where it is clipped
    /// or logged: a device tensor, read at the log interval. Unscaled first under a grad scaler.
    fn clip_or_measure(&mut self, step: usize) -> Result<Option<Tensor>, TrainError> {
        let clip = self.config.train.clip_grad_norm;
        if clip <= 0.0 && !self.logs_at(step) {
            return Ok(None);
        }
        self.scaler.unscale_(self.opt.as_mut());
        // The optimizer's parameters: under ZeRO-1 this rank's reduced shards, whose norm is
        // summed over the ranks (clipping at infinity measures it and scales by 1).
        let params = self.opt.params();
        let norm = match (clip > 0.0, self.strategy.shards_optimizer()) {
            (false, false) => total_grad_norm(&params, 2.0),
            (true, _) => self.strategy.clip_grad_norm_(&params, clip).map_err(|e| TrainError::comm("", e))?,
            (false, true) => {
                self.strategy.clip_grad_norm_(&params, f64::INFINITY).map_err(|e| TrainError::comm("", e))?
            }
        };
        Ok(Some(norm))
    }

    /// Whether optimizer step `step` ends a logging window.
    fn logs_at(&self, step: usize) -> bool {
        step.is_multiple_of(self.config.log.every_steps) || step == self.plan.total
    }

    /// Logging, evaluation and saves due after optimizer step `step`.
    fn after_step(&mut self, step: usize, epoch: usize, lr: f64) -> Result<Option<Flow>, TrainError> {
        let total = self.plan.total;
        if self.logs_at(step) {
            self.log_window(step, epoch, lr)?;
        }
        if self.config.train.eval_every > 0 && step.is_multiple_of(self.config.train.eval_every) {
            self.evaluate(epoch + 1)?;
        }
        let saver = self.saver.as_mut().expect("started");
        if let Some(why) = saver.due(step, &self.strategy)? {
            // The checkpoint holds the window's sums: read it (a save copies to the host anyway).
            self.read_window(step)?;
            let mut saver = self.saver.take().expect("started");
            saver.save(self.state_dict(epoch))?;
            self.saver = Some(saver);
            if why == SaveReason::Signal {
                return Ok(Some(Flow::Interrupted(step)));
            }
        }
        self.saver.as_mut().expect("started").test_halt(step)?;
        Ok((step == total).then_some(Flow::Done))
    }

    /// Reads the loss window (one transfer); a non-finite step in it stops the run.
    fn read_window(&mut self, step: usize) -> Result<(), TrainError> {
        match self.tally.window.read(self.guard.judges_losses()) {
            Some(bad) => Err(self.guard.stop_at(bad, step)),
            None => Ok(()),
        }
    }

    /// The logged record of the window that ends at `step`.
    fn log_window(&mut self, step: usize, epoch: usize, lr: f64) -> Result<(), TrainError> {
        self.read_window(step)?;
        let t = &mut self.tally;
        let secs = t.window_start.elapsed().as_secs_f64().max(1e-9);
        t.train_loss = t.window.take_mean();
        let log = self.log.as_mut().expect("started");
        let r = StepRecord {
            kind: "train",
            step,
            epoch: epoch + 1,
            loss: t.train_loss,
            lr,
            throughput: (t.timed_units * self.strategy.world_size()) as f64 / secs,
            unit: self.task.unit(),
            wall_time: unix_time(),
            elapsed: log.elapsed(),
            bad_files: self.task.bad_files(),
            gpu_decode_fallbacks: self.task.gpu_decode_fallbacks(),
            // Read with the losses, at the log interval only.
            grad_norm: t.grad_norm.take().map(|n| n.item()),
        };
        self.progress.record(&r, self.plan.total);
        log.log_step(r)?;
        (t.window_units, t.timed_units, t.window_start) = (0, 0, Instant::now());
        Ok(())
    }

    /// Evaluates (when the task has evaluation data), prints and logs it.
    fn evaluate(&mut self, epoch: usize) -> Result<(), TrainError> {
        let step = self.tally.step;
        let Some(e) = self.task.evaluate(&self.strategy)? else { return Ok(()) };
        let mut line = format!("eval at step {step}: loss {:.4}", e.loss);
        for (k, v) in &e.metrics {
            line += &format!(", {k} {v:.4}");
        }
        self.progress.println(&line);
        let log = self.log.as_mut().expect("started");
        let elapsed = log.elapsed();
        let record = EvalRecord {
            step,
            epoch,
            loss: e.loss,
            metrics: e.metrics.clone(),
            wall_time: unix_time(),
            elapsed,
        };
        log.log_eval(record)?;
        self.tally.last_eval = Some((step, e));
        Ok(())
    }

    /// Preempted (Slurm, Kubernetes) or Ctrl-C: the save is on disk; end cleanly, exit 0.
    fn interrupted(&mut self, at: usize, run_start: Instant) -> Result<Summary, TrainError> {
        let seconds = run_start.elapsed().as_secs_f64();
        let saved = self.saver.as_mut().expect("started").wait()?;
        self.progress.finish();
        self.strategy.barrier().map_err(|e| TrainError::comm("", e))?;
        let dir = saved.unwrap_or_else(|| super::checkpoint_dir(self.config));
        let why = format!(
            "SIGTERM/SIGINT: saved the checkpoint of step {at} to {}; continue with {}",
            dir.display(),
            run_dir::resume_command(self.strategy.world_size())
        );
        Ok(self.summary(seconds, None, None, Some(why)))
    }

    /// The last evaluation, the end-of-run save and the final model folder.
    fn finish(&mut self, last_epoch: usize, run_start: Instant) -> Result<Summary, TrainError> {
        let seconds = run_start.elapsed().as_secs_f64();
        let step = self.tally.step;
        if self.tally.last_eval.as_ref().is_none_or(|(s, _)| *s != step) {
            self.tally.last_eval = None;
            self.evaluate(self.plan.epochs)?;
        }
        self.progress.finish();
        let mut saver = self.saver.take().expect("started");
        saver.save_at_end(self.state_dict(last_epoch))?;
        saver.wait()?;
        self.saver = Some(saver);
        let (config, rank) = (self.config, self.strategy.rank());
        let model_dir = if config.checkpoint.at_end && (rank == 0 || config.checkpoint.all_ranks) {
            let dir = super::checkpoint_dir(config).join(final_dir_name(rank));
            Some(super::write_model_dir(
                &dir,
                self.strategy.module(),
                config,
                step as u64,
                last_epoch as u64,
            )?)
        } else {
            None
        };
        self.strategy.barrier().map_err(|e| TrainError::comm("", e))?;
        let eval = self.tally.last_eval.take().map(|(_, e)| e);
        Ok(self.summary(seconds, eval, model_dir, None))
    }

    fn summary(
        &self,
        seconds: f64,
        eval: Option<Evaluation>,
        model_dir: Option<PathBuf>,
        interrupted: Option<String>,
    ) -> Summary {
        let t = &self.tally;
        Summary {
            steps: t.step,
            epochs: t.step.div_ceil(self.plan.per_epoch),
            seconds,
            train_loss: t.train_loss,
            eval,
            throughput: ((t.run_units - t.start_units) * self.strategy.world_size()) as f64
                / seconds.max(1e-9),
            unit: self.task.unit(),
            metrics: self.log.as_ref().expect("started").path().to_path_buf(),
            model_dir,
            skipped_steps: self.guard.skipped,
            rank: self.strategy.rank(),
            interrupted,
            steps_here: t.step - t.start_step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Plan;

    #[test]
    fn a_plan_resumed_on_another_world_keeps_its_steps_or_its_epochs() {
        // Saved on 3 ranks at step 6, inside epoch 0 with 5 steps of it left here on 2 ranks,
        // whose epochs have 14 steps.
        let plan = Plan { per_epoch: 14, epochs: 1, total: 12 };
        let by_steps = plan.resumed_elsewhere(6, 0, 5, true);
        assert_eq!((by_steps.epochs, by_steps.total), (2, 12), "12 steps: one step of epoch 1");
        // Bound by 3 epochs: the 5 steps left, then 2 epochs of 14.
        let plan = Plan { per_epoch: 14, epochs: 3, total: 42 };
        let by_epochs = plan.resumed_elsewhere(6, 0, 5, false);
        assert_eq!((by_epochs.epochs, by_epochs.total), (3, 6 + 5 + 28));
        // Saved at the very end of epoch 1: the next epochs start afresh.
        let plan = Plan { per_epoch: 14, epochs: 3, total: 42 };
        assert_eq!(plan.resumed_elsewhere(18, 1, 0, false).total, 18 + 14);
    }
}
