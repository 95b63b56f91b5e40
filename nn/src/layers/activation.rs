//! Activation modules: `ReLU`, `GELU` (exact or tanh), `SiLU`. They own nothing.

use crate::{Forward, Module, Visitor};
use oxtrain_autograd::Var;

/// `max(x, 0)` (`nn.ReLU`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReLU;

impl Module for ReLU {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for ReLU {
    fn forward(&self, x: &Var) -> Var {
        x.relu()
    }
}

/// Which formula [`GELU`] uses (`approximate='none'` or `'tanh'`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// `x * Phi(x)` with the exact normal CDF.
    #[default]
    None,
    /// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))` (GPT-2's).
    Tanh,
}

/// The Gaussian error linear unit (`nn.GELU`).
#[allow(clippy::upper_case_acronyms)] // PyTorch's name, which users search for
#[derive(Debug, Clone, Copy, Default)]
pub struct GELU {
    pub approximate: GeluApproximate,
}

impl GELU {
    /// The exact GELU.
    pub fn new() -> GELU {
        GELU::default()
    }

    /// The tanh approximation.
    pub fn tanh() -> GELU {
        GELU { approximate: GeluApproximate::Tanh }
    }
}

impl Module for GELU {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for GELU {
    fn forward(&self, x: &Var) -> Var {
        match self.approximate {
            GeluApproximate::None => x.gelu(),
            GeluApproximate::Tanh => x.gelu_tanh(),
        }
    }
}

/// `x * sigmoid(x)` (`nn.SiLU`, also called swish).
#[derive(Debug, Clone, Copy, Default)]
pub struct SiLU;

impl Module for SiLU {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for SiLU {
    fn forward(&self, x: &Var) -> Var {
        x.silu()
    }
}
