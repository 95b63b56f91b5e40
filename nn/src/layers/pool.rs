//! Pooling modules over `[N, C, H, W]`: `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d`.

use crate::{Forward, Module, Visitor};
use oxtrain_autograd::Var;

/// Options of [`MaxPool2d`]; `Default` is PyTorch's (`stride: None` means the kernel size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaxPool2dConfig {
    pub stride: Option<[usize; 2]>,
    /// Implicit `-inf` on both sides of each spatial dim.
    pub padding: [usize; 2],
    pub dilation: Option<[usize; 2]>,
    /// Rounds the output size up instead of down.
    pub ceil_mode: bool,
}

/// The maximum of each window (`nn.MaxPool2d`).
#[derive(Debug, Clone, Copy)]
pub struct MaxPool2d {
    pub kernel_size: [usize; 2],
    pub config: MaxPool2dConfig,
}

impl MaxPool2d {
    /// Non-overlapping windows: stride = kernel size, no padding.
    pub fn new(kernel_size: [usize; 2]) -> MaxPool2d {
        MaxPool2d::with_config(kernel_size, MaxPool2dConfig::default())
    }

    pub fn with_config(kernel_size: [usize; 2], config: MaxPool2dConfig) -> MaxPool2d {
        MaxPool2d { kernel_size, config }
    }
}

impl Module for MaxPool2d {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for MaxPool2d {
    fn forward(&self, x: &Var) -> Var {
        let c = &self.config;
        let stride = c.stride.unwrap_or(self.kernel_size);
        x.max_pool2d(self.kernel_size, stride, c.padding, c.dilation.unwrap_or([1, 1]), c.ceil_mode)
    }
}

/// Options of [`AvgPool2d`]; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2dConfig {
    /// `None`: the kernel size.
    pub stride: Option<[usize; 2]>,
    pub padding: [usize; 2],
    pub ceil_mode: bool,
    /// Whether padded zeros count in the divisor.
    pub count_include_pad: bool,
    /// Divide every window by this instead.
    pub divisor_override: Option<usize>,
}

impl Default for AvgPool2dConfig {
    fn default() -> Self {
        AvgPool2dConfig {
            stride: None,
            padding: [0, 0],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
}

/// The mean of each window (`nn.AvgPool2d`).
#[derive(Debug, Clone, Copy)]
pub struct AvgPool2d {
    pub kernel_size: [usize; 2],
    pub config: AvgPool2dConfig,
}

impl AvgPool2d {
    pub fn new(kernel_size: [usize; 2]) -> AvgPool2d {
        AvgPool2d::with_config(kernel_size, AvgPool2dConfig::default())
    }

    pub fn with_config(kernel_size: [usize; 2], config: AvgPool2dConfig) -> AvgPool2d {
        AvgPool2d { kernel_size, config }
    }
}

impl Module for AvgPool2d {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for AvgPool2d {
    fn forward(&self, x: &Var) -> Var {
        let c = &self.config;
        let stride = c.stride.unwrap_or(self.kernel_size);
        x.avg_pool2d(
            self.kernel_size,
            stride,
            c.padding,
            c.ceil_mode,
            c.count_include_pad,
            c.divisor_override,
        )
    }
}

/// Mean pooling to a fixed output size with PyTorch's adaptive windows
/// (`nn.AdaptiveAvgPool2d`); `[1, 1]` is global average pooling.
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveAvgPool2d {
    pub output_size: [usize; 2],
}

impl AdaptiveAvgPool2d {
    pub fn new(output_size: [usize; 2]) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output_size }
    }
}

impl Module for AdaptiveAvgPool2d {
    fn visit(&self, _: &mut dyn Visitor) {}
}

impl Forward for AdaptiveAvgPool2d {
    fn forward(&self, x: &Var) -> Var {
        x.adaptive_avg_pool2d(self.output_size)
    }
}
