//! The data loader (`torch.utils.data.DataLoader`): worker threads load batches ahead into a
//! bounded queue and the iterator hands them out in order.
//!
//! Determinism: the sampler fixes the order of indices for (seed, epoch), and every random
//! choice for a sample comes from a stream keyed by (seed, epoch, index) ([`SampleRng`]), so
//! the batches are the same whatever the number of workers or their timing.
//!
//! Workers live as long as the loader. Once every batch of epoch `e` has been sent to them, the
//! free slots go to the first batches of epoch `e + 1` (its order is known from the sampler's
//! seed), so those are decoded while epoch `e` ends and while evaluation runs. `epoch(e + 1)`
//! uses them only when its batches are exactly those prefetched (a resumed position, another
//! epoch number: the prefetch is dropped), so the batches stay those of a loader without it.

#[cfg(test)]
mod bad_file_tests;
mod batch;
mod device;
#[cfg(test)]
mod device_tests;
mod gpu_batch;
mod iter;
mod load;
mod pool;
#[cfg(test)]
mod prefetch_tests;
#[cfg(test)]
mod tests;

pub use batch::Batch;
pub use device::{DeviceInput, ToDevice};
pub use iter::EpochIter;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::sampler::{DistributedSampler, SamplerState};
use batch::PinnedPool;
use pool::{Stream, WorkerPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::rng::SampleRng;

/// What to do with a file that is not a usable image (empty, truncated, not an image, or over
/// the decode limits). Each is counted ([`DataLoader::bad_files`]) and named on stderr; an
/// epoch in which every file is bad is an error ([`Error::NoGoodFiles`]) whatever the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadFilePolicy {
    /// Put another sample in its place: the next index after it (wrapping round) that loads,
    /// with that index's own random stream. Every batch stays full, so under DDP every rank's
    /// batches keep the same size (ranks would otherwise disagree on the gradient's
    /// normalisation, and a BatchNorm batch would shrink). The replacement appears twice in
    /// the epoch; the result does not depend on the number of workers.
    Replace,
    /// Leave the sample out of its batch: batches come out short (fine in one process; under
    /// DDP ranks then train on different batch sizes).
    Skip,
    /// End the epoch with the error.
    Fail,
}

/// Page-locked batches: on by default when a CUDA device is present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMemory {
    /// Pinned when `Device::cuda_if_available(0)` finds a GPU, plain host memory otherwise.
    Auto,
    Off,
    /// Pinned through device `n`'s context (an error if it is not there).
    Device(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderConfig {
    pub batch_size: usize,
    /// Threads loading batches; 0 loads on the calling thread.
    pub num_workers: usize,
    /// Batches each worker may have loaded ahead (torch's `prefetch_factor`).
    pub prefetch_factor: usize,
    /// Seed of the per-sample random streams (the sampler has its own seed).
    pub seed: u64,
    /// Leave out the last batch when it is incomplete.
    pub drop_last: bool,
    pub pin_memory: PinMemory,
    pub bad_files: BadFilePolicy,
    /// With workers: once an epoch's batches are all sent, start loading the next epoch's
    /// first batches (off for a loader always read at the same epoch, as an evaluation set).
    pub prefetch_next_epoch: bool,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 1,
            num_workers: 0,
            prefetch_factor: 2,
            seed: 0,
            drop_last: false,
            pin_memory: PinMemory::Auto,
            bad_files: BadFilePolicy::Replace,
            prefetch_next_epoch: true,
        }
    }
}

pub(crate) struct Shared<D: Dataset> {
    pub dataset: D,
    pub config: LoaderConfig,
    pub bad_files: AtomicUsize,
    /// The first bad file's message, for the error of an epoch in which every file was bad
    /// (the replacement search meets the others without naming each).
    pub first_bad: Mutex<Option<String>>,
    pub pinned: Option<Arc<PinnedPool>>,
}

