//! Flip and normalisation left to the device give the images the host path gives.

use super::tests::{config, tmp};
use super::*;
use crate::image_folder::ImageFolder;
use crate::transforms::ImageTransform;
use oxtrain_tensor::Device;
use std::path::Path;

fn loader(d: &Path, transform: ImageTransform) -> DataLoader<ImageFolder> {
    let ds = ImageFolder::new(d, transform).unwrap();
    let sampler = DistributedSampler::single(ds.len()).seed(11);
    DataLoader::new(ds, sampler, config(4, 2)).unwrap()
}

/// Every batch of `epoch` through [`ToDevice`], back on the host.
fn through(
    l: &DataLoader<ImageFolder>,
    epoch: u64,
    device: Device,
    input: Option<DeviceInput>,
) -> Vec<(Vec<f32>, Vec<i64>)> {
    ToDevice::new(l.epoch(epoch), device, input)
        .unwrap()
        .map(|r| {
            let (images, labels) = r.unwrap();
            assert_eq!(images.device(), device);
            (images.to_device(Device::Cpu).unwrap().to_vec::<f32>(), labels.to_vec::<i64>())
        })
        .collect()
}

fn same_batches_as_the_host_path(device: Device) {
    let d = tmp(&format!("device_input_{device:?}"));
    crate::synthetic::write_shapes_image_folder(&d, 3, 6, 40, 4).unwrap();
    let host = loader(&d, ImageTransform::imagenet_train(24));
    let raw = loader(&d, ImageTransform::imagenet_train(24).for_device_normalize());
    let mut flipped = 0;
    for epoch in 0..3 {
        flipped += raw.epoch(epoch).map(|b| b.unwrap().flips().iter().filter(|&&f| f).count()).sum::<usize>();
        let want = through(&host, epoch, Device::Cpu, None);
        assert_eq!(through(&raw, epoch, device, Some(DeviceInput::IMAGENET_F32)), want, "epoch {epoch}");
    }
    assert!(flipped > 0, "the flip was drawn for some samples");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn flip_and_normalise_after_the_loader_give_the_host_paths_images() {
    same_batches_as_the_host_path(Device::Cpu);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flip_and_normalise_on_the_gpu_give_the_host_paths_images() {
    same_batches_as_the_host_path(Device::Cuda(0));
}

#[test]
fn the_loaders_position_counts_only_the_batches_handed_to_the_step() {
    // A checkpoint saves the position: a batch read ahead and not trained on would be skipped
    // by the resumed run.
    let d = tmp("device_position");
    crate::synthetic::write_shapes_image_folder(&d, 2, 6, 40, 4).unwrap();
    let l = loader(&d, ImageTransform::imagenet_train(24).for_device_normalize());
    let mut it = ToDevice::new(l.epoch(0), Device::Cpu, Some(DeviceInput::IMAGENET_F32)).unwrap();
    it.next().unwrap().unwrap();
    it.next().unwrap().unwrap();
    assert_eq!(l.state_dict().position, 8);
    std::fs::remove_dir_all(&d).unwrap();
}
