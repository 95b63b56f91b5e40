//! ResNet-18/34/50/101/152 as torchvision builds them (`torchvision.models.resnet*`): the same
//! modules under the same names (`conv1.weight`, `layer1.0.downsample.0.weight`, `fc.bias`),
//! the stride on the bottleneck's 3x3 convolution (v1.5) and torchvision's initialisation, so
//! a torchvision `state_dict` saved as safetensors loads with no renaming.

mod block;

pub use block::{BasicBlock, Block, Bottleneck, Stage};

use crate::error::{ModelError, Result};
use crate::loading::read_checkpoint;
use block::{bn, conv, BlockSpec};
use oxtrain_autograd::Var;
use oxtrain_nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Forward, Linear, LinearConfig, MaxPool2d, MaxPool2dConfig,
    Module, Visitor,
};
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Which residual block a ResNet stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3x3 convolutions (ResNet-18/34).
    Basic,
    /// 1x1, 3x3, 1x1 with 4x expansion (ResNet-50/101/152).
    Bottleneck,
}

/// The arguments of torchvision's `ResNet(block, layers, num_classes, zero_init_residual,
/// groups, width_per_group)`, plus the dtype and memory format.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    pub block: BlockKind,
    /// Blocks per stage (`[2, 2, 2, 2]` for ResNet-18).
    pub layers: [usize; 4],
    pub num_classes: usize,
    /// Start the last batch norm of every block at weight 0, so each block begins as the
    /// identity (torchvision's `zero_init_residual`; helps large-batch training).
    pub zero_init_residual: bool,
    /// Convolution groups of the bottleneck's 3x3 (ResNeXt); 1 for plain ResNets.
    pub groups: usize,
    /// Channels per group of the bottleneck (64 for ResNet, 128 for Wide ResNet).
    pub width_per_group: usize,
    /// Hand the stem an NHWC (channels-last) view of the input, as `model.to(memory_format=
    /// torch.channels_last)` does. cuDNN convolves such tensors as they lie; the CPU
    /// convolution accepts them but copies to NCHW first, so on the CPU this only costs time.
    pub channels_last: bool,
    pub dtype: DType,
}

impl ResNetConfig {
    fn new(block: BlockKind, layers: [usize; 4]) -> ResNetConfig {
        ResNetConfig {
            block,
            layers,
            num_classes: 1000,
            zero_init_residual: false,
            groups: 1,
            width_per_group: 64,
            channels_last: false,
            dtype: DType::F32,
        }
    }

    pub fn resnet18() -> ResNetConfig {
        ResNetConfig::new(BlockKind::Basic, [2, 2, 2, 2])
    }

    pub fn resnet34() -> ResNetConfig {
        ResNetConfig::new(BlockKind::Basic, [3, 4, 6, 3])
    }

    pub fn resnet50() -> ResNetConfig {
        ResNetConfig::new(BlockKind::Bottleneck, [3, 4, 6, 3])
    }

    pub fn resnet101() -> ResNetConfig {
        ResNetConfig::new(BlockKind::Bottleneck, [3, 4, 23, 3])
    }

    pub fn resnet152() -> ResNetConfig {
        ResNetConfig::new(BlockKind::Bottleneck, [3, 8, 36, 3])
    }

    /// The same network with another number of output classes.
    pub fn with_num_classes(mut self, num_classes: usize) -> ResNetConfig {
        self.num_classes = num_classes;
        self
    }