impl<D: Dataset> Shared<D> {
    /// Notes a bad file met while loading a batch that has `in_batch` of them so far (this
    /// one included); returns how many that makes with those of the batches handed out. The
    /// count itself grows as batches are handed out, so a batch loaded ahead for the next
    /// epoch counts in that epoch.
    pub(crate) fn note_bad(&self, e: &Error, in_batch: usize) -> usize {
        let mut first = self.first_bad.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.to_string());
        self.bad_files.load(Ordering::Relaxed) + in_batch
    }

    pub(crate) fn no_good_files(&self, bad: usize) -> Error {
        let first = self.first_bad.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Error::NoGoodFiles {
            bad,
            total: self.dataset.len(),
            first: first.unwrap_or_else(|| "none recorded".into()),
        }
    }
}

/// Where the loading of an epoch that has not started yet stands ([`DataLoader::prefetch_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchStatus {
    pub epoch: u64,
    /// Batches sent to the workers.
    pub sent: usize,
    /// Of those, batches loaded and waiting.
    pub loaded: usize,
}

pub struct DataLoader<D: Dataset> {
    shared: Arc<Shared<D>>,
    sampler: Arc<Mutex<DistributedSampler>>,
    /// The batches of the next epoch, loading ahead. Declared before `pool` so that dropping
    /// the loader cancels its queued jobs before the workers are joined.
    next: Arc<Mutex<Option<Stream>>>,
    /// Started at the first epoch with workers, kept for the loader's life.
    pool: Mutex<Option<Arc<WorkerPool>>>,
}

impl<D: Dataset> DataLoader<D> {
    /// A loader over `dataset` in the order `sampler` gives (use
    /// `DistributedSampler::single(len)` for one process).
    pub fn new(dataset: D, sampler: DistributedSampler, config: LoaderConfig) -> Result<DataLoader<D>> {
        if config.batch_size == 0 {
            return Err(Error::Config(
                "DataLoader: batch_size is 0; set it to the number of samples per batch (1 or more)".into(),
            ));
        }
        let ordinal = match config.pin_memory {
            PinMemory::Off => None,
            PinMemory::Device(n) => {
                oxtrain_tensor::Device::Cuda(n).check_available()?;
                Some(n)
            }
            PinMemory::Auto => oxtrain_tensor::Device::cuda_if_available(0).is_cuda().then_some(0),
        };
        let pinned = ordinal.map(|n| Arc::new(PinnedPool::new(n)));
        let shared =
            Shared { dataset, config, bad_files: AtomicUsize::new(0), first_bad: Mutex::new(None), pinned };
        Ok(DataLoader {
            shared: Arc::new(shared),
            sampler: Arc::new(Mutex::new(sampler)),
            next: Arc::new(Mutex::new(None)),
            pool: Mutex::new(None),
        })
    }

    pub fn dataset(&self) -> &D {
        &self.shared.dataset
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.shared.config
    }

