//! A batch decoded on the GPU, on a loader worker: the worker reads each file and draws its
//! crop and flip (the CPU path's plan, bad files handled by the same policy), nvJPEG decodes the
//! batch on the worker's own stream, and one kernel crops and resizes every image into the
//! batch. Only the files' bytes cross to the device; the batch is ready when the event it
//! carries has passed, which the copy stream waits for ([`super::ToDevice`]).

use super::batch::{Batch, Images};
use super::load::{load_each, replacement};
use super::{BadFilePolicy, Shared};
use crate::dataset::Dataset;
use crate::decode::RgbImage;
use crate::error::{Error, Result};
use crate::gpu_decode::nvjpeg::NvJpegDecoder;
use crate::gpu_decode::{decode_with_fallback, Decoded, GpuDecoding, PlannedFile};
use crate::transforms::SourceRegion;
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::ops::image::CropRegion;
use oxtrain_tensor::{DType, Device, Tensor};
use std::cell::RefCell;

thread_local! {
    // Each worker keeps its decoder (nvJPEG's state is per thread) and its stream, so workers
    // decode side by side and beside the training step.
    static DECODER: RefCell<Option<(NvJpegDecoder, Stream)>> = const { RefCell::new(None) };
}

/// `f` with this thread's decoder and stream for GPU `ordinal`, made on first use.
fn with_decoder<T>(ordinal: usize, f: impl FnOnce(&mut NvJpegDecoder, &Stream) -> Result<T>) -> Result<T> {
    DECODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(_, s)| s.ordinal() != ordinal) {
            let decoder = NvJpegDecoder::new(ordinal).map_err(Error::GpuDecoder)?;
            *slot = Some((decoder, Stream::new(ordinal)?));
        }
        let (decoder, stream) = slot.as_mut().expect("made just above");
        f(decoder, stream)
    })
}

fn crop_region(r: SourceRegion) -> CropRegion {
    CropRegion {
        left: r.left,
        top: r.top,
        width: r.width,
        height: r.height,
        clip_to_region: r.clip_to_region,
    }
}

fn upload(img: &RgbImage, ordinal: usize) -> Result<Tensor> {
    let t = Tensor::from_vec(img.data.clone(), [img.height as usize, img.width as usize, 3], Device::Cpu)?;
    Ok(t.to_device_non_blocking(Device::Cuda(ordinal))?)
}

/// The images of a batch on the device, each with the region to resample, and per sample its
/// label, index and flip.
#[derive(Default)]
struct Sources {
    images: Vec<(Tensor, CropRegion)>,
    labels: Vec<i64>,
    kept: Vec<usize>,
    flips: Vec<bool>,
}

impl Sources {
    fn push(&mut self, image: (Tensor, CropRegion), label: i64, index: usize, flip: bool) {
        self.images.push(image);
        self.labels.push(label);
        self.kept.push(index);
        self.flips.push(flip);
    }
}

pub(crate) fn load_batch<D: Dataset>(
    shared: &Shared<D>,
    gpu: &GpuDecoding,
    epoch: u64,
    indices: &[usize],
) -> Result<Batch> {
    let plan = |index: usize, rng: &mut _, _slot: usize| shared.dataset.plan_sample(index, rng);
    let (planned, mut bad) = load_each(shared, epoch, indices, plan)?;
    let sample = shared.dataset.sample();
    let (out_h, out_w) = (sample.shape[0], sample.shape[1]);
    let (files, labels_and_indices): (Vec<PlannedFile>, Vec<(i64, usize)>) =
        planned.into_iter().map(|((file, label), index)| (file, (label, index))).unzip();
    with_decoder(gpu.ordinal, |decoder, stream| {
        let _on_worker_stream = stream.make_current();
        let decoded = decode_with_fallback(decoder, &files, &gpu.limits, &gpu.fallbacks);
        let mut sources = Sources::default();
        for ((file, (label, index)), d) in files.iter().zip(labels_and_indices).zip(decoded) {
            let plan = file.plan;
            match d {
                Ok(Decoded::Gpu(t)) => sources.push((t, crop_region(plan.region)), label, index, plan.flip),
                Ok(Decoded::Cpu(img)) => {
                    let region = crop_region(plan.region_in(&img));
                    sources.push((upload(&img, gpu.ordinal)?, region), label, index, plan.flip);
                }
                Err(e @ Error::BadImage { .. }) if shared.config.bad_files != BadFilePolicy::Fail => {
                    // Its header read but neither decoder took its data: as a bad file on the host.
                    bad += 1;
                    let n = shared.note_bad(&e, bad);
                    if shared.config.bad_files == BadFilePolicy::Skip {
                        eprintln!("oxtrain-datasets: skipping sample {index}: {e} ({n} bad files so far)");
                        continue;
                    }
                    let mut slot = vec![0u8; sample.bytes()];
                    let load = |i: usize, rng: &mut _| shared.dataset.load_with_flip(i, rng, &mut slot);
                    let ((label, flip), used) = replacement(shared, epoch, index, &mut bad, load)?;
                    eprintln!("oxtrain-datasets: sample {index} replaced by sample {used}: {e} ({n} bad files so far)");
                    let img = RgbImage { width: out_w as u32, height: out_h as u32, data: slot };
                    sources.push(
                        (upload(&img, gpu.ordinal)?, CropRegion::whole(out_w, out_h)),
                        label,
                        used,
                        flip,
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let images = if sources.images.is_empty() {
            Images::Cpu(Tensor::zeros([0, out_h, out_w, 3], DType::U8, Device::Cpu)?)
        } else {
            let refs: Vec<(&Tensor, CropRegion)> = sources.images.iter().map(|(t, r)| (t, *r)).collect();
            let tensor = Tensor::resize_crops(&refs, (out_w, out_h));
            Images::Device { tensor, ready: stream.record_event()? }
        };
        Ok(Batch {
            images,
            shape: vec![sources.labels.len(), out_h, out_w, 3],
            dtype: DType::U8,
            labels: sources.labels,
            indices: sources.kept,
            flips: sources.flips,
            bad_files: bad,
        })
    })
}
