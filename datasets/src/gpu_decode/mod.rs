//! JPEG decoding on the GPU (nvJPEG), for nodes with too few CPU cores per GPU to decode at
//! the speed of the training step.
//!
//! The split of the work keeps the augmentation the CPU path's by construction: the host reads
//! each file's header and draws its crop and flip with [`ImageTransform::plan`] from the same
//! per-sample stream ([`SampleRng`]) as the CPU path; only the pixel work (decode, crop, resize,
//! flip, normalise) moves to the GPU. Files the GPU decoder refuses (CMYK, some progressive
//! files, corrupt ones) are decoded on the CPU with the same plan and counted
//! ([`FallbackCount`]), never dropped.

pub mod nvjpeg;
#[cfg(test)]
mod tests;

use crate::decode::{self, DecodeLimits, RgbImage};
use crate::error::Result;
use crate::rng::SampleRng;
use crate::transforms::{CropPlan, ImageTransform};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Below this many CPU cores per GPU, `decode = "auto"` decodes on the GPU. A core decodes
/// and augments about 410 ImageNet images per second; the bare ResNet-50 bf16 step on an H200
/// takes about 6600 per second (bench/results/imagenet-h200.json), so CPU decoding needs about
/// 16 cores for the step alone, and 20 leave the training thread and the copies theirs.
pub const MIN_CPU_CORES_PER_GPU: usize = 20;

/// Where JPEGs are decoded (`data.decode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeOn {
    /// The GPU when the node has fewer than [`MIN_CPU_CORES_PER_GPU`] cores per GPU and
    /// nvJPEG is there, else the CPU.
    Auto,
    Cpu,
    Gpu,
}

/// The decoder `choice` comes to on a node of `cpu_cores` and `gpus` (0: no GPU), with or
/// without nvJPEG. An explicit "gpu" without a GPU or without nvJPEG is an error saying so.
pub fn resolve_decode(
    choice: DecodeOn,
    cpu_cores: usize,
    gpus: usize,
    nvjpeg: std::result::Result<(), String>,
) -> std::result::Result<DecodeOn, String> {
    match choice {
        DecodeOn::Cpu => Ok(DecodeOn::Cpu),
        DecodeOn::Gpu if gpus == 0 => {
            Err("data.decode = \"gpu\" needs a CUDA GPU; there is none: use \"cpu\" or \"auto\"".into())
        }
        DecodeOn::Gpu => nvjpeg.map(|()| DecodeOn::Gpu).map_err(|why| {
            format!("data.decode = \"gpu\": nvJPEG could not be loaded ({why}); install the CUDA toolkit or `pip install nvidia-nvjpeg-cu13`, or use \"cpu\"")
        }),
        DecodeOn::Auto if gpus > 0 && cpu_cores < MIN_CPU_CORES_PER_GPU * gpus && nvjpeg.is_ok() => {
            Ok(DecodeOn::Gpu)
        }
        DecodeOn::Auto => Ok(DecodeOn::Cpu),
    }
}

/// One file of a batch as the GPU path takes it: its bytes and the choices drawn for it.
#[derive(Clone, Debug)]
pub struct PlannedFile {
    pub index: usize,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub plan: CropPlan,
}

impl PlannedFile {
    /// Reads the header of `bytes` and draws the crop and flip of sample `index` of `epoch`
    /// with the CPU path's function and stream: the same plan the CPU path would use.
    pub fn plan(
        transform: &ImageTransform,
        limits: &DecodeLimits,
        (seed, epoch, index): (u64, u64, usize),
        path: &Path,
        bytes: Vec<u8>,
    ) -> Result<PlannedFile> {
        let mut rng = SampleRng::new(seed, epoch, index as u64);
        PlannedFile::plan_with(transform, limits, index, &mut rng, path, bytes)
    }

    /// As [`PlannedFile::plan`], drawing from `rng` (the sample's stream, as the loader makes it).
    pub fn plan_with(
        transform: &ImageTransform,
        limits: &DecodeLimits,
        index: usize,
        rng: &mut SampleRng,
        path: &Path,
        bytes: Vec<u8>,
    ) -> Result<PlannedFile> {
        let (w, h) = decode::image_dimensions(&bytes, path, limits)?;
        let plan = transform.plan(w, h, rng);
        Ok(PlannedFile { index, path: path.to_path_buf(), bytes, plan })
    }
}

/// A dataset decoded on a GPU ([`crate::ImageFolder::decode_on_gpu`]): the device, the decode
/// limits for the files the GPU refuses, and how many it refused.
#[derive(Clone, Debug)]
pub struct GpuDecoding {
    pub ordinal: usize,
    pub limits: DecodeLimits,
    pub fallbacks: Arc<FallbackCount>,
}

/// A decoder of batches of JPEGs into device images: nvJPEG, or a stand-in in tests.
pub trait BatchJpegDecoder {
    /// A decoded image where the decoder keeps it (device memory for nvJPEG).
    type Image;

    /// Each file decoded, in order, or the reason the decoder refused it.
    fn decode_batch(&mut self, files: &[&[u8]]) -> Vec<std::result::Result<Self::Image, String>>;
}

/// A file's pixels: from the GPU decoder, or from the CPU decoder for a file it refused.
#[derive(Debug)]
pub enum Decoded<I> {
    Gpu(I),
    Cpu(RgbImage),
}

/// Files the GPU decoder refused and the CPU decoded instead (what the metrics report).
#[derive(Debug, Default)]
pub struct FallbackCount(AtomicUsize);

impl FallbackCount {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Every file of `files` in order: decoded by `gpu`, or, for each file it refuses, by the CPU
/// decoder (full size: the plan's crop then runs on either kind the same way), counted in
/// `fallbacks` and named on stderr. A file neither decoder reads is a `BadImage` error in its
/// place, for the loader's bad-file policy.
pub fn decode_with_fallback<G: BatchJpegDecoder>(
    gpu: &mut G,
    files: &[PlannedFile],
    limits: &DecodeLimits,
    fallbacks: &FallbackCount,
) -> Vec<Result<Decoded<G::Image>>> {
    let bytes: Vec<&[u8]> = files.iter().map(|f| f.bytes.as_slice()).collect();
    let results = gpu.decode_batch(&bytes);
    assert_eq!(
        results.len(),
        files.len(),
        "a GPU decoder returned {} results for {} files",
        results.len(),
        files.len()
    );
    files
        .iter()
        .zip(results)
        .map(|(file, r)| match r {
            Ok(img) => Ok(Decoded::Gpu(img)),
            Err(why) => {
                let n = fallbacks.0.fetch_add(1, Ordering::Relaxed) + 1;
                eprintln!(
                    "oxtrain-datasets: {} decoded on the CPU: the GPU decoder refused it ({why}); {n} so far",
                    file.path.display()
                );
                decode::decode_rgb_reduced(&file.bytes, &file.path, limits, 1).map(Decoded::Cpu)
            }
        })
        .collect()
}
