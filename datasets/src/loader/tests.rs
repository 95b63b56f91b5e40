use super::*;
use crate::image_folder::ImageFolder;
use crate::transforms::{ChannelLayout, ImageTransform, PixelOutput};
use std::path::{Path, PathBuf};

pub(super) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-loader-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub(super) fn config(batch_size: usize, num_workers: usize) -> LoaderConfig {
    LoaderConfig { batch_size, num_workers, seed: 42, pin_memory: PinMemory::Off, ..Default::default() }
}

pub(super) fn collect<D: Dataset>(
    loader: &DataLoader<D>,
    epoch: u64,
) -> Vec<(Vec<f32>, Vec<i64>, Vec<usize>)> {
    loader
        .epoch(epoch)
        .map(|b| {
            let mut b = b.unwrap();
            (b.images().to_vec::<f32>(), b.labels().to_vec::<i64>(), b.indices.clone())
        })
        .collect()
}

#[test]
fn same_batches_for_any_number_of_workers() {
    let d = tmp("determinism");
    crate::synthetic::write_shapes_image_folder(&d, 3, 7, 48, 3).unwrap();
    let make = |workers| {
        let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(24)).unwrap();
        let sampler = DistributedSampler::single(ds.len()).seed(5);
        DataLoader::new(ds, sampler, config(4, workers)).unwrap()
    };
    let (l0, l1, l3) = (make(0), make(1), make(3));
    let e1 = collect(&l1, 1);
    assert_eq!(e1.len(), 6); // 21 samples in batches of 4
    assert_eq!(e1.iter().map(|b| b.1.len()).sum::<usize>(), 21);
    assert_eq!(collect(&l3, 1), e1);
    assert_eq!(collect(&l0, 1), e1);
    // Another epoch: another order and other crops.
    let e2 = collect(&l3, 2);
    assert_ne!(e2, e1);
    assert_eq!(collect(&l1, 2), e2);
    let mut b = l1.epoch(1).next().unwrap().unwrap();
    assert_eq!(b.images().dims(), &[4, 3, 24, 24]);
    assert!(!b.is_pinned());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn resume_mid_epoch_continues_the_same_order() {
    let d = tmp("resume");
    crate::synthetic::write_shapes_image_folder(&d, 2, 9, 32, 4).unwrap();
    let make = || {
        let t = ImageTransform::imagenet_eval(20, 16)
            .with_pixels(PixelOutput::U8)
            .with_layout(ChannelLayout::Hwc);
        let ds = ImageFolder::new(&d, t).unwrap();
        let sampler = DistributedSampler::single(ds.len()).seed(9);
        DataLoader::new(ds, sampler, LoaderConfig { drop_last: true, ..config(4, 2) }).unwrap()
    };
    let a = make();
    assert_eq!(a.len(), 4);
    let full: Vec<Vec<usize>> = a.epoch(3).map(|b| b.unwrap().indices.clone()).collect();
    assert_eq!(full.len(), 4);
    let mut it = a.epoch(3);
    it.next().unwrap().unwrap();
    it.next().unwrap().unwrap();
    let saved = it.state_dict();
    drop(it);
    assert_eq!(saved.position, 8);
    let b = make();
    b.load_state_dict(&saved).unwrap();
    let rest: Vec<Vec<usize>> = b.epoch(3).map(|b| b.unwrap().indices.clone()).collect();
    assert_eq!(rest, full[2..].to_vec());
    // The next epoch starts from the beginning again.
    assert_eq!(b.epoch(4).count(), 4);
    std::fs::remove_dir_all(&d).unwrap();
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// Bad files of every kind, written among good ones; returns how many were written.
pub(super) fn write_bad_files(class_dir: &Path) -> usize {
    let good = std::fs::read(class_dir.join("00000.jpg")).unwrap();
    std::fs::write(class_dir.join("bad_empty.jpg"), b"").unwrap();
    std::fs::write(class_dir.join("bad_text.jpg"), b"this is not an image").unwrap();
    std::fs::write(class_dir.join("bad_truncated.jpg"), &good[..good.len() / 2]).unwrap();
    std::fs::write(class_dir.join("bad_header_only.jpg"), &good[..40]).unwrap();
    // A JPEG whose frame header declares 60000 x 60000 pixels.
    let mut huge = good.clone();
    let sof = huge.windows(2).position(|w| w == [0xFF, 0xC0]).expect("a baseline JPEG");
    huge[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]);
    std::fs::write(class_dir.join("bad_huge.jpg"), huge).unwrap();
    // A PNG whose header declares 100000 x 100000 pixels, with a valid checksum.
    let png = std::fs::read(class_dir.join("00003.png")).unwrap();
    let mut big = png.clone();
    big[16..24].copy_from_slice(&[0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0]);
    let crc = crc32(&big[12..29]);
    big[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(class_dir.join("bad_huge.png"), big).unwrap();
    std::fs::write(class_dir.join("bad_truncated.png"), &png[..png.len() * 2 / 3]).unwrap();
    7
}

#[test]
fn bad_files_are_skipped_and_counted() {
    let d = tmp("bad_skip");
    crate::synthetic::write_shapes_image_folder(&d, 2, 5, 64, 6).unwrap();
    let bad = write_bad_files(&d.join("circle"));
    for workers in [0, 2] {
        let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(32)).unwrap();
        assert_eq!(ds.len(), 10 + bad);
        let sampler = DistributedSampler::single(ds.len()).seed(1);
        let skip = LoaderConfig { bad_files: BadFilePolicy::Skip, ..config(3, workers) };
        let loader = DataLoader::new(ds, sampler, skip).unwrap();
        let batches: Vec<Batch> = loader.epoch(0).map(|b| b.unwrap()).collect();
        let seen: usize = batches.iter().map(Batch::len).sum();
        assert_eq!(seen, 10, "every good file and no bad one ({workers} workers)");
        assert_eq!(loader.bad_files(), bad, "{workers} workers");
        for b in &batches {
            for &i in &b.indices {
                let name = loader.dataset().samples[i].0.file_name().unwrap().to_string_lossy().into_owned();
                assert!(!name.starts_with("bad_"), "{name} was loaded");
            }
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn each_bad_file_fails_the_run_when_asked() {
    let d = tmp("bad_fail");
    crate::synthetic::write_shapes_image_folder(&d, 1, 4, 64, 7).unwrap();
    write_bad_files(&d.join("circle"));
    let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(32)).unwrap();
    let bad: Vec<usize> = (0..ds.len())
        .filter(|&i| ds.samples[i].0.file_name().unwrap().to_string_lossy().starts_with("bad_"))
        .collect();
    assert_eq!(bad.len(), 7);
    let names: Vec<String> =
        bad.iter().map(|&i| ds.samples[i].0.file_name().unwrap().to_string_lossy().into_owned()).collect();
    let loader = DataLoader::new(
        ds,
        DistributedSampler::single(11).shuffle(false),
        LoaderConfig { bad_files: BadFilePolicy::Fail, ..config(1, 2) },
    )
    .unwrap();
    // One sample per batch, in order: each bad file ends its epoch with an error naming it.
    let mut it = loader.epoch(0);
    let mut errors = 0;
    for i in 0..11 {
        let r = it.next().expect("a result for every sample up to the first error");
        match r {
            Ok(b) => assert!(!bad.contains(&b.indices[0])),
            Err(e) => {
                let msg = e.to_string();
                assert!(names.iter().any(|n| msg.contains(n.as_str())), "{msg}");
                assert!(bad.contains(&i));
                errors += 1;
                break;
            }
        }
    }
    assert_eq!(errors, 1);
    assert!(it.next().is_none(), "the epoch ends at its first error");
    drop(it);
    // Each kind alone fails with BadImage.
    let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(32)).unwrap();
    for &i in &bad {
        let mut out = vec![0u8; ds.sample().bytes()];
        let err = ds.load_into(i, &mut SampleRng::new(0, 0, 0), &mut out).unwrap_err();
        assert!(matches!(err, Error::BadImage { .. }), "{}: {err}", ds.samples[i].0.display());
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A dataset that panics on one index.
struct Panicky;

impl Dataset for Panicky {
    fn len(&self) -> usize {
        10
    }
    fn sample(&self) -> crate::dataset::Sample {
        crate::dataset::Sample { shape: vec![2], dtype: oxtrain_tensor::DType::F32 }
    }
    fn load_into(&self, index: usize, _rng: &mut SampleRng, out: &mut [u8]) -> Result<i64> {
        assert!(index != 7, "sample 7 is cursed");
        out.copy_from_slice(bytemuck::cast_slice(&[index as f32, 1.0]));
        Ok(index as i64)
    }
}

#[test]
fn a_panicking_dataset_ends_the_epoch_with_an_error() {
    for workers in [0, 3] {
        let loader =
            DataLoader::new(Panicky, DistributedSampler::single(10).shuffle(false), config(2, workers))
                .unwrap();
        let results: Vec<Result<Batch>> = loader.epoch(0).collect();
        assert_eq!(results.len(), 4);
        let err = results[3].as_ref().unwrap_err().to_string();
        assert!(err.contains("cursed"), "{err}");
        let mut first = results.into_iter().next().unwrap().unwrap();
        assert_eq!(first.images().to_vec::<f32>(), vec![0.0, 1.0, 1.0, 1.0]);
    }
}

#[test]
fn early_drop_stops_the_workers() {
    let loader =
        DataLoader::new(Panicky, DistributedSampler::single(6).shuffle(false), config(1, 4)).unwrap();
    let mut it = loader.epoch(0);
    assert!(it.next().unwrap().is_ok());
    drop(it); // cancels the batches it sent ahead; the workers stay for the next epoch
    assert_eq!(loader.epoch(1).take(3).count(), 3);
    drop(loader); // joins the workers; a hang here would time the test out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_batches_reach_the_gpu_unchanged() {
    let d = tmp("pinned");
    crate::synthetic::write_shapes_image_folder(&d, 3, 6, 40, 9).unwrap();
    let make = |pin| {
        let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(24)).unwrap();
        let sampler = DistributedSampler::single(ds.len()).seed(2);
        DataLoader::new(ds, sampler, LoaderConfig { pin_memory: pin, ..config(4, 2) }).unwrap()
    };
    let (plain, pinned) = (make(PinMemory::Off), make(PinMemory::Device(0)));
    let want = collect(&plain, 3);
    let mut got = Vec::new();
    // More batches than the pool's buffers, so reused pinned buffers are checked too.
    for b in pinned.epoch(3) {
        let b = b.unwrap();
        assert!(b.is_pinned());
        let indices = b.indices.clone();
        let (images, labels) = b.to(oxtrain_tensor::Device::Cuda(0)).unwrap();
        assert_eq!(images.device(), oxtrain_tensor::Device::Cuda(0));
        got.push((images.to_vec::<f32>(), labels.to_vec::<i64>(), indices));
    }
    assert_eq!(got, want);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn batch_size_zero_is_an_error_that_says_what_to_set() {
    let d = tmp("batch0");
    crate::synthetic::write_shapes_image_folder(&d, 2, 2, 16, 1).unwrap();
    let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(8)).unwrap();
    let sampler = DistributedSampler::single(ds.len());
    let err = DataLoader::new(ds, sampler, config(0, 0)).err().expect("batch size 0 must be refused");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("batch_size is 0"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}
