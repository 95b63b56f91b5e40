//! A steady training step on CUDA makes the host wait for nothing and asks the driver for no
//! memory: the host can queue the next step while this one runs, and the step could be
//! captured into a CUDA graph. The counters are the backend's own (`cuda::host_waits`, the
//! caching allocator's `driver_allocs`), read around a few steps after warm-up.

use oxtrain_autograd::{autocast, Var};
use oxtrain_models::{Gpt2Config, Gpt2LMHeadModel, ResNet, ResNetConfig};
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{loss::cross_entropy, Module};
use oxtrain_tensor::{cuda, DType, Device, Tensor};

const DEV: Device = Device::Cuda(0);

/// Runs `step` for warm-up, then three more, and asserts that those three waited for nothing
/// and allocated nothing from the driver; the last loss is read after (one wait, outside).
/// The counters are the device's, so the tests take turns (the harness runs them in threads).
fn assert_steady(what: &str, mut step: impl FnMut() -> Var) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..3 {
        step();
    }
    cuda::synchronize(0).unwrap();
    let (waits, mem) = (cuda::host_waits(0).unwrap(), cuda::memory_stats(0).unwrap());
    let mut last = None;
    for _ in 0..3 {
        last = Some(step());
    }
    let (waits_after, mem_after) = (cuda::host_waits(0).unwrap(), cuda::memory_stats(0).unwrap());
    let loss = last.unwrap().tensor().to_dtype(DType::F64).to_vec::<f64>()[0];
    assert!(loss.is_finite(), "{what}: loss {loss}");
    assert_eq!(waits_after.since(&waits), Default::default(), "{what}: the host waited in steady steps");
    assert_eq!(mem_after.driver_allocs, mem.driver_allocs, "{what}: cuMemAlloc in steady steps");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpt2_steps_on_cuda_do_not_wait_for_the_device() {
    let config = Gpt2Config { n_layer: 2, n_embd: 128, n_head: 2, n_positions: 64, ..Gpt2Config::gpt2() };
    let model = Gpt2LMHeadModel::new(&config, DEV).unwrap();
    let mut opt = AdamW::new(model.parameters(), AdamWConfig { lr: 1e-4, ..Default::default() });
    let ids = Tensor::randint(0, config.vocab_size as i64, [4, 64], DEV).unwrap();
    assert_steady("GPT-2 bf16", || {
        opt.zero_grad();
        let loss = autocast(DType::BF16, || Gpt2LMHeadModel::loss(&model.forward(&ids, None), &ids));
        loss.backward();
        opt.step();
        loss
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn resnet_steps_on_cuda_do_not_wait_for_the_device() {
    let config = ResNetConfig { channels_last: true, ..ResNetConfig::resnet18() };
    let model = ResNet::new(&config, DEV).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let x = Var::constant(Tensor::randn([8, 3, 64, 64], DType::F32, DEV).unwrap());
    let y = Tensor::randint(0, 1000, [8], DEV).unwrap();
    assert_steady("ResNet-18 bf16 channels-last", || {
        opt.zero_grad();
        let loss = autocast(DType::BF16, || cross_entropy(&model.forward(&x), &y));
        loss.backward();
        opt.step();
        loss
    });
}
