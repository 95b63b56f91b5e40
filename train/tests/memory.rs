//! After `backward()` returns, no activation saved for backward is still alive: every layer's
//! output of a small CNN is referenced only by the test's own handle, and on CUDA the
//! allocator holds exactly what it held before the step plus the new gradients.

use oxtrain_autograd::Var;
use oxtrain_datasets::synthetic::strokes as shapes;
use oxtrain_nn::loss::cross_entropy;
use oxtrain_nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ReLU,
    Sequential,
};
use oxtrain_tensor::{device_test, Device, Result};

fn conv(cin: usize, cout: usize, device: Device) -> Result<Conv2d> {
    let config = Conv2dConfig { padding: [1, 1], bias: false, ..Default::default() };
    Conv2d::with_config(cin, cout, [3, 3], config, device)
}

/// conv-bn-relu-pool twice, one more conv, global average pooling and a linear classifier.
fn model(device: Device) -> Result<Sequential> {
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

device_test! {
    fn backward_leaves_no_saved_activation_alive(dev: Device) {
        oxtrain_tensor::manual_seed(0);
        let net = model(dev).unwrap();
        let data = shapes::make(32, 16, 3, dev).unwrap();
        let stats = || match dev {
            Device::Cuda(i) => Some(oxtrain_tensor::cuda::memory_stats(i).unwrap().allocated),
            Device::Cpu => None,
        };
        // One step first, so gradients and any lazily made state exist before measuring.
        let step = |keep: &mut Vec<oxtrain_tensor::Tensor>| {
            let mut h = Var::constant(data.images.clone());
            for layer in net.iter() {
                h = layer.forward(&h);
                keep.push(h.tensor().clone());
            }
            cross_entropy(&h, &data.labels).backward();
        };
        step(&mut Vec::new());
        let before = stats();
        let mut outputs = Vec::new();
        step(&mut outputs);
        for (i, out) in outputs.iter().enumerate() {
            // A view (Flatten) shares its input's storage: only the test's own handles may remain.
            let ours = outputs.iter().filter(|o| o.same_storage(out)).count();
            assert_eq!(out.storage_ref_count(), ours, "layer {i}'s output is still referenced after backward");
        }
        drop(outputs);
        if let Some(before) = before {
            // Gradients were replaced by new ones of the same size, activations all freed.
            assert_eq!(stats().unwrap(), before, "bytes allocated after a second step");
        }
        assert!(net.parameters().iter().all(|p| p.grad().is_some()));
    }
}
