//! Normalisation layers: `BatchNorm2d` (running statistics as buffers, updated in place) and
//! `LayerNorm`.

use crate::{Buffer, Forward, Module, Parameter, TrainingFlag, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Result, Tensor};
use std::sync::{Arc, PoisonError, RwLock};

/// Batch statistics over the batches of several replicas: what turns a [`BatchNorm2d`] into a
/// synchronised one (PyTorch's `SyncBatchNorm`). nn only defines the seam; `oxtrain-comm`'s
/// DDP implements it over a communicator (`convert_sync_batchnorm`).
pub trait CrossReplicaNorm: Send + Sync {
    /// Training-mode batch norm of `x` (`[N, C, H, W]`) normalised with the mean and biased
    /// variance over every replica's batch, differentiable (its backward reduces the
    /// gradient's statistics across replicas too). Returns the output, the global per-channel
    /// mean and biased variance, and the number of values per channel over all replicas.
    fn batch_norm_training(
        &self,
        x: &Var,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Tensor, Tensor, usize);
}

/// Where a [`CrossReplicaNorm`] is plugged into a batch norm (empty: local statistics).
#[derive(Default)]
struct CrossReplicaSlot(RwLock<Option<Arc<dyn CrossReplicaNorm>>>);

impl std::fmt::Debug for CrossReplicaSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.read().unwrap_or_else(PoisonError::into_inner).is_some();
        f.write_str(if set { "cross-replica" } else { "local" })
    }
}

/// Options of [`BatchNorm2d`]; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormConfig {
    pub eps: f64,
    /// Weight of the newest batch in the running statistics; `None` averages all batches so
    /// far equally (a cumulative moving average).
    pub momentum: Option<f64>,
    /// Learnable per-channel `weight` (ones) and `bias` (zeros).
    pub affine: bool,
    /// Keep `running_mean`, `running_var` and `num_batches_tracked` and use them in eval mode;
    /// without, batch statistics are used in both modes.
    pub track_running_stats: bool,
    pub dtype: DType,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        BatchNormConfig {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
            dtype: DType::F32,
        }
    }
}

/// The running statistics of a batch norm.
#[derive(Debug)]
pub struct RunningStats {
    pub mean: Buffer,
    pub var: Buffer,
    /// int64, as PyTorch keeps it.
    pub num_batches_tracked: Buffer,
}

/// Batch normalisation over the channels (dim 1) of `[N, C, H, W]` (`nn.BatchNorm2d`). In
/// training it normalises with the batch's mean and biased variance and updates the running
/// mean and the unbiased running variance in place; in eval it uses the running statistics.
#[derive(Debug)]
pub struct BatchNorm2d {
    pub weight: Option<Parameter>,
    pub bias: Option<Parameter>,
    pub running: Option<RunningStats>,
    pub config: BatchNormConfig,
    training: TrainingFlag,
    statistics: CrossReplicaSlot,
}

impl BatchNorm2d {
    pub fn new(num_features: usize, device: Device) -> Result<BatchNorm2d> {
        BatchNorm2d::with_config(num_features, BatchNormConfig::default(), device)
    }

    pub fn with_config(num_features: usize, config: BatchNormConfig, device: Device) -> Result<BatchNorm2d> {
        let (c, dtype) = (num_features, config.dtype);
        let (weight, bias) = if config.affine {
            (
                Some(Parameter::new(Tensor::ones(c, dtype, device)?)),
                Some(Parameter::new(Tensor::zeros(c, dtype, device)?)),
            )
        } else {
            (None, None)
        };
        let running = if config.track_running_stats {
            Some(RunningStats {
                mean: Buffer::new(Tensor::zeros(c, dtype, device)?),
                var: Buffer::new(Tensor::ones(c, dtype, device)?),
                num_batches_tracked: Buffer::new(Tensor::zeros((), DType::I64, device)?),
            })
        } else {
            None
        };
        Ok(BatchNorm2d {
            weight,
            bias,
            running,
            config,
            training: TrainingFlag::default(),
            statistics: CrossReplicaSlot::default(),
        })
    }

