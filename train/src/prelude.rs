//! Everything a training script uses, in one `use oxtrain::prelude::*;`: tensors, autograd,
//! the module traits and layers, losses, optimizers and schedules, mixed precision, the models
//! with their configs, datasets and loaders, and the communicator.
//!
//! Left out on purpose, because two crates use the name: `Result` and `Error` (the prelude's
//! are [`oxtrain::Result`](crate::Result) and [`oxtrain::Error`](crate::Error)), the tensor
//! crate's `ReduceOp` (the prelude's is the communicator's), and the two tokenizers (reach
//! them as `models::Tokenizer` and `datasets::Tokenizer`).

pub use crate::{autograd, comm, datasets, models, nn, tensor, Error, Result};

pub use oxtrain_tensor::{manual_seed, DType, Device, Generator, Tensor};

pub use oxtrain_autograd::{autocast, is_grad_enabled, no_grad, Var};

pub use oxtrain_nn::amp::{GradScaler, GradScalerConfig};
pub use oxtrain_nn::loss::{
    binary_cross_entropy_with_logits, cross_entropy, cross_entropy_with, mse_loss, CrossEntropyOptions,
    Reduction,
};
pub use oxtrain_nn::lr_scheduler::{
    ChainedScheduler, ConstantLR, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR, LrScheduler,
    MultiStepLR, PolynomialLR, SequentialLR, StepLR,
};
pub use oxtrain_nn::optim::{
    clip_grad_norm_, clip_grad_value_, decay_groups, AdamW, AdamWConfig, Lars, LarsConfig, Optimizer,
    ParamGroup, Sgd, SgdConfig,
};
pub use oxtrain_nn::{
    init, AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, Dropout,
    Embedding, Flatten, Forward, Identity, LayerNorm, LayerNormConfig, Linear, LinearConfig, MaxPool2d,
    MaxPool2dConfig, Module, ModuleList, MultiheadSelfAttention, Parameter, ReLU, Sequential, SiLU, GELU,
};

pub use oxtrain_models::{
    BertConfig, BertForSequenceClassification, BertModel, Gpt2Config, Gpt2LMHeadModel, Gpt2Model, ResNet,
    ResNetConfig,
};

pub use oxtrain_datasets::{
    Batch, DataLoader, Dataset, DistributedSampler, ImageFolder, ImageTransform, LmDataset, LoaderConfig,
    Sample, TextClassificationDataset,
};

pub use oxtrain_comm::{init_from_env, CommOptions, Communicator, ProcessGroup, ReduceOp};
pub use oxtrain_ddp::{convert_sync_batchnorm, Ddp, DdpConfig, DistributedDataParallel, SyncBatchNorm};