    /// Whether the numbers can make a network ([`ResNet::new`] calls it).
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(ModelError::BadConfig { model: "ResNet", reason });
        if self.num_classes == 0 || self.groups == 0 || self.width_per_group == 0 {
            return bad(format!(
                "num_classes ({}), groups ({}) and width_per_group ({}) must be positive",
                self.num_classes, self.groups, self.width_per_group
            ));
        }
        if self.block == BlockKind::Basic && (self.groups != 1 || self.width_per_group != 64) {
            return bad(format!(
                "basic blocks (ResNet-18/34) take groups = 1 and width_per_group = 64 only, as in \
                 torchvision; got {} and {} (grouped and wide shapes need bottleneck blocks)",
                self.groups, self.width_per_group
            ));
        }
        Ok(())
    }

    /// The architecture a torchvision ResNet state dict was saved from: the block kind
    /// (`conv3` in the blocks), blocks per stage, classes (`fc.weight`), and for bottlenecks
    /// the groups and width of the 3x3 convolution (`layer1.0.conv2.weight`).
    pub fn from_state_dict(state: &HashMap<String, Tensor>) -> Result<ResNetConfig> {
        let missing = |name: &str| ModelError::NotResNet { path: None, missing: name.to_string() };
        let dims = |name: &str| state.get(name).map(|t| t.dims().to_vec()).ok_or_else(|| missing(name));
        let fc = dims("fc.weight")?;
        let bottleneck = state.contains_key("layer1.0.conv3.weight");
        let mut layers = [0; 4];
        for (i, n) in layers.iter_mut().enumerate() {
            *n =
                (0..).take_while(|j| state.contains_key(&format!("layer{}.{j}.conv1.weight", i + 1))).count();
            if *n == 0 {
                return Err(missing(&format!("layer{}.0.conv1.weight", i + 1)));
            }
        }
        let block = if bottleneck { BlockKind::Bottleneck } else { BlockKind::Basic };
        let mut config = ResNetConfig::new(block, layers).with_num_classes(fc[0]);
        if bottleneck {
            // layer1's 3x3 has `width_per_group * groups` outputs and `width / groups` inputs.
            let conv2 = dims("layer1.0.conv2.weight")?;
            let (width, per_group) = (conv2[0], conv2[1].max(1));
            config.groups = width / per_group;
            config.width_per_group = width / config.groups.max(1);
        }
        Ok(config)
    }

    fn expansion(&self) -> usize {
        match self.block {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => Bottleneck::EXPANSION,
        }
    }
}

/// torchvision's ResNet: stem (7x7/2 conv, batch norm, ReLU, 3x3/2 max pool), four stages of
/// residual blocks (64, 128, 256, 512 planes; stride 2 from the second on), global average
/// pool and a linear classifier.
#[derive(Debug)]
pub struct ResNet {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub maxpool: MaxPool2d,
    pub layer1: Stage,
    pub layer2: Stage,
    pub layer3: Stage,
    pub layer4: Stage,
    pub avgpool: AdaptiveAvgPool2d,
    pub fc: Linear,
    pub config: ResNetConfig,
    /// Run each stage checkpointed: see [`ResNet::set_activation_checkpointing`].
    activation_checkpointing: bool,
}

impl ResNet {
    /// A freshly initialised network (weights from the global generator; seed it with
    /// `oxtrain_tensor::manual_seed`).
    pub fn new(config: &ResNetConfig, device: Device) -> Result<ResNet> {
        config.check()?;
        let dtype = config.dtype;
        let mut inplanes = 64;
        let mut stage = |planes: usize, blocks: usize, stride: usize| -> oxtrain_tensor::Result<Stage> {
            let mut out = Vec::with_capacity(blocks);
            for i in 0..blocks {
                let spec = BlockSpec {
                    inplanes,
                    planes,
                    stride: if i == 0 { stride } else { 1 },
                    groups: config.groups,
                    base_width: config.width_per_group,
                    zero_init_residual: config.zero_init_residual,
                    dtype,
                };
                out.push(Arc::new(match config.block {
                    BlockKind::Basic => Block::Basic(BasicBlock::new(&spec, device)?),
                    BlockKind::Bottleneck => Block::Bottleneck(Bottleneck::new(&spec, device)?),
                }));
                inplanes = planes * config.expansion();
            }
            Ok(Stage(out))
        };
        let [n1, n2, n3, n4] = config.layers;
        let conv1 = conv(3, 64, 7, 2, 1, dtype, device)?;
        let bn1 = bn(64, false, dtype, device)?;
        let (layer1, layer2, layer3, layer4) =
            (stage(64, n1, 1)?, stage(128, n2, 2)?, stage(256, n3, 2)?, stage(512, n4, 2)?);
        let fc = Linear::with_config(
            512 * config.expansion(),
            config.num_classes,
            LinearConfig { bias: true, dtype },
            device,
        )?;
        Ok(ResNet {
            conv1,
            bn1,
            maxpool: MaxPool2d::with_config(
                [3, 3],
                MaxPool2dConfig { stride: Some([2, 2]), padding: [1, 1], ..Default::default() },
            ),
            layer1,
            layer2,
            layer3,
            layer4,
            avgpool: AdaptiveAvgPool2d::new([1, 1]),
            fc,
            config: config.clone(),
            activation_checkpointing: false,
        })
    }

