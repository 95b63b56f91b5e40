//! The GPU path's CPU side: which decoder `auto` picks, the fallback of refused files, and the
//! crop plans (the same draws as the CPU path). The nvJPEG test runs on a GPU machine only.

use super::*;
use crate::decode::decode_rgb;
use crate::image_folder::ImageFolder;
use crate::transforms::{ChannelLayout, PixelOutput};
use std::collections::HashSet;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-gpu-decode-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn auto_decodes_on_the_gpu_below_twenty_cores_per_gpu() {
    let ok = || Ok(());
    let missing = || Err("libnvjpeg.so.13 not found".to_string());
    let auto = |cores, gpus, lib| resolve_decode(DecodeOn::Auto, cores, gpus, lib);
    assert_eq!(auto(20, 1, ok()), Ok(DecodeOn::Cpu));
    assert_eq!(auto(16, 1, ok()), Ok(DecodeOn::Gpu), "an H200 machine of 16 cores");
    assert_eq!(auto(112, 8, ok()), Ok(DecodeOn::Gpu), "14 cores per GPU");
    assert_eq!(auto(160, 8, ok()), Ok(DecodeOn::Cpu));
    assert_eq!(auto(4, 0, ok()), Ok(DecodeOn::Cpu), "no GPU");
    assert_eq!(auto(4, 1, missing()), Ok(DecodeOn::Cpu), "no nvJPEG");
    assert_eq!(resolve_decode(DecodeOn::Cpu, 1, 8, ok()), Ok(DecodeOn::Cpu));
    assert_eq!(resolve_decode(DecodeOn::Gpu, 64, 1, ok()), Ok(DecodeOn::Gpu));
    let no_gpu = resolve_decode(DecodeOn::Gpu, 64, 0, ok()).unwrap_err();
    assert!(no_gpu.contains("needs a CUDA GPU") && no_gpu.contains("\"cpu\""), "{no_gpu}");
    let no_lib = resolve_decode(DecodeOn::Gpu, 64, 1, missing()).unwrap_err();
    assert!(no_lib.contains("libnvjpeg.so.13 not found") && no_lib.contains("nvidia-nvjpeg"), "{no_lib}");
}

/// Decodes on the CPU but refuses the files it was told to, as nvJPEG refuses CMYK files.
struct Refusing {
    refused: HashSet<Vec<u8>>,
    calls: usize,
}

impl BatchJpegDecoder for Refusing {
    type Image = RgbImage;

    fn decode_batch(&mut self, files: &[&[u8]]) -> Vec<std::result::Result<RgbImage, String>> {
        self.calls += 1;
        files
            .iter()
            .map(|b| match self.refused.contains(*b) {
                true => Err("JPEG_NOT_SUPPORTED".into()),
                false => decode_rgb(b, Path::new("gpu"), &DecodeLimits::default()).map_err(|e| e.to_string()),
            })
            .collect()
    }
}

fn planned(ds: &ImageFolder, epoch: u64) -> Vec<PlannedFile> {
    (0..ds.len())
        .map(|i| {
            let path = &ds.samples[i].0;
            let bytes = std::fs::read(path).unwrap();
            PlannedFile::plan(&ds.transform, &ds.limits, (7, epoch, i), path, bytes).unwrap()
        })
        .collect()
}

