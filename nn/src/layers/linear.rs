//! `Linear` (`nn.Linear`): `y = x W^T + b` over the last dim.

use crate::init;
use crate::lora::{LoraHost, LoraSlot};
use crate::{Forward, Module, Parameter, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Result, Tensor};

/// Options of [`Linear`] beyond its sizes; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearConfig {
    pub bias: bool,
    pub dtype: DType,
}

impl Default for LinearConfig {
    fn default() -> Self {
        LinearConfig { bias: true, dtype: DType::F32 }
    }
}

/// A fully connected layer: weight `[out_features, in_features]`, bias `[out_features]`,
/// initialised as PyTorch does (U(-1/sqrt(in), 1/sqrt(in)) for both).
#[derive(Debug)]
pub struct Linear {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    /// A LoRA adapter once [`LoraModel`](crate::lora::LoraModel) adds one (not in the state dict).
    pub lora: LoraSlot,
}

impl Linear {
    /// A layer with a bias, in f32.
    pub fn new(in_features: usize, out_features: usize, device: Device) -> Result<Linear> {
        Linear::with_config(in_features, out_features, LinearConfig::default(), device)
    }

    pub fn with_config(
        in_features: usize,
        out_features: usize,
        config: LinearConfig,
        device: Device,
    ) -> Result<Linear> {
        let weight = Tensor::zeros([out_features, in_features], config.dtype, device)?;
        init::default_weight_(&weight, None);
        let bias = if config.bias {
            let b = Tensor::zeros(out_features, config.dtype, device)?;
            init::default_bias_(&b, weight.dims(), None);
            Some(Parameter::new(b))
        } else {
            None
        };
        Ok(Linear { weight: Parameter::new(weight), bias, lora: LoraSlot::default() })
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Module for Linear {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }

    fn training_flag(&self) -> Option<&crate::TrainingFlag> {
        self.lora.training_flag()
    }

    fn lora_host(&self) -> Option<LoraHost<'_>> {
        Some(LoraHost { weight: &self.weight, slot: &self.lora, fan_in_fan_out: false })
    }
}

impl Forward for Linear {
    /// `x` is `[..., in_features]`; the result `[..., out_features]`.
    fn forward(&self, x: &Var) -> Var {
        let y =
            crate::functional::linear(x, &self.weight.var(), self.bias.as_ref().map(Parameter::var).as_ref());
        self.lora.add_to(x, y)
    }
}
