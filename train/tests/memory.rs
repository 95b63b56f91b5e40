//! After `backward()` returns, no activation saved for backward is still alive: every layer's
//! output of the built-in CNN is referenced only by the test's own handle, and on CUDA the
//! allocator holds exactly what it held before the step plus the new gradients.

use oxtrain::builtin::{model, shapes};
use oxtrain_autograd::Var;
use oxtrain_nn::loss::cross_entropy;
use oxtrain_nn::Module;
use oxtrain_tensor::{device_test, Device};

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
