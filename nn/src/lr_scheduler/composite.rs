//! Schedules made of schedules: [`SequentialLR`] (one after another at milestones) and
//! [`ChainedScheduler`] (all at once, each multiplying in its change).

use super::{bad_state, LrScheduler};
use crate::optim::Optimizer;
use serde_json::json;

/// A schedule made of schedules; [`Stepping`] says how one epoch steps them. What the two
/// kinds share (the last epoch and rates, the state dict of every inner schedule, undo) lives
/// here once.
pub struct Composite<S: Stepping> {
    schedulers: Vec<Box<dyn LrScheduler>>,
    stepping: S,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

/// How a [`Composite`] advances its schedules by one epoch.
pub trait Stepping {
    /// The PyTorch class, for messages.
    const NAME: &'static str;
    /// Steps `schedulers` into epoch `epoch` and returns the rates they set.
    fn step(&self, schedulers: &mut [Box<dyn LrScheduler>], epoch: i64, opt: &mut dyn Optimizer) -> Vec<f64>;
}

/// Runs `schedulers[i]` from `milestones[i - 1]` on (`SequentialLR`); a schedule that takes
/// over starts from its closed form at epoch 0, as in PyTorch.
pub type SequentialLR = Composite<AtMilestones>;

/// Steps every schedule each epoch (`ChainedScheduler`): their changes multiply.
pub type ChainedScheduler = Composite<AllAtOnce>;

/// [`SequentialLR`]'s stepping: the schedule whose milestone range holds the epoch.
pub struct AtMilestones {
    milestones: Vec<i64>,
}

/// [`ChainedScheduler`]'s stepping: every schedule, in order.
pub struct AllAtOnce;

impl Stepping for AtMilestones {
    const NAME: &'static str = "SequentialLR";
    fn step(&self, schedulers: &mut [Box<dyn LrScheduler>], epoch: i64, opt: &mut dyn Optimizer) -> Vec<f64> {
        let idx = self.milestones.partition_point(|&m| m <= epoch);
        let s = &mut schedulers[idx];
        if idx > 0 && self.milestones[idx - 1] == epoch {
            s.update_lr_to(opt, 0);
        } else {
            s.step(opt);
        }
        s.get_last_lr()
    }
}

impl Stepping for AllAtOnce {
    const NAME: &'static str = "ChainedScheduler";
    fn step(&self, schedulers: &mut [Box<dyn LrScheduler>], _: i64, opt: &mut dyn Optimizer) -> Vec<f64> {
        for s in schedulers.iter_mut() {
            s.step(opt);
        }
        (0..opt.num_groups()).map(|g| opt.lr(g)).collect()
    }
}

impl SequentialLR {
    /// `schedulers` must have been built on `opt`, in order.
    pub fn new(
        opt: &mut dyn Optimizer,
        mut schedulers: Vec<Box<dyn LrScheduler>>,
        milestones: &[i64],
    ) -> Self {
        assert!(!schedulers.is_empty(), "SequentialLR: expects at least one scheduler");
        assert_eq!(
            milestones.len(),
            schedulers.len() - 1,
            "SequentialLR: expects one milestone fewer than schedulers, got {} schedulers and {} milestones",
            schedulers.len(),
            milestones.len()
        );
        for g in 0..opt.num_groups() {
            let initial = opt.initial_lr(g).expect("SequentialLR: the schedulers set initial_lr");
            opt.set_group_lr(g, initial);
        }
        for s in &mut schedulers {
            s.undo();
        }
        let idx = milestones.partition_point(|&m| m <= 0);
        schedulers[idx].initial_step(opt);
        let last_lr = schedulers[idx].get_last_lr();
        let stepping = AtMilestones { milestones: milestones.to_vec() };
        Composite { schedulers, stepping, last_epoch: 0, last_lr }
    }
}

impl ChainedScheduler {
    pub fn new(opt: &dyn Optimizer, schedulers: Vec<Box<dyn LrScheduler>>) -> Self {
        assert!(!schedulers.is_empty(), "ChainedScheduler: expects at least one scheduler");
        let last_lr = (0..opt.num_groups()).map(|g| opt.lr(g)).collect();
        Composite { schedulers, stepping: AllAtOnce, last_epoch: 0, last_lr }
    }
}

impl<S: Stepping> LrScheduler for Composite<S> {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.last_epoch += 1;
        self.last_lr = self.stepping.step(&mut self.schedulers, self.last_epoch, opt);
    }
    fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }
    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }
    fn state_dict(&self) -> serde_json::Value {
        composite_state(self.last_epoch, &self.last_lr, &self.schedulers)
    }
    fn load_state_dict(&mut self, state: &serde_json::Value) -> oxtrain_tensor::Result<()> {
        (self.last_epoch, self.last_lr) = load_composite(state, &mut self.schedulers)?;
        Ok(())
    }
    fn update_lr_to(&mut self, _: &mut dyn Optimizer, _: i64) {
        panic!("{} has no closed form; it cannot be a later stage of a SequentialLR", S::NAME);
    }
    fn initial_step(&mut self, opt: &mut dyn Optimizer) {
        self.step(opt);
    }
    fn undo(&mut self) {
        for s in &mut self.schedulers {
            s.undo();
        }
    }
}

fn composite_state(
    last_epoch: i64,
    last_lr: &[f64],
    schedulers: &[Box<dyn LrScheduler>],
) -> serde_json::Value {
    let inner: Vec<serde_json::Value> = schedulers.iter().map(|s| s.state_dict()).collect();
    json!({ "last_epoch": last_epoch, "_last_lr": last_lr, "_schedulers": inner })
}

fn load_composite(
    state: &serde_json::Value,
    schedulers: &mut [Box<dyn LrScheduler>],
) -> oxtrain_tensor::Result<(i64, Vec<f64>)> {
    let last_epoch =
        state.get("last_epoch").and_then(|v| v.as_i64()).ok_or_else(|| bad_state("last_epoch"))?;
    let last_lr: Vec<f64> =
        serde_json::from_value(state.get("_last_lr").cloned().ok_or_else(|| bad_state("_last_lr"))?)
            .map_err(|_| bad_state("_last_lr"))?;
    let inner =
        state.get("_schedulers").and_then(|v| v.as_array()).ok_or_else(|| bad_state("_schedulers"))?;
    if inner.len() != schedulers.len() {
        return Err(bad_state("_schedulers"));
    }
    for (s, st) in schedulers.iter_mut().zip(inner) {
        s.load_state_dict(st)?;
    }
    Ok((last_epoch, last_lr))
}