    /// Batches per full epoch (`len(loader)`).
    pub fn len(&self) -> usize {
        let n = self.lock_sampler().num_samples();
        let b = self.shared.config.batch_size;
        if self.shared.config.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Loads of bad files so far, replaced or skipped (a file counts once per epoch it is
    /// met in, replacement tries included).
    pub fn bad_files(&self) -> usize {
        self.shared.bad_files.load(Ordering::Relaxed)
    }

    fn lock_sampler(&self) -> std::sync::MutexGuard<'_, DistributedSampler> {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sampler's position, to save with a checkpoint: it counts the batches handed out.
    pub fn state_dict(&self) -> SamplerState {
        self.lock_sampler().state_dict()
    }

    /// Restores a saved position; the next `epoch(state.epoch)` continues from it.
    pub fn load_state_dict(&self, state: &SamplerState) -> Result<()> {
        self.lock_sampler().load_state_dict(state)
    }

    /// Restores a position saved on this world size or on another
    /// ([`DistributedSampler::load_state_dict_any_world`]): the remaining global order is the same.
    pub fn load_state_dict_any_world(&self, state: &SamplerState) -> Result<()> {
        self.lock_sampler().load_state_dict_any_world(state)
    }

    /// Batches left in the sampler's current epoch (all of `len()` at its start; 0 once a
    /// restored state says the epoch was used up), so a resumed loop knows whether to go on
    /// with that epoch or start the next.
    pub fn remaining_batches(&self) -> usize {
        let s = self.lock_sampler();
        let left = s.num_samples().saturating_sub(s.position());
        let b = self.shared.config.batch_size;
        if self.shared.config.drop_last {
            left / b
        } else {
            left.div_ceil(b)
        }
    }

    /// The batches of `epoch`: from where a restored state left off when it is of this epoch,
    /// else from the start.
    pub fn epoch(&self, epoch: u64) -> EpochIter<D> {
        let indices = {
            let mut s = self.lock_sampler();
            if s.epoch() != epoch || s.position() >= s.num_samples() {
                s.set_epoch(epoch);
            }
            s.remaining()
        };
        let batches = split_batches(&indices, &self.shared.config);
        let Some(pool) = self.worker_pool() else {
            return EpochIter::inline(self.shared.clone(), self.sampler.clone(), epoch, batches.into());
        };
        let prefetched = lock(&self.next).take().filter(|s| s.epoch == epoch && s.batches == batches);
        let stream = prefetched.unwrap_or_else(|| Stream::new(epoch, batches));
        EpochIter::pooled(self.shared.clone(), self.sampler.clone(), pool, stream, self.next.clone())
    }

    /// Starts loading the first batches of `epoch` from its start (as many as the workers
    /// load ahead), unless they are loading already; the next `epoch(epoch)` hands them out if
    /// it starts there. Epochs prefetch their successor by themselves (`prefetch_next_epoch`);
    /// this is for the first epoch, while the model is being built. Nothing without workers.
    pub fn prefetch_epoch(&self, epoch: u64) {
        let Some(pool) = self.worker_pool() else { return };
        let mut next = lock(&self.next);
        if next.as_ref().is_some_and(|s| s.epoch == epoch) {
            return;
        }
        let mut stream = Stream::new(epoch, self.epoch_batches(epoch));
        while stream.outstanding() < self.shared.config.ahead() && stream.send_next(&pool) {}
        *next = Some(stream);
    }

    /// The batches of `epoch` from its start, without moving the sampler.
    fn epoch_batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        epoch_batches(&self.sampler, &self.shared.config, epoch)
    }

    /// The epoch loading ahead, if any.
    pub fn prefetch_status(&self) -> Option<PrefetchStatus> {
        let mut next = lock(&self.next);
        let s = next.as_mut()?;
        Some(PrefetchStatus { epoch: s.epoch, sent: s.sent(), loaded: s.loaded() })
    }

    /// Blocks until every batch sent ahead for the next epoch is loaded, then says where it
    /// stands (a measurement can start its clock with the epoch's first batches ready).
    pub fn wait_prefetched(&self) -> Result<Option<PrefetchStatus>> {
        let Some(pool) = lock(&self.pool).clone() else { return Ok(None) };
        if let Some(s) = lock(&self.next).as_mut() {
            s.wait_loaded(&pool)?;
        }
        Ok(self.prefetch_status())
    }

    fn worker_pool(&self) -> Option<Arc<WorkerPool>> {
        let workers = self.shared.config.num_workers;
        if workers == 0 {
            return None;
        }
        let mut pool = lock(&self.pool);
        Some(pool.get_or_insert_with(|| Arc::new(WorkerPool::start(&self.shared, workers))).clone())
    }
}

impl LoaderConfig {
    /// Batches the workers may hold loaded or loading at once, over both epochs.
    pub(crate) fn ahead(&self) -> usize {
        self.num_workers * self.prefetch_factor.max(1)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `indices` in batches, the incomplete last one left out under `drop_last`.
fn split_batches(indices: &[usize], config: &LoaderConfig) -> Vec<Vec<usize>> {
    let b = config.batch_size;
    let mut batches: Vec<Vec<usize>> = indices.chunks(b).map(<[usize]>::to_vec).collect();
    if config.drop_last && batches.last().is_some_and(|l| l.len() < b) {
        batches.pop();
    }
    batches
}

/// The batches of `epoch` from its start, read from a copy of the sampler so that its
/// position (what a checkpoint saves) does not move.
fn epoch_batches(sampler: &Mutex<DistributedSampler>, config: &LoaderConfig, epoch: u64) -> Vec<Vec<usize>> {
    let mut s = lock(sampler).clone();
    s.set_epoch(epoch);
    split_batches(&s.epoch_indices(), config)
}
