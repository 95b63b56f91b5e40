//! How the loop's work is spread over processes, kept apart from the loop (as burn's Learner
//! keeps its strategy): the loop asks the strategy for the model, runs forward and backward
//! through it, and asks it to combine metrics; it never names a backend.

use oxtrain_autograd::Var;
use oxtrain_nn::Module;

/// One process, or this process's part of a data-parallel group.
pub enum Strategy<M: Module> {
    /// The whole batch here: the model as it is.
    Single(M),
}

impl<M: Module> Strategy<M> {
    pub fn single(model: M) -> Self {
        Strategy::Single(model)
    }

    /// The model itself (`ddp.module`): for evaluation, saving and the optimizer's parameters.
    pub fn module(&self) -> &M {
        match self {
            Strategy::Single(m) => m,
        }
    }

    /// Runs `f` (forward and loss) on the model; under DDP through the wrapper, so its
    /// buffers are broadcast and its gradient hooks armed.
    pub fn forward(&self, f: impl FnOnce(&M) -> Var) -> Var {
        match self {
            Strategy::Single(m) => f(m),
        }
    }

    /// Runs `f` (a backward of an accumulation step that is not the last) with the gradients
    /// kept local: no all-reduce until the last micro-batch (`ddp.no_sync()`).
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Strategy::Single(_) => f(),
        }
    }

    pub fn rank(&self) -> usize {
        match self {
            Strategy::Single(_) => 0,
        }
    }

    pub fn world_size(&self) -> usize {
        match self {
            Strategy::Single(_) => 1,
        }
    }

    /// The sum over ranks of each value (eval counts, loss sums), in f64.
    pub fn sum(&self, values: &[f64]) -> Result<Vec<f64>, String> {
        match self {
            Strategy::Single(_) => Ok(values.to_vec()),
        }
    }

    /// Waits until every rank gets here.
    pub fn barrier(&self) -> Result<(), String> {
        match self {
            Strategy::Single(_) => Ok(()),
        }
    }

    /// Which strategy, for the start-up line.
    pub fn describe(&self) -> String {
        match self {
            Strategy::Single(_) => "single process".into(),
        }
    }
}
