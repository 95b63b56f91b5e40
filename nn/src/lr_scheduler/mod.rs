//! Learning-rate schedules (`torch.optim.lr_scheduler`) that reproduce PyTorch's values
//! exactly: the same recurrences (the "chainable" forms `step()` uses, which differ from the
//! closed forms in the last bits and, for cosine, after `T_max`), the same closed forms where
//! PyTorch uses them (`SequentialLR` switching schedules), in f64 as Python computes.
//!
//! A schedule is built on an optimizer, which it sets to its first value at once (as PyTorch's
//! constructors do), and then `step(&mut opt)` once per epoch or iteration after
//! `opt.step()`. The first schedule built on an optimizer records each group's
//! `initial_lr`; later ones (and restarts) start from it.

mod composite;
mod rules;
#[cfg(test)]
mod tests;

pub use composite::{AllAtOnce, AtMilestones, ChainedScheduler, Composite, SequentialLR, Stepping};
pub use rules::{
    ConstantLR, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR, MultiStepLR, PolynomialLR, Rule,
    Scheduler, StepLR,
};

use crate::optim::Optimizer;

/// What every schedule offers (`LRScheduler`).
pub trait LrScheduler {
    /// Advances one epoch and writes the new learning rates into the optimizer's groups.
    fn step(&mut self, opt: &mut dyn Optimizer);

    /// The learning rates the last step set, one per group (`get_last_lr()`).
    fn get_last_lr(&self) -> Vec<f64>;

    /// Steps taken, counting the constructor's (`last_epoch`).
    fn last_epoch(&self) -> i64;

    /// The schedule's progress, for checkpoints (JSON, PyTorch's key names).
    fn state_dict(&self) -> serde_json::Value;

    /// Restores [`LrScheduler::state_dict`]; fails naming the key that is missing or wrong.
    fn load_state_dict(&mut self, state: &serde_json::Value) -> oxtrain_tensor::Result<()>;

    /// Jumps to `epoch` with the closed form (`_update_lr(epoch)`), as `SequentialLR` does
    /// when it switches schedules.
    #[doc(hidden)]
    fn update_lr_to(&mut self, opt: &mut dyn Optimizer, epoch: i64);

    /// Resets the step count and steps once (`_initial_step`).
    #[doc(hidden)]
    fn initial_step(&mut self, opt: &mut dyn Optimizer);

    /// Takes back one epoch (`SequentialLR.recursive_undo`).
    #[doc(hidden)]
    fn undo(&mut self);
}

fn bad_state(key: &str) -> oxtrain_tensor::Error {
    oxtrain_tensor::Error::Msg(format!("scheduler load_state_dict: `{key}` is missing or malformed"))
}
