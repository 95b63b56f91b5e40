//! The loader's worker threads, started once and kept for the loader's life (torch's
//! `persistent_workers=True`), and the stream of one epoch's batches through them.
//!
//! Every job carries its own reply channel and cancel flag, so the jobs of two epochs can be in
//! flight at once: the end of one epoch and the first batches of the next, which is what keeps
//! the GPU fed across the epoch boundary and during evaluation.

use super::batch::Batch;
use super::{load, Shared};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

type Done = (usize, Result<Batch>);

struct Job {
    seq: usize,
    epoch: u64,
    indices: Vec<usize>,
    reply: Sender<Done>,
    cancelled: Arc<AtomicBool>,
}

/// `num_workers` threads loading the batches of whichever stream sent them.
pub(crate) struct WorkerPool {
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    alive: Arc<AtomicUsize>,
}

/// Counts a worker out when its thread ends, however it ends.
struct AliveGuard(Arc<AtomicUsize>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WorkerPool {
    pub fn start<D: Dataset>(shared: &Arc<Shared<D>>, workers: usize) -> WorkerPool {
        let (jobs_tx, jobs_rx) = unbounded::<Job>();
        let alive = Arc::new(AtomicUsize::new(workers));
        let handles = (0..workers)
            .map(|w| {
                let (shared, jobs_rx, alive) = (shared.clone(), jobs_rx.clone(), alive.clone());
                std::thread::Builder::new()
                    .name(format!("oxtrain-loader-{w}"))
                    .spawn(move || {
                        let _guard = AliveGuard(alive);
                        for job in jobs_rx.iter() {
                            // A stream dropped before its job came up (an epoch left early).
                            if job.cancelled.load(Ordering::Relaxed) {
                                continue;
                            }
                            let r = load::load_batch_guarded(&shared, job.epoch, &job.indices);
                            let _ = job.reply.send((job.seq, r));
                        }
                    })
                    .expect("spawning a loader worker thread")
            })
            .collect();
        WorkerPool { jobs: Some(jobs_tx), workers: handles, alive }
    }

    fn submit(&self, job: Job) {
        if let Some(tx) = &self.jobs {
            // The workers hold the receiver until the pool is dropped.
            let _ = tx.send(job);
        }
    }

    fn any_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) > 0
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Closing the job queue ends each worker after its current batch.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The batches of one epoch (from some position on) through a pool: sent ahead in order,
/// handed out in order.
pub(crate) struct Stream {
    pub epoch: u64,
    /// Every batch of the stream, in order; `batches[seq]` is job `seq`.
    pub batches: Vec<Vec<usize>>,
    next_send: usize,
    next_yield: usize,
    ready: BTreeMap<usize, Result<Batch>>,
    reply_tx: Sender<Done>,
    reply_rx: Receiver<Done>,
    cancelled: Arc<AtomicBool>,
}

impl Stream {
    pub fn new(epoch: u64, batches: Vec<Vec<usize>>) -> Stream {
        let (reply_tx, reply_rx) = unbounded();
        Stream {
            epoch,
            batches,
            next_send: 0,
            next_yield: 0,
            ready: BTreeMap::new(),
            reply_tx,
            reply_rx,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Batches sent to the workers and not yet handed out (loading or loaded).
    pub fn outstanding(&self) -> usize {
        self.next_send - self.next_yield
    }

    pub fn sent(&self) -> usize {
        self.next_send
    }

    pub fn all_sent(&self) -> bool {
        self.next_send == self.batches.len()
    }

    /// Sends the next batch to the workers; false when every batch has been sent.
    pub fn send_next(&mut self, pool: &WorkerPool) -> bool {
        let Some(indices) = self.batches.get(self.next_send) else { return false };
        pool.submit(Job {
            seq: self.next_send,
            epoch: self.epoch,
            indices: indices.clone(),
            reply: self.reply_tx.clone(),
            cancelled: self.cancelled.clone(),
        });
        self.next_send += 1;
        true
    }

    /// Batches loaded and waiting to be handed out (without waiting for any).
    pub fn loaded(&mut self) -> usize {
        while let Ok((seq, r)) = self.reply_rx.try_recv() {
            self.ready.insert(seq, r);
        }
        self.ready.len()
    }

    /// Blocks until every batch sent so far is loaded.
    pub fn wait_loaded(&mut self, pool: &WorkerPool) -> Result<()> {
        while self.loaded() < self.outstanding() {
            self.receive_one(pool)?;
        }
        Ok(())
    }

    fn receive_one(&mut self, pool: &WorkerPool) -> Result<()> {
        loop {
            match self.reply_rx.recv_timeout(Duration::from_millis(500)) {
                Ok((seq, r)) => {
                    self.ready.insert(seq, r);
                    return Ok(());
                }
                Err(RecvTimeoutError::Timeout) if pool.any_alive() => continue,
                Err(_) => return Err(Error::Worker("every loader worker thread has exited".into())),
            }
        }
    }

    /// The next batch in order with its sample count (None once every batch was handed out),
    /// waiting for it if it is still loading. The caller sends it first.
    pub fn next_batch(&mut self, pool: &WorkerPool) -> Option<(usize, Result<Batch>)> {
        if self.next_yield == self.next_send {
            return None;
        }
        let seq = self.next_yield;
        let r = loop {
            if let Some(r) = self.ready.remove(&seq) {
                break r;
            }
            if let Err(e) = self.receive_one(pool) {
                break Err(e);
            }
        };
        self.next_yield += 1;
        Some((self.batches[seq].len(), r))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Jobs still queued for this stream are skipped by the workers.
        self.cancelled.store(true, Ordering::Relaxed);
    }
}
