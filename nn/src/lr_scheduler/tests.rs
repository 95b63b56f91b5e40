//! Each schedule's learning rates for 30 steps against PyTorch (fixtures.py), bit for bit up
//! to float rounding; state save -> restore -> continue against not stopping.

use super::*;
use crate::optim::{Optimizer, ParamGroupSpec, Sgd, SgdConfig};
use oxtrain_autograd::Var;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::{DType, Device, Tensor};

fn optimizer() -> Sgd {
    let p = || Var::parameter(Tensor::zeros(1, DType::F32, Device::Cpu).unwrap());
    let groups = vec![ParamGroupSpec::new(vec![p()]), ParamGroupSpec::new(vec![p()]).lr(0.01)];
    Sgd::new(groups, SgdConfig { lr: 0.1, ..Default::default() })
}

fn make(name: &str, o: &mut dyn Optimizer) -> Box<dyn LrScheduler> {
    match name {
        "lambda" => Box::new(LambdaLR::lambda(o, |e| 0.95f64.powf(e as f64))),
        "step" => Box::new(StepLR::step_lr(o, 5, 0.5)),
        "multistep" => Box::new(MultiStepLR::multi_step(o, &[3, 7, 7, 12], 0.3)),
        "constant" => Box::new(ConstantLR::constant(o, 1.0 / 3.0, 5)),
        "linear" => Box::new(LinearLR::linear(o, 0.1, 1.0, 8)),
        "linear_decay" => Box::new(LinearLR::linear(o, 1.0, 0.05, 25)),
        "exponential" => Box::new(ExponentialLR::exponential(o, 0.9)),
        "polynomial" => Box::new(PolynomialLR::polynomial(o, 20, 2.0)),
        "cosine" => Box::new(CosineAnnealingLR::cosine(o, 10, 1e-4)),
        "warmup_cosine" => {
            let warmup = Box::new(LinearLR::linear(o, 0.1, 1.0, 5));
            let cosine = Box::new(CosineAnnealingLR::cosine(o, 25, 1e-5));
            Box::new(SequentialLR::new(o, vec![warmup, cosine], &[5]))
        }
        "three_stages" => {
            let a = Box::new(ConstantLR::constant(o, 0.5, 10));
            let b = Box::new(ExponentialLR::exponential(o, 0.8));
            let c = Box::new(StepLR::step_lr(o, 4, 0.5));
            Box::new(SequentialLR::new(o, vec![a, b, c], &[4, 12]))
        }
        "chained" => {
            let a = Box::new(ConstantLR::constant(o, 0.5, 4));
            let b = Box::new(ExponentialLR::exponential(o, 0.9));
            Box::new(ChainedScheduler::new(o, vec![a, b]))
        }
        other => panic!("no schedule {other}"),
    }
}

#[test]
fn every_schedule_matches_torch_for_30_steps() {
    let f = Fixtures::parse(include_str!("fixtures.json"), "nn/src/lr_scheduler/fixtures.json");
    let names: Vec<String> = f.case_names().map(String::from).collect();
    assert_eq!(names.len(), 12);
    for name in &names {
        let want = f.tensor(name, "lrs", Device::Cpu).to_vec2::<f64>();
        let mut opt = optimizer();
        let mut sched = make(name, &mut opt);
        for (s, row) in want.iter().enumerate() {
            if s > 0 {
                opt.step();
                sched.step(&mut opt);
            }
            let got = sched.get_last_lr();
            assert_eq!(got, vec![opt.lr(0), opt.lr(1)], "{name}: last lr is the optimizer's");
            for (g, w) in got.iter().zip(row) {
                assert!((g - w).abs() <= 1e-15 * w.abs(), "{name}: step {s}: lr {g}, torch {w}");
            }
        }
    }
}

#[test]
fn save_restore_continue_gives_the_same_rates() {
    for name in ["warmup_cosine", "cosine", "chained", "multistep"] {
        let mut opt = optimizer();
        let mut sched = make(name, &mut opt);
        for _ in 0..7 {
            sched.step(&mut opt);
        }
        let (opt_state, sched_state) = (opt.state_dict(), sched.state_dict());
        // Round-trip the scheduler state through its JSON text, as a checkpoint would.
        let sched_state: serde_json::Value = serde_json::from_str(&sched_state.to_string()).unwrap();
        let mut opt2 = optimizer();
        let mut sched2 = make(name, &mut opt2);
        opt2.load_state_dict(&opt_state).unwrap();
        sched2.load_state_dict(&sched_state).unwrap();
        for s in 0..15 {
            sched.step(&mut opt);
            sched2.step(&mut opt2);
            assert_eq!(sched.get_last_lr(), sched2.get_last_lr(), "{name}: step {s} after resuming");
        }
    }
}
