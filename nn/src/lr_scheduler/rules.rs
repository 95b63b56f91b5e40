//! The single schedules: one generic [`Scheduler`] driving a [`Rule`] (the formula).

use super::{bad_state, LrScheduler};
use crate::optim::Optimizer;
use serde_json::json;
use std::f64::consts::PI;

/// Where a schedule stands, as the formulas see it.
pub struct Ctx<'a> {
    pub last_epoch: i64,
    pub step_count: u64,
    pub base_lrs: &'a [f64],
    /// True during the constructor's step.
    pub is_initial: bool,
}

/// A schedule's formula: the recurrence `step()` uses (from the groups' current `lrs`), and the
/// closed form used when jumping to an epoch, where PyTorch has one.
pub trait Rule {
    fn get_lr(&self, ctx: &Ctx, lrs: &[f64]) -> Vec<f64>;
    fn closed_form(&self, _ctx: &Ctx) -> Option<Vec<f64>> {
        None
    }
}

/// A schedule: a [`Rule`] plus PyTorch's `LRScheduler` bookkeeping.
pub struct Scheduler<R: Rule> {
    pub rule: R,
    base_lrs: Vec<f64>,
    last_epoch: i64,
    step_count: u64,
    last_lr: Vec<f64>,
    is_initial: bool,
}

fn group_lrs(opt: &dyn Optimizer) -> Vec<f64> {
    (0..opt.num_groups()).map(|g| opt.lr(g)).collect()
}

impl<R: Rule> Scheduler<R> {
    /// Attaches `rule` to `opt` and takes the first step (sets the epoch-0 learning rates).
    pub fn new(opt: &mut dyn Optimizer, rule: R) -> Self {
        let base_lrs = (0..opt.num_groups())
            .map(|g| {
                let initial = opt.initial_lr(g).unwrap_or(opt.lr(g));
                opt.set_initial_lr(g, initial);
                initial
            })
            .collect();
        let mut s =
            Scheduler { rule, base_lrs, last_epoch: -1, step_count: 0, last_lr: vec![], is_initial: false };
        s.initial_step(opt);
        s
    }

    pub fn base_lrs(&self) -> &[f64] {
        &self.base_lrs
    }

    fn update_lr(&mut self, opt: &mut dyn Optimizer, epoch: Option<i64>) {
        let lrs = group_lrs(opt);
        let values = {
            match epoch {
                None => self.last_epoch += 1,
                Some(e) => self.last_epoch = e,
            }
            let ctx = Ctx {
                last_epoch: self.last_epoch,
                step_count: self.step_count,
                base_lrs: &self.base_lrs,
                is_initial: self.is_initial,
            };
            let closed = if epoch.is_some() { self.rule.closed_form(&ctx) } else { None };
            closed.unwrap_or_else(|| self.rule.get_lr(&ctx, &lrs))
        };
        assert_eq!(values.len(), opt.num_groups(), "scheduler: the optimizer's group count changed");
        for (g, lr) in values.into_iter().enumerate() {
            opt.set_group_lr(g, lr);
        }
        self.last_lr = group_lrs(opt);
    }
}

impl<R: Rule> LrScheduler for Scheduler<R> {
    fn step(&mut self, opt: &mut dyn Optimizer) {
        self.step_count += 1;
        self.update_lr(opt, None);
    }
    fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }
    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }
    fn state_dict(&self) -> serde_json::Value {
        json!({
            "last_epoch": self.last_epoch,
            "_step_count": self.step_count,
            "base_lrs": self.base_lrs,
            "_last_lr": self.last_lr,
        })
    }
    fn load_state_dict(&mut self, state: &serde_json::Value) -> oxtrain_tensor::Result<()> {
        let floats = |k: &str| -> oxtrain_tensor::Result<Vec<f64>> {
            serde_json::from_value(state.get(k).cloned().ok_or_else(|| bad_state(k))?)
                .map_err(|_| bad_state(k))
        };
        let last_epoch =
            state.get("last_epoch").and_then(|v| v.as_i64()).ok_or_else(|| bad_state("last_epoch"))?;
        let step_count =
            state.get("_step_count").and_then(|v| v.as_u64()).ok_or_else(|| bad_state("_step_count"))?;
        let (base_lrs, last_lr) = (floats("base_lrs")?, floats("_last_lr")?);
        (self.last_epoch, self.step_count, self.base_lrs, self.last_lr) =
            (last_epoch, step_count, base_lrs, last_lr);
        Ok(())
    }
    fn update_lr_to(&mut self, opt: &mut dyn Optimizer, epoch: i64) {
        self.update_lr(opt, Some(epoch));
    }
    fn initial_step(&mut self, opt: &mut dyn Optimizer) {
        self.step_count = 0;
        self.is_initial = true;
        self.step(opt);
        self.is_initial = false;
    }
    fn undo(&mut self) {
        self.last_epoch -= 1;
    }
}

