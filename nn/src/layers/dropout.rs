//! `Dropout` (`nn.Dropout`).

use crate::{Forward, Module, TrainingFlag, Visitor};
use oxtrain_autograd::Var;

/// Zeroes each element with probability `p` in training and scales the rest by `1 / (1 - p)`,
/// so the expected value is unchanged; the identity in eval mode. Masks come from the
/// process-wide generator (`oxtrain_tensor::manual_seed`).
#[derive(Debug)]
pub struct Dropout {
    pub p: f64,
    training: TrainingFlag,
}

impl Dropout {
    pub fn new(p: f64) -> Dropout {
        assert!((0.0..=1.0).contains(&p), "Dropout: p must be a probability in [0, 1], got {p}");
        Dropout { p, training: TrainingFlag::default() }
    }
}

impl Module for Dropout {
    fn visit(&self, _: &mut dyn Visitor) {}

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

impl Forward for Dropout {
    fn forward(&self, x: &Var) -> Var {
        crate::functional::dropout(x, self.p, self.training.get())
    }
}