    /// A network with the weights of a torchvision checkpoint (a `state_dict` saved with
    /// `safetensors.torch.save_file`): `path_or_dir` is the `.safetensors` file or a folder
    /// holding `model.safetensors`; `config` is the architecture, or `None` to read it from the
    /// names and shapes in the file ([`ResNetConfig::from_state_dict`]). The network is built
    /// without random initialisation and filled from the file; every weight must be there
    /// (batch norms' `num_batches_tracked` may be absent, as in torchvision's own files, and
    /// stays 0). Names the network lacks fail too. For partial loads use
    /// [`Module::load_state_dict`] on a network from [`ResNet::new`].
    pub fn from_pretrained(
        path_or_dir: impl AsRef<Path>,
        config: impl Into<Option<ResNetConfig>>,
        device: Device,
    ) -> Result<ResNet> {
        let path = path_or_dir.as_ref();
        let state = read_checkpoint(path)?;
        let config = match config.into() {
            Some(config) => config,
            None => ResNetConfig::from_state_dict(&state).map_err(|e| match e {
                ModelError::NotResNet { missing, .. } => {
                    ModelError::NotResNet { path: Some(path.to_path_buf()), missing }
                }
                other => other,
            })?,
        };
        let model = oxtrain_nn::init::no_init_weights(|| ResNet::new(&config, device))?;
        let counters: Vec<String> = model
            .state_dict()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.ends_with(".num_batches_tracked") && !state.contains_key(n))
            .collect();
        let report = model.load_state_dict(&state, false)?;
        let missing: Vec<String> = report.missing.into_iter().filter(|n| !counters.contains(n)).collect();
        if !missing.is_empty() || !report.unexpected.is_empty() {
            return Err(oxtrain_nn::LoadError::Mismatch {
                missing,
                unexpected: report.unexpected,
                mismatched: vec![],
            }
            .into());
        }
        Ok(model)
    }

    /// Activation checkpointing per stage (`layer1` ... `layer4`): each stage keeps only its
    /// input in training and reruns its blocks in backward ([`Stage::forward_checkpointed`]),
    /// so gradients are those without it, bit for bit.
    pub fn set_activation_checkpointing(&mut self, on: bool) {
        self.activation_checkpointing = on;
    }

    pub fn activation_checkpointing(&self) -> bool {
        self.activation_checkpointing
    }

    /// Images `[N, 3, H, W]` to logits `[N, num_classes]`; the images are a `Tensor` (from a
    /// loader: they get no gradient) or a `Var`, by value or by reference.
    pub fn forward(&self, images: impl Into<Var>) -> Var {
        self.fc.forward(&self.forward_features(images))
    }

    /// Everything up to the pooled features `[N, 512 * expansion]` (the input of `fc`).
    pub fn forward_features(&self, images: impl Into<Var>) -> Var {
        let x: Var = images.into();
        let x = &x;
        assert!(
            x.rank() == 4 && x.dims()[1] == 3,
            "ResNet: expected images [N, 3, H, W], got shape {:?}",
            x.dims()
        );
        let x = if self.config.channels_last { to_channels_last(x) } else { x.clone() };
        let x = self.maxpool.forward(&self.bn1.forward_relu(&self.conv1.forward(&x)));
        let stages = [&self.layer1, &self.layer2, &self.layer3, &self.layer4];
        let x = stages.iter().fold(x, |x, stage| {
            if self.activation_checkpointing {
                stage.forward_checkpointed(&x)
            } else {
                stage.forward(&x)
            }
        });
        self.avgpool.forward(&x).flatten(1, 3)
    }
}

/// The same NCHW tensor stored in NHWC order (`x.contiguous(memory_format=torch.channels_last)`).
pub fn to_channels_last(x: &Var) -> Var {
    x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
}

impl Module for ResNet {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("layer1", &self.layer1);
        v.child("layer2", &self.layer2);
        v.child("layer3", &self.layer3);
        v.child("layer4", &self.layer4);
        v.child("fc", &self.fc);
    }
}

impl Forward for ResNet {
    /// [`ResNet::forward`].
    fn forward(&self, x: &Var) -> Var {
        ResNet::forward(self, x)
    }
}
