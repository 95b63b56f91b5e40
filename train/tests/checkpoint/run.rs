//! A small training run that the checkpoint tests stop, kill and resume: an MLP with dropout,
//! SGD with momentum and a step schedule, a shuffling loader whose samples get random noise
//! (augmentation), so every piece of state a checkpoint holds changes the losses.

use oxtrain::checkpoint::{Checkpoint, CheckpointConfig, Checkpointer, ProgressFn};
use oxtrain_autograd::Var;
use oxtrain_datasets::{DataLoader, Dataset, DistributedSampler, LoaderConfig, PinMemory, Sample, SampleRng};
use oxtrain_nn::loss::cross_entropy;
use oxtrain_nn::lr_scheduler::{LrScheduler, StepLR};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{Dropout, Forward, Linear, Module, ReLU, Sequential};
use oxtrain_tensor::{manual_seed, DType, Device};
use std::path::Path;

pub const STEPS: u64 = 10;
const FEATURES: usize = 8;
const CLASSES: usize = 3;
const SAMPLES: usize = 24;
const BATCH: usize = 4;

/// Features from the index plus uniform noise from the sample's stream; label index % 3.
struct NoisyPoints;

impl Dataset for NoisyPoints {
    fn len(&self) -> usize {
        SAMPLES
    }

    fn sample(&self) -> Sample {
        Sample { shape: vec![FEATURES], dtype: DType::F32 }
    }

    fn load_into(&self, index: usize, rng: &mut SampleRng, out: &mut [u8]) -> oxtrain_datasets::Result<i64> {
        for (j, chunk) in out.chunks_exact_mut(4).enumerate() {
            let base = (((index * 7 + j * 3) % 11) as f32 - 5.0) / 5.0;
            let noise = (rng.next_f64() as f32 - 0.5) * 0.2;
            chunk.copy_from_slice(&(base + noise).to_ne_bytes());
        }
        Ok((index % CLASSES) as i64)
    }
}

/// What a run did: the loss of every step it took (as bits) and the final weights.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    pub first_step: u64,
    pub losses: Vec<u32>,
    pub weights: Vec<u32>,
}

impl Outcome {
    pub fn print(&self) {
        println!("OUTCOME {} {:?} {:?}", self.first_step, self.losses, self.weights);
    }

    /// Parses what `print` wrote into a child's stdout.
    pub fn parse(stdout: &str) -> Option<Outcome> {
        let line = stdout.lines().find_map(|l| l.strip_prefix("OUTCOME "))?;
        let (first, rest) = line.split_once(' ')?;
        let (losses, weights) = rest.split_once("] ")?;
        let list = |s: &str| -> Vec<u32> {
            s.trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .filter(|x| !x.is_empty())
                .map(|x| x.parse().unwrap())
                .collect()
        };
        Some(Outcome { first_step: first.parse().ok()?, losses: list(losses), weights: list(weights) })
    }
}

/// How a run saves and when it stops.
pub struct Plan<'a> {
    pub dir: &'a Path,
    /// Save (and wait for the write) after these steps.
    pub save_at: &'a [u64],
    /// SIGKILL this process right after the save at this step is on disk.
    pub die_after_save: Option<u64>,
    /// Save at this step with a progress hook that SIGKILLs the process mid-write.
    pub die_inside_save: Option<(u64, u64)>,
    pub resume: bool,
}

pub fn sigkill_self() -> ! {
    // SAFETY: sends a signal to this process; nothing to clean up, that is the point.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL ends the process")
}

pub fn train(plan: &Plan<'_>) -> Outcome {
    manual_seed(1234);
    let model = Sequential::new()
        .append(Linear::new(FEATURES, 16, Device::Cpu).unwrap())
        .append(ReLU)
        .append(Dropout::new(0.25))
        .append(Linear::new(16, CLASSES, Device::Cpu).unwrap());
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.2, momentum: 0.9, ..Default::default() });
    let mut sched = StepLR::step_lr(&mut opt, 4, 0.5);
    let sampler = DistributedSampler::single(SAMPLES).seed(5);
    let config =
        LoaderConfig { batch_size: BATCH, seed: 9, pin_memory: PinMemory::Off, ..Default::default() };
    let loader = DataLoader::new(NoisyPoints, sampler, config).unwrap();

    let (mut step, mut epoch) = (0u64, 0u64);
    if plan.resume {
        let found = oxtrain::checkpoint::latest_valid(plan.dir).unwrap();
        eprintln!("{found}");
        let c = Checkpoint::load(found.path().expect("a valid checkpoint"), 0, 1).unwrap();
        c.restore_model(&model).unwrap();
        c.restore_optimizer(&mut opt).unwrap();
        c.restore_scheduler(&mut sched).unwrap();
        c.restore_rng();
        loader.load_state_dict(c.sampler().unwrap()).unwrap();
        (step, epoch) = (c.step(), c.epoch());
    }
    let mut out = Outcome { first_step: step, ..Default::default() };
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(plan.dir)).unwrap();
    'run: loop {
        for batch in loader.epoch(epoch) {
            let (x, y) = batch.unwrap().to(Device::Cpu).unwrap();
            let loss = cross_entropy(&model.forward(&Var::constant(x)), &y);
            opt.zero_grad();
            loss.backward();
            opt.step();
            sched.step(&mut opt);
            step += 1;
            out.losses.push(loss.tensor().to_scalar::<f32>().to_bits());
            if plan.save_at.contains(&step) || plan.die_inside_save.is_some_and(|(s, _)| s == step) {
                let snap =
                    ckpt.snapshot(step, epoch).unwrap().model(&model).unwrap().optimizer(&opt).unwrap();
                let snap = snap.scheduler(&sched).sampler(loader.state_dict());
                if let Some((_, at_byte)) = plan.die_inside_save.filter(|(s, _)| *s == step) {
                    out.print();
                    let hook: ProgressFn = std::sync::Arc::new(move |p| {
                        if p.written >= at_byte {
                            eprintln!("killing the process at byte {} of the write ({})", p.written, p.file);
                            sigkill_self();
                        }
                    });
                    let config =
                        CheckpointConfig { on_progress: Some(hook), ..CheckpointConfig::new(plan.dir) };
                    let mut dying = Checkpointer::new(config).unwrap();
                    dying.save(snap).unwrap();
                    dying.wait().unwrap();
                    println!("WRITE COMPLETED");
                    std::process::exit(1);
                }
                ckpt.save(snap).unwrap();
                ckpt.wait().unwrap();
                if plan.die_after_save == Some(step) {
                    out.print();
                    sigkill_self();
                }
            }
            if step == STEPS {
                break 'run;
            }
        }
        epoch += 1;
    }
    ckpt.finish().unwrap();
    out.weights =
        model.state_dict().into_iter().flat_map(|(_, t)| t.to_vec::<f32>()).map(f32::to_bits).collect();
    out
}
