//! The built-in example: a small CNN learns to tell four drawn shapes apart (`shapes.rs`),
//! with AdamW, a warmup-then-cosine schedule, optional bf16 autocast, and a progress bar.
//! `oxtrain train` runs it until the configurable trainer takes over; CI runs it on the CPU
//! and checks the accuracy.

pub mod shapes;

use oxtrain_autograd::{autocast, no_grad, Var};
use oxtrain_nn::loss::cross_entropy;
use oxtrain_nn::lr_scheduler::{CosineAnnealingLR, LinearLR, LrScheduler, SequentialLR};
use oxtrain_nn::optim::{decay_groups, AdamW, AdamWConfig, Optimizer};
use oxtrain_nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Forward, Linear, MaxPool2d, Module, ReLU,
    Sequential,
};
use oxtrain_tensor::{DType, Device, Generator, Result, Tensor};
use std::time::Instant;

/// How the example computes: in f32, or with bf16 autocast (f32 master weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    Bf16,
}

/// The example's settings; `Default` is what `oxtrain train` runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub device: Device,
    pub precision: Precision,
    pub epochs: usize,
    pub batch_size: usize,
    pub train_size: usize,
    pub test_size: usize,
    pub image_size: usize,
    pub lr: f64,
    pub seed: u64,
    /// Draw a progress bar on stderr (off in tests).
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            device: Device::Cpu,
            precision: Precision::F32,
            epochs: 4,
            batch_size: 64,
            train_size: 4096,
            test_size: 1024,
            image_size: 16,
            lr: 4e-3,
            seed: 0,
            progress: true,
        }
    }
}

/// What a run reached.
#[derive(Clone, Debug)]
pub struct Report {
    /// Mean training loss over the last epoch.
    pub final_loss: f64,
    /// Fraction of the held-out images classified right.
    pub test_accuracy: f64,
    pub seconds: f64,
    pub images_per_second: f64,
}

fn conv(cin: usize, cout: usize, device: Device) -> Result<Conv2d> {
    let config = Conv2dConfig { padding: [1, 1], bias: false, ..Default::default() };
    Conv2d::with_config(cin, cout, [3, 3], config, device)
}

/// conv-bn-relu-pool twice, one more conv, global average pooling and a linear classifier.
pub fn model(device: Device) -> Result<Sequential> {
    Ok(Sequential::new()
        .append(conv(1, 16, device)?)
        .append(BatchNorm2d::new(16, device)?)
        .append(ReLU)
        .append(MaxPool2d::new([2, 2]))
        .append(conv(16, 32, device)?)
        .append(BatchNorm2d::new(32, device)?)
        .append(ReLU)
        .append(MaxPool2d::new([2, 2]))
        .append(conv(32, 32, device)?)
        .append(ReLU)
        .append(AdaptiveAvgPool2d::new([1, 1]))
        .append(Flatten::new())
        .append(Linear::new(32, shapes::CLASSES, device)?))
}

/// The fraction of `data` the model classifies right (eval mode, no graph).
pub fn accuracy(model: &Sequential, data: &shapes::Shapes, precision: Precision) -> f64 {
    model.eval();
    let logits = no_grad(|| {
        let x = Var::constant(data.images.clone());
        match precision {
            Precision::F32 => model.forward(&x),
            Precision::Bf16 => autocast(DType::BF16, || model.forward(&x)),
        }
    });
    model.train(true);
    let predicted = logits.tensor().argmax(1, false);
    let right = predicted.eq(&data.labels).to_dtype(DType::F32).sum_all().item();
    right / data.labels.elem_count() as f64
}

/// Trains the example from scratch and evaluates it on held-out images.
pub fn run(opts: &Options) -> Result<Report> {
    oxtrain_tensor::manual_seed(opts.seed);
    let train = shapes::make(opts.train_size, opts.image_size, opts.seed, opts.device)?;
    let test = shapes::make(opts.test_size, opts.image_size, opts.seed + 1, opts.device)?;
    let net = model(opts.device)?;
    let mut opt = AdamW::new(
        decay_groups(net.named_parameters(), 1e-4),
        AdamWConfig { lr: opts.lr, ..Default::default() },
    );
    let steps_per_epoch = opts.train_size / opts.batch_size;
    let total = (steps_per_epoch * opts.epochs) as i64;
    let warmup = (total / 10).max(1);
    let mut schedule = {
        let w = LinearLR::linear(&mut opt, 0.1, 1.0, warmup);
        let c = CosineAnnealingLR::cosine(&mut opt, total - warmup, 0.0);
        SequentialLR::new(&mut opt, vec![Box::new(w), Box::new(c)], &[warmup])
    };
    let bar = progress_bar(opts, total as u64);
    let mut gen = Generator::new(opts.seed ^ 0x5eed);
    let start = Instant::now();
    let mut final_loss = f64::NAN;
    for epoch in 0..opts.epochs {
        let order = Tensor::randperm_with(&mut gen, opts.train_size, opts.device)?;
        let mut epoch_loss = Vec::with_capacity(steps_per_epoch);
        for step in 0..steps_per_epoch {
            let idx = order.narrow(0, step * opts.batch_size, opts.batch_size);
            let x = Var::constant(train.images.index_select(0, &idx));
            let y = train.labels.index_select(0, &idx);
            let loss = match opts.precision {
                Precision::F32 => cross_entropy(&net.forward(&x), &y),
                Precision::Bf16 => autocast(DType::BF16, || cross_entropy(&net.forward(&x), &y)),
            };
            opt.zero_grad();
            loss.backward();
            opt.step();
            schedule.step(&mut opt);
            // Kept on the device; read once per epoch so steps do not wait for the GPU.
            epoch_loss.push(loss.tensor().to_dtype(DType::F32));
            if let Some(bar) = &bar {
                bar.inc(1);
            }
        }
        final_loss = Tensor::stack(&epoch_loss, 0).mean_all().item();
        if let Some(bar) = &bar {
            bar.set_message(format!("epoch {} loss {final_loss:.4}", epoch + 1));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if let Some(bar) = bar {
        bar.finish();
    }
    let test_accuracy = accuracy(&net, &test, opts.precision);
    Ok(Report {
        final_loss,
        test_accuracy,
        seconds,
        images_per_second: (steps_per_epoch * opts.batch_size * opts.epochs) as f64 / seconds,
    })
}

fn progress_bar(opts: &Options, steps: u64) -> Option<indicatif::ProgressBar> {
    opts.progress.then(|| {
        let bar = indicatif::ProgressBar::new(steps);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar
    })
}
