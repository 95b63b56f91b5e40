//! torchvision's residual blocks: `BasicBlock` (two 3x3 convolutions, ResNet-18/34) and
//! `Bottleneck` (1x1, 3x3, 1x1, ResNet-50 and up; the stride sits on the 3x3 convolution, the
//! "ResNet v1.5" that torchvision ships).

use oxtrain_autograd::{checkpoint, Var};
use oxtrain_nn::init::{self, FanMode, Nonlinearity};
use oxtrain_nn::{BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, Forward, Module, Sequential, Visitor};
use oxtrain_tensor::{DType, Device, Result};
use std::sync::Arc;

/// A bias-free convolution with torchvision's initialisation: `kaiming_normal_(mode="fan_out",
/// nonlinearity="relu")`.
pub(crate) fn conv(
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    groups: usize,
    dtype: DType,
    device: Device,
) -> Result<Conv2d> {
    let config = Conv2dConfig {
        stride: [stride, stride],
        padding: [k / 2, k / 2],
        groups,
        bias: false,
        dtype,
        ..Default::default()
    };
    let c = Conv2d::with_config(cin, cout, [k, k], config, device)?;
    init::kaiming_normal_(&c.weight.tensor(), FanMode::FanOut, Nonlinearity::Relu, None);
    Ok(c)
}

/// Batch norm with weight 1 and bias 0 (`zero` makes the weight 0: `zero_init_residual`).
pub(crate) fn bn(c: usize, zero: bool, dtype: DType, device: Device) -> Result<BatchNorm2d> {
    let b = BatchNorm2d::with_config(c, BatchNormConfig { dtype, ..Default::default() }, device)?;
    if zero {
        if let Some(w) = &b.weight {
            init::zeros_(&w.tensor());
        }
    }
    Ok(b)
}

/// What a block needs to know to build itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSpec {
    pub inplanes: usize,
    pub planes: usize,
    pub stride: usize,
    pub groups: usize,
    pub base_width: usize,
    pub zero_init_residual: bool,
    pub dtype: DType,
}

/// `downsample`: a 1x1 convolution with the block's stride and a batch norm, named
/// `downsample.0` and `downsample.1` as torchvision's `nn.Sequential`.
fn downsample(s: &BlockSpec, out: usize, device: Device) -> Result<Option<Sequential>> {
    if s.stride == 1 && s.inplanes == out {
        return Ok(None);
    }
    Ok(Some(
        Sequential::new()
            .append(conv(s.inplanes, out, 1, s.stride, 1, s.dtype, device)?)
            .append(bn(out, false, s.dtype, device)?),
    ))
}

/// Two 3x3 convolutions; expansion 1.
#[derive(Debug)]
pub struct BasicBlock {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub conv2: Conv2d,
    pub bn2: BatchNorm2d,
    pub downsample: Option<Sequential>,
}

impl BasicBlock {
    pub(crate) fn new(s: &BlockSpec, device: Device) -> Result<BasicBlock> {
        assert!(
            s.groups == 1 && s.base_width == 64,
            "BasicBlock: only groups = 1 and width_per_group = 64 are supported (as in torchvision), got {} and {}",
            s.groups,
            s.base_width
        );
        Ok(BasicBlock {
            conv1: conv(s.inplanes, s.planes, 3, s.stride, 1, s.dtype, device)?,
            bn1: bn(s.planes, false, s.dtype, device)?,
            conv2: conv(s.planes, s.planes, 3, 1, 1, s.dtype, device)?,
            bn2: bn(s.planes, s.zero_init_residual, s.dtype, device)?,
            downsample: downsample(s, s.planes, device)?,
        })
    }
}

impl Module for BasicBlock {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("conv2", &self.conv2);
        v.child("bn2", &self.bn2);
        if let Some(d) = &self.downsample {
            v.child("downsample", d);
        }
    }
}