/// `base_lr * lambda(epoch)` (`LambdaLR`, one function for every group).
pub struct LambdaFn(pub Box<dyn Fn(i64) -> f64 + Send>);
impl Rule for LambdaFn {
    fn get_lr(&self, c: &Ctx, _: &[f64]) -> Vec<f64> {
        c.base_lrs.iter().map(|b| b * (self.0)(c.last_epoch)).collect()
    }
}
pub type LambdaLR = Scheduler<LambdaFn>;
impl LambdaLR {
    pub fn lambda(opt: &mut dyn Optimizer, f: impl Fn(i64) -> f64 + Send + 'static) -> Self {
        Scheduler::new(opt, LambdaFn(Box::new(f)))
    }
}

/// `lr * gamma` every `step_size` epochs (`StepLR`).
pub struct StepRule {
    pub step_size: i64,
    pub gamma: f64,
}
impl Rule for StepRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        if c.last_epoch == 0 || c.last_epoch % self.step_size != 0 {
            return lrs.to_vec();
        }
        lrs.iter().map(|l| l * self.gamma).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let k = c.last_epoch.div_euclid(self.step_size) as f64;
        Some(c.base_lrs.iter().map(|b| b * self.gamma.powf(k)).collect())
    }
}
pub type StepLR = Scheduler<StepRule>;
impl StepLR {
    pub fn step_lr(opt: &mut dyn Optimizer, step_size: i64, gamma: f64) -> Self {
        assert!(step_size > 0, "StepLR: step_size must be positive, got {step_size}");
        Scheduler::new(opt, StepRule { step_size, gamma })
    }
}

/// `lr * gamma` at each milestone (a milestone listed twice applies twice) (`MultiStepLR`).
pub struct MultiStepRule {
    /// Sorted, with repeats.
    pub milestones: Vec<i64>,
    pub gamma: f64,
}
impl Rule for MultiStepRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        let count = self.milestones.iter().filter(|&&m| m == c.last_epoch).count();
        if count == 0 {
            return lrs.to_vec();
        }
        lrs.iter().map(|l| l * self.gamma.powf(count as f64)).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let passed = self.milestones.partition_point(|&m| m <= c.last_epoch) as f64;
        Some(c.base_lrs.iter().map(|b| b * self.gamma.powf(passed)).collect())
    }
}
pub type MultiStepLR = Scheduler<MultiStepRule>;
impl MultiStepLR {
    pub fn multi_step(opt: &mut dyn Optimizer, milestones: &[i64], gamma: f64) -> Self {
        let mut milestones = milestones.to_vec();
        milestones.sort_unstable();
        Scheduler::new(opt, MultiStepRule { milestones, gamma })
    }
}

/// `lr * factor` until `total_iters`, then `lr` (`ConstantLR`).
pub struct ConstantRule {
    pub factor: f64,
    pub total_iters: i64,
}
impl Rule for ConstantRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        if c.last_epoch == 0 {
            return lrs.iter().map(|l| l * self.factor).collect();
        }
        if c.last_epoch != self.total_iters {
            return lrs.to_vec();
        }
        lrs.iter().map(|l| l * (1.0 / self.factor)).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let after = (c.last_epoch >= self.total_iters) as i64 as f64;
        Some(c.base_lrs.iter().map(|b| b * (self.factor + after * (1.0 - self.factor))).collect())
    }
}
pub type ConstantLR = Scheduler<ConstantRule>;
impl ConstantLR {
    pub fn constant(opt: &mut dyn Optimizer, factor: f64, total_iters: i64) -> Self {
        assert!((0.0..=1.0).contains(&factor), "ConstantLR: factor must be in [0, 1], got {factor}");
        Scheduler::new(opt, ConstantRule { factor, total_iters })
    }
}

