//! The data loader (`torch.utils.data.DataLoader`): worker threads load batches ahead into a
//! bounded queue and the iterator hands them out in order.
//!
//! Determinism: the sampler fixes the order of indices for (seed, epoch), and every random
//! choice for a sample comes from a stream keyed by (seed, epoch, index) ([`SampleRng`]), so
//! the batches are the same whatever the number of workers or their timing.

#[cfg(test)]
mod bad_file_tests;
mod batch;
mod load;
#[cfg(test)]
mod tests;

pub use batch::Batch;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::sampler::{DistributedSampler, SamplerState};
use batch::PinnedPool;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
    /// Counts a bad file; returns how many so far.
    pub(crate) fn count_bad(&self, e: &Error) -> usize {
        let mut first = self.first_bad.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.to_string());
        self.bad_files.fetch_add(1, Ordering::Relaxed) + 1
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

pub struct DataLoader<D: Dataset> {
    shared: Arc<Shared<D>>,
    sampler: Arc<Mutex<DistributedSampler>>,
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
        Ok(DataLoader { shared: Arc::new(shared), sampler: Arc::new(Mutex::new(sampler)) })
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
        let b = self.shared.config.batch_size;
        let mut batches: VecDeque<Vec<usize>> = indices.chunks(b).map(<[usize]>::to_vec).collect();
        if self.shared.config.drop_last && batches.back().is_some_and(|l| l.len() < b) {
            batches.pop_back();
        }
        EpochIter::start(self.shared.clone(), self.sampler.clone(), epoch, batches)
    }
}

type Job = (usize, Vec<usize>);
type Done = (usize, Result<Batch>);

/// The batches of one epoch, in order. Dropping it stops the workers.
pub struct EpochIter<D: Dataset> {
    shared: Arc<Shared<D>>,
    sampler: Arc<Mutex<DistributedSampler>>,
    epoch: u64,
    queued: VecDeque<Vec<usize>>,
    /// Sample counts of the batches sent to workers, by sequence number.
    sizes: BTreeMap<usize, usize>,
    next_send: usize,
    next_yield: usize,
    ready: BTreeMap<usize, Result<Batch>>,
    jobs: Option<Sender<Job>>,
    done: Option<Receiver<Done>>,
    workers: Vec<JoinHandle<()>>,
    finished: bool,
    /// Samples handed out, and the loader's bad-file count when the epoch began: an epoch of
    /// bad files only is an error, not an empty epoch.
    samples_out: usize,
    bad_at_start: usize,
}

impl<D: Dataset> EpochIter<D> {
    fn start(
        shared: Arc<Shared<D>>,
        sampler: Arc<Mutex<DistributedSampler>>,
        epoch: u64,
        queued: VecDeque<Vec<usize>>,
    ) -> Self {
        let mut it = EpochIter {
            shared,
            sampler,
            epoch,
            queued,
            sizes: BTreeMap::new(),
            next_send: 0,
            next_yield: 0,
            ready: BTreeMap::new(),
            jobs: None,
            done: None,
            workers: Vec::new(),
            finished: false,
            samples_out: 0,
            bad_at_start: 0,
        };
        it.bad_at_start = it.shared.bad_files.load(Ordering::Relaxed);
        let workers = it.shared.config.num_workers;
        if workers > 0 && !it.queued.is_empty() {
            let ahead = workers * it.shared.config.prefetch_factor.max(1);
            let (jobs_tx, jobs_rx) = bounded::<Job>(ahead);
            let (done_tx, done_rx) = unbounded::<Done>();
            for w in 0..workers {
                let (shared, jobs_rx, done_tx) = (it.shared.clone(), jobs_rx.clone(), done_tx.clone());
                let handle = std::thread::Builder::new()
                    .name(format!("oxtrain-loader-{w}"))
                    .spawn(move || {
                        for (seq, indices) in jobs_rx.iter() {
                            let r = load::load_batch_guarded(&shared, epoch, &indices);
                            if done_tx.send((seq, r)).is_err() {
                                break;
                            }
                        }
                    })
                    .expect("spawning a loader worker thread");
                it.workers.push(handle);
            }
            it.jobs = Some(jobs_tx);
            it.done = Some(done_rx);
            for _ in 0..ahead {
                it.send_next();
            }
        }
        it
    }

    fn send_next(&mut self) {
        if let (Some(tx), Some(indices)) = (&self.jobs, self.queued.pop_front()) {
            self.sizes.insert(self.next_send, indices.len());
            // The channel holds `ahead` jobs and at most that many are outstanding.
            let _ = tx.send((self.next_send, indices));
            self.next_send += 1;
        }
    }

    /// The sampler's state as of the batches handed out so far.
    pub fn state_dict(&self) -> SamplerState {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner()).state_dict()
    }

    fn next_result(&mut self) -> Option<Result<Batch>> {
        if self.jobs.is_none() {
            let indices = self.queued.pop_front()?;
            let n = indices.len();
            let r = load::load_batch_guarded(&self.shared, self.epoch, &indices);
            self.sampler.lock().unwrap_or_else(|e| e.into_inner()).advance(n);
            return Some(r);
        }
        if self.next_yield == self.next_send {
            return None;
        }
        let seq = self.next_yield;
        let r = loop {
            if let Some(r) = self.ready.remove(&seq) {
                break r;
            }
            match self.done.as_ref().expect("workers running").recv() {
                Ok((s, r)) => {
                    self.ready.insert(s, r);
                }
                Err(_) => break Err(Error::Worker("every loader worker thread has exited".into())),
            }
        };
        self.next_yield += 1;
        let n = self.sizes.remove(&seq).unwrap_or(0);
        self.sampler.lock().unwrap_or_else(|e| e.into_inner()).advance(n);
        self.send_next();
        Some(r)
    }
}

impl<D: Dataset> Iterator for EpochIter<D> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.finished {
            return None;
        }
        loop {
            match self.next_result() {
                None => {
                    self.finished = true;
                    // A dropped incomplete batch was never handed out; the epoch is over all the same.
                    self.sampler.lock().unwrap_or_else(|e| e.into_inner()).finish_epoch();
                    let bad = self.shared.bad_files.load(Ordering::Relaxed) - self.bad_at_start;
                    if self.samples_out == 0 && bad > 0 {
                        return Some(Err(self.shared.no_good_files(bad)));
                    }
                    return None;
                }
                // A batch whose every file was bad has nothing to hand out.
                Some(Ok(b)) if b.is_empty() => continue,
                Some(Err(e)) => {
                    self.finished = true;
                    return Some(Err(e));
                }
                Some(Ok(b)) => {
                    self.samples_out += b.len();
                    return Some(Ok(b));
                }
            }
        }
    }
}

impl<D: Dataset> Drop for EpochIter<D> {
    fn drop(&mut self) {
        // Closing the job queue ends each worker after its current batch.
        self.jobs = None;
        self.done = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