#[test]
fn refused_files_are_decoded_on_the_cpu_in_place_and_counted() {
    let d = tmp("gpu_fallback");
    crate::synthetic::write_shapes_image_folder(&d, 2, 6, 40, 5).unwrap();
    let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(24)).unwrap();
    let files = planned(&ds, 0);
    let refused_at = [1usize, 4, 9];
    let mut gpu =
        Refusing { refused: refused_at.iter().map(|&i| files[i].bytes.clone()).collect(), calls: 0 };
    let count = FallbackCount::default();
    let out = decode_with_fallback(&mut gpu, &files, &ds.limits, &count);
    assert_eq!((gpu.calls, out.len(), count.get()), (1, files.len(), refused_at.len()));
    for (i, (r, file)) in out.iter().zip(&files).enumerate() {
        let want = decode_rgb(&file.bytes, &file.path, &ds.limits).unwrap();
        let (img, on_cpu) = match r.as_ref().unwrap() {
            Decoded::Gpu(img) => (img, false),
            Decoded::Cpu(img) => (img, true),
        };
        assert_eq!(on_cpu, refused_at.contains(&i), "file {i}");
        assert_eq!(
            (img.width, img.height, &img.data),
            (want.width, want.height, &want.data),
            "file {i} in its place"
        );
    }
    // A file neither decoder reads is a bad image in its place, for the bad-file policy.
    let mut broken = files[2].clone();
    broken.bytes.truncate(broken.bytes.len() / 2);
    gpu.refused.insert(broken.bytes.clone());
    let out = decode_with_fallback(&mut gpu, &[files[0].clone(), broken], &ds.limits, &count);
    assert!(matches!(out[0], Ok(Decoded::Gpu(_))));
    assert!(matches!(out[1], Err(crate::Error::BadImage { .. })), "{:?}", out[1]);
    assert_eq!(count.get(), refused_at.len() + 1);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_gpu_paths_crop_plans_are_the_cpu_paths_draws() {
    let d = tmp("gpu_plans");
    crate::synthetic::write_shapes_image_folder(&d, 3, 8, 48, 6).unwrap();
    let t = ImageTransform::imagenet_train(24)
        .with_pixels(PixelOutput::U8)
        .with_layout(ChannelLayout::Hwc)
        .with_dct_scaling(false);
    let ds = ImageFolder::new(&d, t).unwrap();
    for epoch in [0, 3] {
        for file in planned(&ds, epoch) {
            // The CPU path's sample of (seed 7, epoch, index) ...
            let mut cpu = vec![0u8; t.sample_bytes()];
            let mut rng = SampleRng::new(7, epoch, file.index as u64);
            t.load_into(&file.bytes, &file.path, &ds.limits, &mut rng, &mut cpu).unwrap();
            // ... is the GPU path's plan applied to the full-size decode.
            let mut planned = vec![0u8; t.sample_bytes()];
            t.apply(&decode_rgb(&file.bytes, &file.path, &ds.limits).unwrap(), &file.plan, &mut planned);
            assert_eq!(cpu, planned, "sample {} of epoch {epoch}", file.index);
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn crop_scale_and_aspect_ratio_follow_random_resized_crop() {
    // A 500x375 photo, as in ImageNet: the area fraction and the aspect ratio of the crops
    // the GPU path draws, against the CPU path's draws and against torchvision's get_params
    // (crop_stats.json, made by crop_stats.py beside it).
    let want: serde_json::Value = serde_json::from_str(include_str!("crop_stats.json")).unwrap();
    let t = ImageTransform::imagenet_train(224);
    let n = 20_000u64;
    let (mut scales, mut log_ratios) = (Vec::new(), Vec::new());
    for index in 0..n {
        let gpu = t.plan(500, 375, &mut SampleRng::new(1, 2, index));
        let cpu = t.plan(500, 375, &mut SampleRng::new(1, 2, index));
        assert_eq!(gpu, cpu);
        let r = gpu.region;
        scales.push(r.width * r.height / (500.0 * 375.0));
        log_ratios.push((r.width / r.height).ln());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    // Four standard errors of a mean of n draws.
    let close = |got: f64, key: &str, std_key: &str| {
        let (m, sd) = (want[key].as_f64().unwrap(), want[std_key].as_f64().unwrap());
        assert!((got - m).abs() < 4.0 * sd / (n as f64).sqrt(), "{key}: {got} against torchvision's {m}");
    };
    close(mean(&scales), "scale_mean", "scale_std");
    close(mean(&log_ratios), "log_ratio_mean", "log_ratio_std");
    scales.sort_by(f64::total_cmp);
    for (k, d) in want["scale_deciles"].as_array().unwrap().iter().enumerate() {
        let got = scales[(k + 1) * n as usize / 10];
        assert!((got - d.as_f64().unwrap()).abs() < 0.01, "decile {}: {got} against {d}", k + 1);
    }
}

#[test]
#[ignore = "needs a CUDA GPU and nvJPEG"]
fn nvjpeg_decodes_a_baseline_jpeg_as_the_cpu_decoder_within_rounding() {
    // Embedded: the GPU machine has no checkout to read it from.
    let path = Path::new("test_photo.jpg");
    let bytes = include_bytes!("../transforms/test_photo.jpg").to_vec();
    let want = decode_rgb(&bytes, path, &DecodeLimits::default()).unwrap();
    let mut gpu = nvjpeg::NvJpegDecoder::new(0).unwrap();
    let mut out = gpu.decode_batch(&[&bytes, b"not a jpeg"]);
    assert!(out[1].is_err(), "a file that is not a JPEG is refused");
    let t = out.remove(0).unwrap();
    assert_eq!(t.dims(), &[want.height as usize, want.width as usize, 3]);
    let got = t.to_device(oxtrain_tensor::Device::Cpu).unwrap().to_vec::<u8>();
    let diffs: Vec<u32> = got.iter().zip(&want.data).map(|(&a, &b)| a.abs_diff(b) as u32).collect();
    let mean = diffs.iter().sum::<u32>() as f64 / diffs.len() as f64;
    let over = |level: u32| diffs.iter().filter(|&&d| d > level).count() as f64 / diffs.len() as f64;
    eprintln!("mean difference {mean:.3}; over 4: {:.4}, over 16: {:.4}", over(4), over(16));
    // Decoders differ in their IDCT and chroma upsampling (the GPU's JPEG engines replicate
    // chroma where libjpeg-turbo interpolates it): a level or two on average, more at colour
    // edges. A wrong pitch, plane or colour conversion is tens of levels everywhere.
    assert!(mean < 3.0, "mean absolute difference {mean}");
    assert!(over(16) < 0.01, "{:.4} of the values differ by more than 16", over(16));
}

/// Absolute differences between two byte images: (mean, largest).
fn differences(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y) as u64).sum();
    (sum as f64 / a.len() as f64, a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0))
}

#[test]
fn the_device_resampler_is_the_cpu_paths_pil_filter_within_rounding() {
    // The kernel's arithmetic (run here by the CPU device) against fast_image_resize's
    // two-pass fixed-point PIL filter, for training crops and for the evaluation resize.
    let path = Path::new("test_photo.jpg");
    let bytes = include_bytes!("../transforms/test_photo.jpg");
    let img = decode_rgb(bytes, path, &DecodeLimits::default()).unwrap();
    let source = oxtrain_tensor::Tensor::from_vec(
        img.data.clone(),
        [img.height as usize, img.width as usize, 3],
        oxtrain_tensor::Device::Cpu,
    )
    .unwrap();
    let train = ImageTransform::imagenet_train(64).for_device_normalize();
    let eval = ImageTransform::imagenet_eval(73, 64).for_device_normalize();
    let mut worst = (0.0f64, 0u8);
    for (k, t) in [train, eval].iter().enumerate() {
        for index in 0..40 {
            let plan = t.plan(img.width, img.height, &mut SampleRng::new(3, k as u64, index));
            let mut want = vec![0u8; t.sample_bytes()];
            t.apply(&img, &plan, &mut want);
            let r = plan.region;
            let region = oxtrain_tensor::ops::image::CropRegion {
                left: r.left,
                top: r.top,
                width: r.width,
                height: r.height,
                clip_to_region: r.clip_to_region,
            };
            let got = oxtrain_tensor::Tensor::resize_crops(&[(&source, region)], (64, 64)).to_vec::<u8>();
            let (mean, max) = differences(&got, &want);
            assert!(mean < 0.25 && max <= 2, "{plan:?}: mean {mean}, largest {max}");
            worst = (worst.0.max(mean), worst.1.max(max));
        }
    }
    eprintln!("worst mean difference {:.3}, largest {}", worst.0, worst.1);
}

#[test]
#[ignore = "needs a CUDA GPU and nvJPEG"]
fn a_gpu_decoded_batch_is_the_cpu_loaders_within_the_decoders_rounding() {
    use crate::loader::{DataLoader, LoaderConfig, PinMemory};
    use crate::sampler::DistributedSampler;
    let d = tmp("gpu_loader");
    crate::synthetic::write_shapes_image_folder(&d, 3, 10, 96, 8).unwrap();
    let t = ImageTransform::imagenet_train(48).for_device_normalize().with_dct_scaling(false);
    // No prefetch of the next epoch, whose batches would decode (and count) files again.
    let config = LoaderConfig {
        batch_size: 8,
        num_workers: 2,
        seed: 5,
        pin_memory: PinMemory::Off,
        prefetch_next_epoch: false,
        ..Default::default()
    };
    let loader = |gpu: bool| {
        let mut set = ImageFolder::new(&d, t).unwrap();
        if gpu {
            set = set.decode_on_gpu(0).unwrap();
        }
        let sampler = DistributedSampler::single(set.len()).shuffle(true).seed(1);
        DataLoader::new(set, sampler, config).unwrap()
    };
    let (cpu, gpu) = (loader(false), loader(true));
    let mut batches = 0;
    for (a, b) in cpu.epoch(1).zip(gpu.epoch(1)) {
        let (mut a, mut b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            (&a.indices, a.flips(), a.labels().to_vec::<i64>()),
            (&b.indices, b.flips(), b.labels().to_vec::<i64>())
        );
        assert!(b.device_ready().is_some(), "the GPU path's batch is on the device");
        assert_eq!(a.images_shape(), b.images_shape());
        let (mean, _) = differences(&a.images().to_vec::<u8>(), &b.images().to_vec::<u8>());
        // Two decoders (IDCT, chroma upsampling) and two resamplers' rounding.
        assert!(mean < 1.5, "batch {batches}: mean difference {mean}");
        batches += 1;
    }
    assert_eq!(batches, cpu.len());
    // The drawn folder mixes PNGs in: nvJPEG refuses those (once per epoch), the CPU decodes them.
    let pngs =
        gpu.dataset().samples.iter().filter(|(p, _)| p.extension().is_some_and(|e| e == "png")).count();
    assert!(pngs > 0);
    assert_eq!(gpu.dataset().gpu_fallbacks(), pngs, "every PNG and nothing else went to the CPU");
    std::fs::remove_dir_all(&d).unwrap();
}
