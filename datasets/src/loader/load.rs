//! Loading one batch on a worker: every sample written straight into the batch's memory.

use super::batch::{Batch, Images};
use super::{BadFilePolicy, Shared};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::rng::SampleRng;
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::atomic::Ordering;

/// `load_batch`, with a panic in the dataset turned into an error instead of a dead worker.
pub(crate) fn load_batch_guarded<D: Dataset>(
    shared: &Shared<D>,
    epoch: u64,
    indices: &[usize],
) -> Result<Batch> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_batch(shared, epoch, indices)))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(Error::Worker(format!("loading samples {indices:?}: {msg}")))
        })
}

/// What `fill` wrote: per sample kept, its label, its index and whether the device is to
/// mirror it.
#[derive(Default)]
struct Filled {
    labels: Vec<i64>,
    kept: Vec<usize>,
    flips: Vec<bool>,
    /// Bad files met, replacement tries included.
    bad: usize,
}

/// Fills `bytes` (room for `indices.len()` samples) with the samples kept; bad files leave no
/// gap.
fn fill<D: Dataset>(shared: &Shared<D>, epoch: u64, indices: &[usize], bytes: &mut [u8]) -> Result<Filled> {
    let sb = shared.dataset.sample().bytes();
    let load = |index: usize, rng: &mut SampleRng, slot: usize| {
        shared.dataset.load_with_flip(index, rng, &mut bytes[slot * sb..(slot + 1) * sb])
    };
    let (loaded, bad) = load_each(shared, epoch, indices, load)?;
    let mut filled = Filled { bad, ..Filled::default() };
    for ((label, flip), index) in loaded {
        filled.labels.push(label);
        filled.kept.push(index);
        filled.flips.push(flip);
    }
    Ok(filled)
}

/// Each of `indices` through `load(index, rng, slot)`, `slot` being its place among the samples
/// kept so far (bad files leave no gap), bad files handled as the loader's policy says. Returns
/// each sample kept with the index it came from, and the bad files met (replacement tries
/// included).
pub(super) fn load_each<D: Dataset, T>(
    shared: &Shared<D>,
    epoch: u64,
    indices: &[usize],
    mut load: impl FnMut(usize, &mut SampleRng, usize) -> Result<T>,
) -> Result<(Vec<(T, usize)>, usize)> {
    let (mut kept, mut bad) = (Vec::with_capacity(indices.len()), 0usize);
    for &index in indices {
        let slot = kept.len();
        let mut rng = SampleRng::new(shared.config.seed, epoch, index as u64);
        let e = match load(index, &mut rng, slot) {
            Ok(loaded) => {
                kept.push((loaded, index));
                continue;
            }
            Err(e @ Error::BadImage { .. }) if shared.config.bad_files != BadFilePolicy::Fail => e,
            Err(e) => return Err(e),
        };
        bad += 1;
        let n = shared.note_bad(&e, bad);
        if shared.config.bad_files == BadFilePolicy::Skip {
            eprintln!("oxtrain-datasets: skipping sample {index}: {e} ({n} bad files so far)");
            continue;
        }
        let (loaded, used) = replacement(shared, epoch, index, &mut bad, |i, rng| load(i, rng, slot))?;
        eprintln!("oxtrain-datasets: sample {index} replaced by sample {used}: {e} ({n} bad files so far)");
        kept.push((loaded, used));
    }
    Ok((kept, bad))
}

/// The first index after `bad` (wrapping round) that `load` takes, loaded with that index's
/// own random stream, so the choice depends on nothing but the dataset.
pub(super) fn replacement<D: Dataset, T>(
    shared: &Shared<D>,
    epoch: u64,
    bad: usize,
    bad_in_batch: &mut usize,
    mut load: impl FnMut(usize, &mut SampleRng) -> Result<T>,
) -> Result<(T, usize)> {
    let len = shared.dataset.len();
    for k in 1..len {
        let index = (bad + k) % len;
        let mut rng = SampleRng::new(shared.config.seed, epoch, index as u64);
        match load(index, &mut rng) {
            Ok(loaded) => return Ok((loaded, index)),
            Err(e @ Error::BadImage { .. }) => {
                *bad_in_batch += 1;
                shared.note_bad(&e, *bad_in_batch);
            }
            Err(e) => return Err(e),
        }
    }
    Err(shared.no_good_files(shared.bad_files.load(Ordering::Relaxed) + *bad_in_batch))
}

macro_rules! typed_batch {
    ($t:ty, $shared:expr, $epoch:expr, $indices:expr, $per:expr) => {{
        let mut data = vec![<$t>::default(); $indices.len() * $per];
        let filled = fill($shared, $epoch, $indices, bytemuck::cast_slice_mut(&mut data))?;
        data.truncate(filled.kept.len() * $per);
        (Tensor::from_vec(data, batch_shape($shared, filled.kept.len()), Device::Cpu)?, filled)
    }};
}

fn batch_shape<D: Dataset>(shared: &Shared<D>, n: usize) -> Vec<usize> {
    let mut shape = vec![n];
    shape.extend(shared.dataset.sample().shape);
    shape
}

pub(crate) fn load_batch<D: Dataset>(shared: &Shared<D>, epoch: u64, indices: &[usize]) -> Result<Batch> {
    if let Some(gpu) = shared.dataset.gpu_decoding() {
        return super::gpu_batch::load_batch(shared, gpu, epoch, indices);
    }
    let sample = shared.dataset.sample();
    if let Some(pool) = &shared.pinned {
        let mut buf = pool.take(indices.len() * sample.bytes())?;
        let filled = fill(shared, epoch, indices, buf.as_mut_slice::<u8>())?;
        let images = Images::Pinned { buf: Some(buf), pool: pool.clone() };
        return Ok(Batch {
            images,
            shape: batch_shape(shared, filled.kept.len()),
            dtype: sample.dtype,
            labels: filled.labels,
            indices: filled.kept,
            flips: filled.flips,
            bad_files: filled.bad,
        });
    }
    let per = sample.shape.iter().product::<usize>();
    let (tensor, filled) = match sample.dtype {
        DType::F32 => typed_batch!(f32, shared, epoch, indices, per),
        DType::U8 => typed_batch!(u8, shared, epoch, indices, per),
        DType::I64 => typed_batch!(i64, shared, epoch, indices, per),
        DType::U32 => typed_batch!(u32, shared, epoch, indices, per),
        DType::F64 => typed_batch!(f64, shared, epoch, indices, per),
        other => panic!("DataLoader: samples of dtype {other} are not supported (f32, f64, u8, u32, i64)"),
    };
    Ok(Batch {
        shape: tensor.dims().to_vec(),
        dtype: sample.dtype,
        images: Images::Cpu(tensor),
        labels: filled.labels,
        indices: filled.kept,
        flips: filled.flips,
        bad_files: filled.bad,
    })
}