    /// Computes training statistics with `sync` (over several replicas) instead of over the
    /// local batch alone; `None` goes back to local statistics. Evaluation mode is unchanged
    /// (it uses the running statistics).
    pub fn set_cross_replica(&self, sync: Option<Arc<dyn CrossReplicaNorm>>) {
        *self.statistics.0.write().unwrap_or_else(PoisonError::into_inner) = sync;
    }

    /// Whether training statistics are computed across replicas.
    pub fn is_cross_replica(&self) -> bool {
        self.statistics.0.read().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// `running = (1 - f) * running + f * batch`, with the unbiased batch variance (one launch
    /// on CUDA, counter included, when the momentum is set).
    fn update_running_stats(&self, stats: &RunningStats, mean: &Tensor, var: &Tensor, per_channel: usize) {
        let count = stats.num_batches_tracked.tensor();
        let running = (&stats.mean.tensor(), &stats.var.tensor());
        let unbiased = per_channel as f64 / (per_channel - 1) as f64;
        match self.config.momentum {
            Some(m) => Tensor::update_running_stats_(running, Some(&count), (mean, var), m, unbiased),
            None => {
                // The cumulative average needs the new count on the host first.
                count.add_scalar_(1.0);
                Tensor::update_running_stats_(running, None, (mean, var), 1.0 / count.item(), unbiased)
            }
        }
    }
}

impl Module for BatchNorm2d {
    fn visit(&self, v: &mut dyn Visitor) {
        if let Some(w) = &self.weight {
            v.param("weight", w);
        }
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
        if let Some(r) = &self.running {
            v.buffer("running_mean", &r.mean);
            v.buffer("running_var", &r.var);
            v.buffer("num_batches_tracked", &r.num_batches_tracked);
        }
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }

    fn as_batch_norm(&self) -> Option<&BatchNorm2d> {
        Some(self)
    }
}

impl BatchNorm2d {
    /// `relu(self.forward(x))`, the pattern of every ResNet block: in training with local
    /// statistics one fused op (`Var::batch_norm_relu_training`), otherwise the two ops.
    pub fn forward_relu(&self, x: &Var) -> Var {
        self.forward_then(x, true, None)
    }

    /// `relu(self.forward(x) + residual)`, the end of a ResNet bottleneck: in training with
    /// local statistics one fused op (`Var::batch_norm_add_relu_training`), otherwise the
    /// three ops.
    pub fn forward_add_relu(&self, x: &Var, residual: &Var) -> Var {
        self.forward_then(x, true, Some(residual))
    }

    fn forward_then(&self, x: &Var, relu: bool, residual: Option<&Var>) -> Var {
        assert_eq!(x.rank(), 4, "BatchNorm2d: expected a 4-D input [N, C, H, W], got shape {:?}", x.dims());
        let (weight, bias) =
            (self.weight.as_ref().map(Parameter::var), self.bias.as_ref().map(Parameter::var));
        let eps = self.config.eps;
        let then_relu = |y: Var| {
            let y = match residual {
                Some(r) => y.add(r),
                None => y,
            };
            if relu {
                y.relu()
            } else {
                y
            }
        };
        match (&self.running, self.training.get()) {
            (Some(stats), false) => then_relu(x.batch_norm_eval(
                &stats.mean.tensor(),
                &stats.var.tensor(),
                weight.as_ref(),
                bias.as_ref(),
                eps,
            )),
            (running, training) => {
                let sync = self.statistics.0.read().unwrap_or_else(PoisonError::into_inner).clone();
                let (out, mean, var, per_channel) = match &sync {
                    Some(sync) => {
                        let (out, mean, var, n) =
                            sync.batch_norm_training(x, weight.as_ref(), bias.as_ref(), eps);
                        (then_relu(out), mean, var, n)
                    }
                    None => {
                        let per_channel = x.elem_count() / x.dims()[1];
                        let (out, mean, var) = if let Some(r) = residual {
                            x.batch_norm_add_relu_training(weight.as_ref(), bias.as_ref(), r, eps)
                        } else if relu {
                            x.batch_norm_relu_training(weight.as_ref(), bias.as_ref(), eps)
                        } else {
                            x.batch_norm_training(weight.as_ref(), bias.as_ref(), eps)
                        };
                        (out, mean, var, per_channel)
                    }
                };
                assert!(
                    per_channel > 1 || !training,
                    "BatchNorm2d: expected more than 1 value per channel when training, got input of shape {:?}",
                    x.dims()
                );
                // A checkpointed forward rerun in backward has updated them already.
                if let (Some(stats), true, false) = (running, training, oxtrain_autograd::is_recomputing()) {
                    self.update_running_stats(stats, &mean, &var, per_channel);
                }
                out
            }
        }
    }
}

impl Forward for BatchNorm2d {
    fn forward(&self, x: &Var) -> Var {
        self.forward_then(x, false, None)
    }
}

/// Options of [`LayerNorm`]; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormConfig {
    pub eps: f64,
    /// Learnable `weight` (ones) and, with `bias`, `bias` (zeros), of the normalised shape.
    pub elementwise_affine: bool,
    pub bias: bool,
    pub dtype: DType,
}