impl Forward for BasicBlock {
    fn forward(&self, x: &Var) -> Var {
        let out = self.bn1.forward_relu(&self.conv1.forward(x));
        let identity = match &self.downsample {
            Some(d) => d.forward(x),
            None => x.clone(),
        };
        let out = self.conv2.forward(&out);
        self.bn2.forward_add_relu(&out, &identity)
    }
}

/// 1x1 reduce, 3x3 (with the stride and groups), 1x1 expand to `planes * 4`.
#[derive(Debug)]
pub struct Bottleneck {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub conv2: Conv2d,
    pub bn2: BatchNorm2d,
    pub conv3: Conv2d,
    pub bn3: BatchNorm2d,
    pub downsample: Option<Sequential>,
}

impl Bottleneck {
    pub(crate) const EXPANSION: usize = 4;

    pub(crate) fn new(s: &BlockSpec, device: Device) -> Result<Bottleneck> {
        let width = s.planes * s.base_width / 64 * s.groups;
        let out = s.planes * Self::EXPANSION;
        Ok(Bottleneck {
            conv1: conv(s.inplanes, width, 1, 1, 1, s.dtype, device)?,
            bn1: bn(width, false, s.dtype, device)?,
            conv2: conv(width, width, 3, s.stride, s.groups, s.dtype, device)?,
            bn2: bn(width, false, s.dtype, device)?,
            conv3: conv(width, out, 1, 1, 1, s.dtype, device)?,
            bn3: bn(out, s.zero_init_residual, s.dtype, device)?,
            downsample: downsample(s, out, device)?,
        })
    }
}

impl Module for Bottleneck {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("conv2", &self.conv2);
        v.child("bn2", &self.bn2);
        v.child("conv3", &self.conv3);
        v.child("bn3", &self.bn3);
        if let Some(d) = &self.downsample {
            v.child("downsample", d);
        }
    }
}

impl Forward for Bottleneck {
    fn forward(&self, x: &Var) -> Var {
        let out = self.bn1.forward_relu(&self.conv1.forward(x));
        let out = self.bn2.forward_relu(&self.conv2.forward(&out));
        let identity = match &self.downsample {
            Some(d) => d.forward(x),
            None => x.clone(),
        };
        let out = self.conv3.forward(&out);
        self.bn3.forward_add_relu(&out, &identity)
    }
}

/// One block of either kind, so a stage is a plain list.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a few per stage; boxing buys nothing
pub enum Block {
    Basic(BasicBlock),
    Bottleneck(Bottleneck),
}

impl Module for Block {
    fn visit(&self, v: &mut dyn Visitor) {
        match self {
            Block::Basic(b) => b.visit(v),
            Block::Bottleneck(b) => b.visit(v),
        }
    }
}

impl Forward for Block {
    fn forward(&self, x: &Var) -> Var {
        match self {
            Block::Basic(b) => b.forward(x),
            Block::Bottleneck(b) => b.forward(x),
        }
    }
}

/// `layer1` ... `layer4`: blocks named `0`, `1`, ... (torchvision's `nn.Sequential`). Each
/// block sits behind an `Arc`, so a checkpointed stage can keep handles to the blocks it
/// reruns in backward.
#[derive(Debug)]
pub struct Stage(pub Vec<Arc<Block>>);

impl Stage {
    /// The stage under activation checkpointing: it keeps only its input and reruns its
    /// blocks in backward (batch norm's running statistics are updated once, in the first run).
    pub fn forward_checkpointed(&self, x: &Var) -> Var {
        let blocks = self.0.clone();
        checkpoint(move |x| blocks.iter().fold(x.clone(), |x, b| b.forward(&x)), x)
    }
}

impl Module for Stage {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, b) in self.0.iter().enumerate() {
            v.child(&i.to_string(), &**b);
        }
    }
}

impl Forward for Stage {
    fn forward(&self, x: &Var) -> Var {
        self.0.iter().fold(x.clone(), |x, b| b.forward(&x))
    }
}
