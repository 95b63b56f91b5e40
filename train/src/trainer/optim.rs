//! The optimizer and the learning-rate schedule the config names, built on a model's
//! parameters; the schedule steps once per optimizer step.

use crate::config::{Config, OptimName, ScheduleName};
use crate::runtime::{Strategy, TrainError};
use oxtrain_nn::lr_scheduler::{
    CosineAnnealingLR, LambdaLR, LinearLR, LrScheduler, PolynomialLR, SequentialLR, StepLR,
};
use oxtrain_nn::optim::{
    decay_groups, AdamW, AdamWConfig, Lars, LarsConfig, Optimizer, ParamGroupSpec, Sgd, SgdConfig,
};
use oxtrain_nn::Module;

/// The base learning rate after the batch-size rule (`lr x global_batch / lr_reference_batch`).
pub fn base_lr(config: &Config, world_size: usize) -> f64 {
    let o = &config.optim;
    match o.lr_reference_batch {
        0 => o.lr,
        r => o.lr * (config.data.batch_size * world_size * config.train.grad_accum) as f64 / r as f64,
    }
}

/// The optimizer the config names over the model's trainable parameters; under ZeRO-1
/// (`ddp.shard_optimizer`) sharded over the ranks (collective then).
pub fn build_optimizer<M: Module>(
    config: &Config,
    strategy: &Strategy<M>,
    lr: f64,
) -> Result<Box<dyn Optimizer>, TrainError> {
    let groups = param_groups(config, strategy.module());
    strategy.optimizer(groups, |g| make_optimizer(config, g, lr)).map_err(|e| TrainError::comm("", e))
}

/// The parameter groups: weight decay off for biases and norms where the config says so.
fn param_groups<M: Module>(config: &Config, model: &M) -> Vec<ParamGroupSpec> {
    let o = &config.optim;
    if o.no_decay_bias_and_norm {
        decay_groups(model.trainable_named_parameters(), o.weight_decay)
    } else {
        vec![ParamGroupSpec::new(model.trainable_named_parameters().into_iter().map(|(_, v)| v).collect())
            .weight_decay(o.weight_decay)]
    }
}

fn make_optimizer(config: &Config, groups: Vec<ParamGroupSpec>, lr: f64) -> Box<dyn Optimizer> {
    let o = &config.optim;
    match o.name {
        OptimName::Sgd => Box::new(Sgd::new(
            groups,
            SgdConfig {
                lr,
                momentum: o.momentum,
                nesterov: o.nesterov,
                weight_decay: o.weight_decay,
                ..Default::default()
            },
        )),
        OptimName::Adamw => Box::new(AdamW::new(
            groups,
            AdamWConfig {
                lr,
                betas: (o.beta1, o.beta2),
                eps: o.eps,
                weight_decay: o.weight_decay,
                ..Default::default()
            },
        )),
        OptimName::Lars => Box::new(Lars::new(
            groups,
            LarsConfig {
                lr,
                momentum: o.momentum,
                weight_decay: o.weight_decay,
                trust_coefficient: o.trust_coefficient,
                nesterov: o.nesterov,
                ..Default::default()
            },
        )),
    }
}

/// A warning when the warmup takes the whole run: the schedule then ends at the peak learning
/// rate and never decays, which a short trial run hides unless it is said.
pub fn warmup_warning(config: &Config, total: usize, per_epoch: usize) -> Option<String> {
    let s = &config.schedule;
    let warmup = (s.warmup_epochs * per_epoch as f64).round() as usize;
    (warmup > 0 && warmup >= total).then(|| {
        format!(
            "warning: schedule.warmup_epochs = {} is {warmup} steps, but the run has {total}: it ends at the peak \
             learning rate with no {} decay; lower schedule.warmup_epochs below {:.3} or train longer",
            s.warmup_epochs,
            crate::config::enum_name(&s.name),
            total as f64 / per_epoch as f64
        )
    })
}

/// Warmup then the decay, over `total` optimizer steps of which `per_epoch` make an epoch.
pub fn build_schedule(
    config: &Config,
    opt: &mut dyn Optimizer,
    total: usize,
    per_epoch: usize,
) -> Box<dyn LrScheduler> {
    let s = &config.schedule;
    let total = total.max(1) as i64;
    let warmup = ((s.warmup_epochs * per_epoch as f64).round() as i64).clamp(0, total - 1);
    let rest = (total - warmup).max(1);
    // Built in PyTorch's order (the warmup first), so the first records `initial_lr`.
    let warm = (warmup > 0).then(|| Box::new(LinearLR::linear(opt, s.warmup_start_factor, 1.0, warmup)));
    let main: Box<dyn LrScheduler> = match s.name {
        ScheduleName::Constant => Box::new(LambdaLR::lambda(opt, |_| 1.0)),
        ScheduleName::Cosine => Box::new(CosineAnnealingLR::cosine(opt, rest, s.min_lr)),
        ScheduleName::Step => {
            Box::new(StepLR::step_lr(opt, (s.step_epochs * per_epoch).max(1) as i64, s.gamma))
        }
        ScheduleName::Poly => Box::new(PolynomialLR::polynomial(opt, rest, s.power)),
    };
    match warm {
        None => main,
        Some(warm) => Box::new(SequentialLR::new(opt, vec![warm, main], &[warmup])),
    }
}