/// Linear ramp of the factor from `start_factor` to `end_factor` over `total_iters` epochs
/// (`LinearLR`, the usual warmup).
pub struct LinearRule {
    pub start_factor: f64,
    pub end_factor: f64,
    pub total_iters: i64,
}
impl Rule for LinearRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        if c.last_epoch == 0 {
            return lrs.iter().map(|l| l * self.start_factor).collect();
        }
        if c.is_initial || c.last_epoch > self.total_iters {
            return lrs.to_vec();
        }
        let (s, e) = (self.start_factor, self.end_factor);
        let f = 1.0 + (e - s) / (self.total_iters as f64 * s + (c.last_epoch - 1) as f64 * (e - s));
        lrs.iter().map(|l| l * f).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let (s, e) = (self.start_factor, self.end_factor);
        let done = self.total_iters.min(c.last_epoch) as f64;
        Some(c.base_lrs.iter().map(|b| b * (s + (e - s) * done / self.total_iters as f64)).collect())
    }
}
pub type LinearLR = Scheduler<LinearRule>;
impl LinearLR {
    pub fn linear(opt: &mut dyn Optimizer, start_factor: f64, end_factor: f64, total_iters: i64) -> Self {
        assert!(
            start_factor > 0.0 && start_factor <= 1.0 && (0.0..=1.0).contains(&end_factor),
            "LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor} and {end_factor}"
        );
        Scheduler::new(opt, LinearRule { start_factor, end_factor, total_iters })
    }
}

/// `lr * gamma` every epoch (`ExponentialLR`).
pub struct ExponentialRule {
    pub gamma: f64,
}
impl Rule for ExponentialRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        if c.last_epoch == 0 || c.is_initial {
            return lrs.to_vec();
        }
        lrs.iter().map(|l| l * self.gamma).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        Some(c.base_lrs.iter().map(|b| b * self.gamma.powf(c.last_epoch as f64)).collect())
    }
}
pub type ExponentialLR = Scheduler<ExponentialRule>;
impl ExponentialLR {
    pub fn exponential(opt: &mut dyn Optimizer, gamma: f64) -> Self {
        Scheduler::new(opt, ExponentialRule { gamma })
    }
}

/// `base * (1 - epoch / total_iters)^power`, then constant (`PolynomialLR`).
pub struct PolynomialRule {
    pub total_iters: i64,
    pub power: f64,
}
impl Rule for PolynomialRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        if c.is_initial || c.last_epoch > self.total_iters {
            return lrs.to_vec();
        }
        let (e, t) = (c.last_epoch as f64, self.total_iters as f64);
        let f = ((1.0 - e / t) / (1.0 - (e - 1.0) / t)).powf(self.power);
        lrs.iter().map(|l| l * f).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let t = self.total_iters as f64;
        let e = self.total_iters.min(c.last_epoch) as f64;
        Some(c.base_lrs.iter().map(|b| b * (1.0 - e / t).powf(self.power)).collect())
    }
}
pub type PolynomialLR = Scheduler<PolynomialRule>;
impl PolynomialLR {
    pub fn polynomial(opt: &mut dyn Optimizer, total_iters: i64, power: f64) -> Self {
        Scheduler::new(opt, PolynomialRule { total_iters, power })
    }
}

/// Cosine from the base rate down to `eta_min` over `t_max` epochs, then back up, in
/// PyTorch's recursive form (`CosineAnnealingLR`).
pub struct CosineRule {
    pub t_max: i64,
    pub eta_min: f64,
}
impl Rule for CosineRule {
    fn get_lr(&self, c: &Ctx, lrs: &[f64]) -> Vec<f64> {
        let (e, t, m) = (c.last_epoch, self.t_max as f64, self.eta_min);
        if c.is_initial {
            return lrs.to_vec();
        }
        if c.step_count == 1 && e > 0 {
            return c
                .base_lrs
                .iter()
                .map(|b| m + (b - m) * (1.0 + (e as f64 * PI / t).cos()) / 2.0)
                .collect();
        }
        if (e - 1 - self.t_max).rem_euclid(2 * self.t_max) == 0 {
            return lrs
                .iter()
                .zip(c.base_lrs)
                .map(|(l, b)| l + (b - m) * (1.0 - (PI / t).cos()) / 2.0)
                .collect();
        }
        let ratio = (1.0 + (PI * e as f64 / t).cos()) / (1.0 + (PI * (e - 1) as f64 / t).cos());
        lrs.iter().map(|l| ratio * (l - m) + m).collect()
    }
    fn closed_form(&self, c: &Ctx) -> Option<Vec<f64>> {
        let (e, t, m) = (c.last_epoch as f64, self.t_max as f64, self.eta_min);
        Some(c.base_lrs.iter().map(|b| m + (b - m) * (1.0 + (PI * e / t).cos()) / 2.0).collect())
    }
}
pub type CosineAnnealingLR = Scheduler<CosineRule>;
impl CosineAnnealingLR {
    pub fn cosine(opt: &mut dyn Optimizer, t_max: i64, eta_min: f64) -> Self {
        assert!(t_max > 0, "CosineAnnealingLR: T_max must be positive, got {t_max}");
        Scheduler::new(opt, CosineRule { t_max, eta_min })
    }
}
