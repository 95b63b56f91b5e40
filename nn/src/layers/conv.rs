//! `Conv2d` (`nn.Conv2d`): 2-D convolution over `[N, C, H, W]` with stride, zero padding,
//! dilation and groups.

use crate::init;
use crate::{Forward, Module, Parameter, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Result, Tensor};

/// Options of [`Conv2d`] beyond its channels and kernel size; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv2dConfig {
    pub stride: [usize; 2],
    /// Zeros added on both sides of each spatial dim.
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
    pub bias: bool,
    pub dtype: DType,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            bias: true,
            dtype: DType::F32,
        }
    }
}

/// A 2-D convolution: weight `[out, in / groups, kh, kw]`, bias `[out]`, initialised as
/// PyTorch does (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kh * kw).
#[derive(Debug)]
pub struct Conv2d {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    pub config: Conv2dConfig,
}

impl Conv2d {
    /// A convolution with stride 1, no padding and a bias, in f32.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        device: Device,
    ) -> Result<Conv2d> {
        Conv2d::with_config(in_channels, out_channels, kernel_size, Conv2dConfig::default(), device)
    }

    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        config: Conv2dConfig,
        device: Device,
    ) -> Result<Conv2d> {
        let g = config.groups;
        assert!(
            g > 0 && in_channels.is_multiple_of(g) && out_channels.is_multiple_of(g),
            "Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must both be divisible by groups ({g})"
        );
        let dims = [out_channels, in_channels / g, kernel_size[0], kernel_size[1]];
        let weight = Tensor::zeros(dims, config.dtype, device)?;
        init::default_weight_(&weight, None);
        let bias = if config.bias {
            let b = Tensor::zeros(out_channels, config.dtype, device)?;
            init::default_bias_(&b, &dims, None);
            Some(Parameter::new(b))
        } else {
            None
        };
        Ok(Conv2d { weight: Parameter::new(weight), bias, config })
    }
}

impl Module for Conv2d {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

impl Forward for Conv2d {
    fn forward(&self, x: &Var) -> Var {
        let c = &self.config;
        let bias = self.bias.as_ref().map(Parameter::var);
        x.conv2d(&self.weight.var(), bias.as_ref(), c.stride, c.padding, c.dilation, c.groups)
    }
}
