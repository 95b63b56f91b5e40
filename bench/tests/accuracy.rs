//! Accuracy is part of speed: f32 training must stay as close to an f64 run as PyTorch's f32
//! stays to PyTorch's f64 (issue 19's acceptance), within a factor of 2. The yardsticks come
//! from `accuracy_fixtures.py` (torch f32 against torch f64 on the same cases); oxtrain's f64
//! runs are its own (every optimizer trains f64 parameters).

use oxtrain_autograd::Var;
use oxtrain_models::{ResNet, ResNetConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};

fn fixture() -> serde_json::Value {
    serde_json::from_str(include_str!("accuracy_fixtures.json")).expect("accuracy_fixtures.json")
}

/// An f64 model and an f32 copy of its weights.
fn pair(config: ResNetConfig) -> (ResNet, ResNet) {
    let m64 = ResNet::new(&ResNetConfig { dtype: DType::F64, ..config.clone() }, Device::Cpu).unwrap();
    let m32 = ResNet::new(&ResNetConfig { dtype: DType::F32, ..config }, Device::Cpu).unwrap();
    for (a, b) in m32.parameters().iter().zip(m64.parameters()) {
        a.tensor().copy_(&b.tensor().to_dtype(DType::F32));
    }
    m32.train(true);
    m64.train(true);
    (m32, m64)
}

/// A batch of 2 64x64 images (f64) and labels.
fn batch(seed: u64) -> (Tensor, Tensor) {
    let mut gen = Generator::new(seed);
    let x =
        Distribution::STANDARD_NORMAL.sample_with(&mut gen, [2, 3, 64, 64], DType::F64, Device::Cpu).unwrap();
    let y = Tensor::randint_with(&mut gen, 0, 1000, [2], Device::Cpu).unwrap();
    (x, y)
}

fn relative_distance(a: &[Tensor], b: &[Tensor]) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for (a, b) in a.iter().zip(b) {
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        diff += a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>();
        norm += b.iter().map(|y| y * y).sum::<f64>();
    }
    (diff / norm).sqrt()
}

fn loss(model: &ResNet, x: &Tensor, y: &Tensor, dtype: DType) -> Var {
    oxtrain_nn::loss::cross_entropy(&model.forward(Var::constant(x.to_dtype(dtype))), y)
}

#[test]
#[ignore = "fails today: after one SGD step oxtrain's f32 run is 9.0e-6 from its f64 run, torch's 5.4e-8 \
            (issue 19 item 3, accurate f32 reductions in the conv gradients, is not done yet)"]
fn resnet18_f32_training_stays_as_close_to_f64_as_torch() {
    let bar = fixture()["resnet18_sgd_relative_distance_per_step"].as_array().unwrap().clone();
    let (m32, m64) = pair(ResNetConfig::resnet18());
    let (x, y) = batch(5);
    let config = SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() };
    let (mut o32, mut o64) = (Sgd::new(m32.parameters(), config), Sgd::new(m64.parameters(), config));
    for (step, bar) in bar.iter().enumerate() {
        for (m, o, dtype) in [(&m32, &mut o32, DType::F32), (&m64, &mut o64, DType::F64)] {
            o.zero_grad();
            loss(m, &x, &y, dtype).backward();
            o.step();
        }
        assert_eq!(m64.parameters()[0].dtype(), DType::F64, "the f64 run trains in f64");
        let params = |m: &ResNet| m.parameters().iter().map(|p| p.tensor().clone()).collect::<Vec<_>>();
        let d = relative_distance(&params(&m32), &params(&m64));
        let bar = bar.as_f64().unwrap();
        assert!(
            d <= 2.0 * bar,
            "step {}: oxtrain's f32 run is {d:.3e} from its f64 run; torch's is {bar:.3e} (allowed 2x)",
            step + 1
        );
    }
}

#[test]
fn resnet50_conv1_weight_gradient_in_f32_is_as_close_to_f64_as_torch() {
    let bar = fixture()["resnet50_conv1_grad_relative_distance"].as_f64().unwrap();
    let (m32, m64) = pair(ResNetConfig::resnet50());
    let (x, y) = batch(6);
    loss(&m32, &x, &y, DType::F32).backward();
    loss(&m64, &x, &y, DType::F64).backward();
    let conv1 = |m: &ResNet| m.parameters()[0].grad().expect("conv1.weight has a gradient");
    assert_eq!(m64.parameters()[0].dims(), [64, 3, 7, 7], "parameters()[0] is conv1.weight");
    let d = relative_distance(&[conv1(&m32)], &[conv1(&m64)]);
    assert!(d <= 2.0 * bar, "conv1 gradient: f32 is {d:.3e} from f64; torch's is {bar:.3e} (allowed 2x)");
}
