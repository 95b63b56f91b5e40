//! Shape modules that own nothing: `Flatten` and `Identity`.

use crate::{Forward, Module, Visitor};
use oxtrain_autograd::Var;

/// Merges dims `start_dim..=end_dim` into one (`nn.Flatten`, default 1 to -1: everything but
/// the batch dim).
#[derive(Debug, Clone, Copy)]
pub struct Flatten {
    pub start_dim: i64,
    pub end_dim: i64,
}

impl Flatten {
    pub fn new() -> Flatten {
        Flatten::default()
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten { start_dim: 1, end_dim: -1 }
    }
}

impl Module for Flatten {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for Flatten {
    fn forward(&self, x: &Var) -> Var {
        x.flatten(self.start_dim, self.end_dim)
    }
}

/// Returns its input (`nn.Identity`): a placeholder where a layer is optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl Module for Identity {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for Identity {
    fn forward(&self, x: &Var) -> Var {
        x.clone()
    }
}
