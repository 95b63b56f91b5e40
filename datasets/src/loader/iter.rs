//! The batches of one epoch, in order: loaded on the calling thread without workers, else
//! through the loader's worker pool, with the next epoch's first batches sent once this
//! epoch's are all out.

use super::batch::Batch;
use super::pool::{Stream, WorkerPool};
use super::{epoch_batches, load, lock, Shared};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::sampler::{DistributedSampler, SamplerState};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

enum Source {
    /// No workers: each batch loads when asked for.
    Inline(VecDeque<Vec<usize>>),
    Pooled {
        pool: Arc<WorkerPool>,
        stream: Stream,
        next: Arc<Mutex<Option<Stream>>>,
    },
}

/// The batches of one epoch, in order. Dropping it cancels the batches it had sent ahead;
/// the workers stay with the loader.
pub struct EpochIter<D: Dataset> {
    shared: Arc<Shared<D>>,
    sampler: Arc<Mutex<DistributedSampler>>,
    epoch: u64,
    source: Source,
    /// Batches that were sent to the workers before this epoch began (prefetched).
    prefetched: usize,
    finished: bool,
    /// Samples handed out, and the loader's bad-file count when the epoch began: an epoch of
    /// bad files only is an error, not an empty epoch.
    samples_out: usize,
    bad_at_start: usize,
}

impl<D: Dataset> EpochIter<D> {
    pub(super) fn inline(
        shared: Arc<Shared<D>>,
        sampler: Arc<Mutex<DistributedSampler>>,
        epoch: u64,
        batches: VecDeque<Vec<usize>>,
    ) -> Self {
        let bad_at_start = shared.bad_files.load(Ordering::Relaxed);
        let source = Source::Inline(batches);
        EpochIter {
            shared,
            sampler,
            epoch,
            source,
            prefetched: 0,
            finished: false,
            samples_out: 0,
            bad_at_start,
        }
    }

    pub(super) fn pooled(
        shared: Arc<Shared<D>>,
        sampler: Arc<Mutex<DistributedSampler>>,
        pool: Arc<WorkerPool>,
        stream: Stream,
        next: Arc<Mutex<Option<Stream>>>,
    ) -> Self {
        let (epoch, prefetched) = (stream.epoch, stream.sent());
        let bad_at_start = shared.bad_files.load(Ordering::Relaxed);
        let source = Source::Pooled { pool, stream, next };
        let mut it = EpochIter {
            shared,
            sampler,
            epoch,
            source,
            prefetched,
            finished: false,
            samples_out: 0,
            bad_at_start,
        };
        it.top_up();
        it
    }

    /// Batches of this epoch that were already loading when it began (the prefetch).
    pub fn prefetched(&self) -> usize {
        self.prefetched
    }

    /// The sampler's state as of the batches handed out so far.
    pub fn state_dict(&self) -> SamplerState {
        lock(&self.sampler).state_dict()
    }

    /// Keeps the workers busy: this epoch's batches first, then the next epoch's, no more
    /// than `ahead` outstanding over both.
    fn top_up(&mut self) {
        let Source::Pooled { pool, stream, next } = &mut self.source else { return };
        let config = &self.shared.config;
        let ahead = config.ahead();
        while stream.outstanding() < ahead && stream.send_next(pool) {}
        if !stream.all_sent() || !config.prefetch_next_epoch {
            return;
        }
        let mut next = lock(next);
        let following = self.epoch + 1;
        if next.as_ref().is_none_or(|s| s.epoch != following) {
            *next = Some(Stream::new(following, epoch_batches(&self.sampler, config, following)));
        }
        let upcoming = next.as_mut().expect("set just above");
        while stream.outstanding() + upcoming.outstanding() < ahead && upcoming.send_next(pool) {}
    }

    fn next_result(&mut self) -> Option<Result<Batch>> {
        let (n, r) = match &mut self.source {
            Source::Inline(queued) => {
                let indices = queued.pop_front()?;
                (indices.len(), load::load_batch_guarded(&self.shared, self.epoch, &indices))
            }
            Source::Pooled { pool, stream, .. } => stream.next_batch(pool)?,
        };
        lock(&self.sampler).advance(n);
        self.top_up();
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
            let result = self.next_result();
            if let Some(Ok(b)) = &result {
                // Counted as handed out, so a batch loaded ahead counts in its own epoch.
                self.shared.bad_files.fetch_add(b.bad_files, Ordering::Relaxed);
            }
            match result {
                None => {
                    self.finished = true;
                    // A dropped incomplete batch was never handed out; the epoch is over all the same.
                    lock(&self.sampler).finish_epoch();
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