impl Default for LayerNormConfig {
    fn default() -> Self {
        LayerNormConfig { eps: 1e-5, elementwise_affine: true, bias: true, dtype: DType::F32 }
    }
}

/// Layer normalisation over the trailing `normalized_shape` dims (`nn.LayerNorm`).
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Option<Parameter>,
    pub bias: Option<Parameter>,
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(normalized_shape: impl Into<Vec<usize>>, device: Device) -> Result<LayerNorm> {
        LayerNorm::with_config(normalized_shape, LayerNormConfig::default(), device)
    }

    pub fn with_config(
        normalized_shape: impl Into<Vec<usize>>,
        config: LayerNormConfig,
        device: Device,
    ) -> Result<LayerNorm> {
        let shape = normalized_shape.into();
        let affine = config.elementwise_affine;
        let weight = if affine {
            Some(Parameter::new(Tensor::ones(shape.as_slice(), config.dtype, device)?))
        } else {
            None
        };
        let bias = if affine && config.bias {
            Some(Parameter::new(Tensor::zeros(shape.as_slice(), config.dtype, device)?))
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, normalized_shape: shape, eps: config.eps })
    }

    fn params(&self) -> (Option<Var>, Option<Var>) {
        (self.weight.as_ref().map(Parameter::var), self.bias.as_ref().map(Parameter::var))
    }

    /// `self.forward(x).autocast_lower()` in one pass: under autocast the norm computes in f32
    /// and writes the 16-bit dtype the matrix product after it wants (see
    /// [`Var::layer_norm_lowered`]); otherwise `forward`.
    pub fn forward_lowered(&self, x: &Var) -> Var {
        let (weight, bias) = self.params();
        x.layer_norm_lowered(self.normalized_shape.as_slice(), weight.as_ref(), bias.as_ref(), self.eps)
    }

    /// `(x + y, self.forward(x + y))` as one op (see [`Var::add_layer_norm`]): a residual add
    /// followed by this norm, one pass forward and one backward.
    pub fn forward_add(&self, x: &Var, y: &Var) -> (Var, Var) {
        let (weight, bias) = self.params();
        x.add_layer_norm(y, self.normalized_shape.as_slice(), weight.as_ref(), bias.as_ref(), self.eps)
    }

    /// [`LayerNorm::forward_add`] whose normalised output is [`LayerNorm::forward_lowered`]'s.
    pub fn forward_add_lowered(&self, x: &Var, y: &Var) -> (Var, Var) {
        let (weight, bias) = self.params();
        x.add_layer_norm_lowered(
            y,
            self.normalized_shape.as_slice(),
            weight.as_ref(),
            bias.as_ref(),
            self.eps,
        )
    }
}

impl Module for LayerNorm {
    fn visit(&self, v: &mut dyn Visitor) {
        if let Some(w) = &self.weight {
            v.param("weight", w);
        }
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

impl Forward for LayerNorm {
    fn forward(&self, x: &Var) -> Var {
        let (weight, bias) = self.params();
        x.layer_norm(self.normalized_shape.as_slice(), weight.as_ref(), bias.as_ref(), self.eps)
    }
}
