//! The background writer: a thread that writes each file of a snapshot as soon as it is
//! complete in host memory, then, once `save` hands over the rest, the manifest, the commit
//! and the pruning, while training goes on. One save is in flight at a time; the next snapshot
//! waits for it, and its error (if any) comes back then or at `finish`.

use super::discover::{list, remove_stale_temps};
use super::error::{CheckpointError, Result};
use super::layout::part_name;
use super::retention::to_remove;
use super::session::Session;
use super::snapshot::{HandOver, Snapshot, Staging};
use super::write::{PartFile, PartInfo, ProgressFn};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Where and how a run keeps its checkpoints.
#[derive(Clone)]
pub struct CheckpointConfig {
    /// The run's checkpoint folder (`<run>/checkpoints`); step directories go inside.
    pub dir: PathBuf,
    /// Keep the newest `keep_last` checkpoints (`None`: keep all).
    pub keep_last: Option<usize>,
    /// Also keep every checkpoint whose step is a multiple of this.
    pub keep_every: Option<u64>,
    pub rank: usize,
    pub world_size: usize,
    /// Called as bytes reach the file system, from the writer thread.
    pub on_progress: Option<ProgressFn>,
}

impl CheckpointConfig {
    /// One process, keeping every checkpoint.
    pub fn new(dir: impl Into<PathBuf>) -> CheckpointConfig {
        CheckpointConfig {
            dir: dir.into(),
            keep_last: None,
            keep_every: None,
            rank: 0,
            world_size: 1,
            on_progress: None,
        }
    }
}

/// A save that reached the disk.
#[derive(Debug, Clone)]
pub struct Saved {
    pub step: u64,
    /// This rank's part.
    pub path: PathBuf,
    pub bytes: u64,
    /// Writing, fsyncing and committing, on the writer thread: from its first file of this
    /// save (it starts while the training step still copies the rest) to the commit.
    pub write_time: Duration,
}

/// What the writer thread is asked to do.
pub(crate) enum Job {
    /// A complete file of the part of step `step`: written at once.
    File { step: u64, file: PartFile },
    /// The rest of the snapshot: its small files, the manifest, the commit.
    Save(Box<Snapshot>),
    /// The snapshot was dropped unsaved: discard its files; the memory it did not use.
    Abandon(Staging),
    /// The snapshot is saved by another Checkpointer: stop writing its files and send them
    /// there.
    Recall(Sender<Vec<PartFile>>),
    /// The Checkpointer is finishing.
    Stop,
}

/// What a save came to: committed, failed, or abandoned (`None`); and the memory of its images.
type Outcome = (Result<Option<Saved>>, Staging);

pub struct Checkpointer {
    config: CheckpointConfig,
    jobs: Sender<Job>,
    results: Receiver<Outcome>,
    /// A snapshot was taken whose outcome is not collected yet.
    in_flight: bool,
    /// The snapshot taken is still being built (neither saved nor dropped).
    open: Arc<AtomicBool>,
    staging: Staging,
    last: Option<Saved>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the writer thread. Unfinished writes this rank left behind (a killed process)
    /// are removed; committed checkpoints are never touched except by retention.
    pub fn new(config: CheckpointConfig) -> Result<Checkpointer> {
        std::fs::create_dir_all(&config.dir)
            .map_err(super::error::io(&config.dir, "creating the checkpoint folder"))?;
        remove_stale_temps(&config.dir, config.rank);
        // Unbounded: handing a file over never blocks the training step (there are at most a
        // few jobs per save, and one save at a time).
        let (jobs, job_rx) = unbounded::<Job>();
        let (result_tx, results) = bounded::<Outcome>(1);
        let thread_config = config.clone();
        let thread = std::thread::Builder::new()
            .name("oxtrain-checkpoint".into())
            .spawn(move || run_writer(&thread_config, &job_rx, &result_tx))
            .map_err(|e| CheckpointError::WriterGone(format!("could not start it: {e}")))?;
        Ok(Checkpointer {
            config,
            jobs,
            results,
            in_flight: false,
            open: Arc::new(AtomicBool::new(false)),
            staging: Staging::new(),
            last: None,
            thread: Some(thread),
        })
    }

    /// A snapshot of step `step` in `epoch` for this rank: chain `.model(&m)?.optimizer(&o)?`
    /// and the rest, then pass it to [`Checkpointer::save`]. The default generator's state is
    /// taken now. Waits for the previous save first (its host buffers are reused) and returns
    /// its error if it failed. The writer starts on the model's and the optimizer's files as
    /// soon as each is copied; a snapshot dropped instead of saved is discarded.
    pub fn snapshot(&mut self, step: u64, epoch: u64) -> Result<Snapshot> {
        if self.open.load(Ordering::Acquire) {
            return Err(CheckpointError::SnapshotOpen);
        }
        self.wait()?;
        let staging = std::mem::take(&mut self.staging);
        self.open.store(true, Ordering::Release);
        self.in_flight = true;
        let hand_over = HandOver { jobs: self.jobs.clone(), open: self.open.clone() };
        Ok(Snapshot::new(step, epoch, (self.config.rank, self.config.world_size), staging, hand_over))
    }

    /// Hands the rest of `snap` to the writer thread and returns; the save's outcome comes
    /// back from the next `snapshot`, `wait` or `finish`. A snapshot taken by another
    /// Checkpointer is written here, whole, with this one's settings.
    pub fn save(&mut self, mut snap: Snapshot) -> Result<()> {
        if let Some(h) = snap.hand_over.take() {
            h.open.store(false, Ordering::Release);
            if !h.jobs.same_channel(&self.jobs) {
                let (files, recalled) = bounded(1);
                let files = h.jobs.send(Job::Recall(files)).ok().and_then(|()| recalled.recv().ok());
                let files = files.ok_or_else(|| {
                    CheckpointError::WriterGone(
                        "the writer of the Checkpointer that took the snapshot exited".into(),
                    )
                })?;
                snap.held.extend(files);
            }
        }
        if self.jobs.send(Job::Save(Box::new(snap))).is_err() {
            return Err(CheckpointError::WriterGone(self.thread_end()));
        }
        self.in_flight = true;
        Ok(())
    }

    /// Waits for the save in flight, if any; returns what it committed. A snapshot still being
    /// built is not waited for (it is not a save yet).
    pub fn wait(&mut self) -> Result<Option<&Saved>> {
        if self.in_flight && !self.open.load(Ordering::Acquire) {
            self.in_flight = false;
            match self.results.recv() {
                Ok((saved, staging)) => {
                    self.staging = staging;
                    if let Some(saved) = saved? {
                        self.last = Some(saved);
                    }
                }
                Err(_) => return Err(CheckpointError::WriterGone(self.thread_end())),
            }
        }
        Ok(self.last.as_ref())
    }

    /// Whether a save is still being written.
    pub fn is_writing(&self) -> bool {
        self.in_flight && self.results.is_empty()
    }

    /// The last save known to be committed (as of the last `save` or `wait`).
    pub fn last_saved(&self) -> Option<&Saved> {
        self.last.as_ref()
    }

    /// Waits for the last save and stops the writer; call before the process exits.
    pub fn finish(mut self) -> Result<Option<Saved>> {
        self.wait()?;
        self.stop();
        Ok(self.last.take())
    }

    fn stop(&mut self) {
        // Explicitly: a snapshot still alive holds a sender, so the channel would stay open.
        let _ = self.jobs.send(Job::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn thread_end(&mut self) -> String {
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(panic)) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "it panicked".into()),
            _ => "it exited".into(),
        }
    }
}

impl Drop for Checkpointer {
    /// Lets a save in flight finish (a loop that returns early with `?` still gets its last
    /// checkpoint), reporting its error on stderr since nobody is left to return it to.
    fn drop(&mut self) {
        if self.in_flight {
            if let Err(e) = self.wait() {
                eprintln!("oxtrain: the last checkpoint was not saved: {e}");
            }
        }
        self.stop();
    }
}

fn newest_committed(config: &CheckpointConfig) -> Option<PathBuf> {
    let entries = list(&config.dir).ok()?;
    entries.into_iter().find(|e| !e.partial).map(|e| config.dir.join(part_name(e.step, config.rank)))
}

/// The writer thread: one session per snapshot, one outcome per session.
fn run_writer(config: &CheckpointConfig, jobs: &Receiver<Job>, results: &Sender<Outcome>) {
    let mut previous = newest_committed(config);
    let mut session: Option<Session> = None;
    for job in jobs.iter() {
        let outcome = match job {
            Job::File { step, file } => {
                session.get_or_insert_with(|| Session::begin(config, step, previous.clone())).start(file);
                continue;
            }
            Job::Save(snap) => {
                let s =
                    session.take().unwrap_or_else(|| Session::begin(config, snap.step(), previous.clone()));
                let info =
                    PartInfo { epoch: snap.trainer.epoch, rank: config.rank, world_size: config.world_size };
                let (saved, staging) = s.finish(snap, &info);
                if let Ok(saved) = &saved {
                    previous = Some(saved.path.clone());
                    prune(config, saved.step);
                }
                (saved.map(Some), staging)
            }
            Job::Abandon(mut staging) => {
                if let Some(s) = session.take() {
                    staging.extend(s.abandon());
                }
                (Ok(None), staging)
            }
            Job::Recall(to) => {
                let files = session.take().map(Session::recall).unwrap_or_default();
                let _ = to.send(files);
                (Ok(None), Staging::new())
            }
            Job::Stop => break,
        };
        if results.send(outcome).is_err() {
            break;
        }
    }
    if let Some(s) = session.take() {
        s.abandon();
    }
}

/// Applies retention to this rank's parts. Failures to delete are reported, not fatal: the
/// new checkpoint is safe, and an old one left behind costs only space.
fn prune(config: &CheckpointConfig, newest: u64) {
    let Ok(entries) = list(&config.dir) else { return };
    let steps: Vec<u64> = entries.iter().filter(|e| !e.partial && e.step <= newest).map(|e| e.step).collect();
    for step in to_remove(&steps, config.keep_last, config.keep_every) {
        let path = config.dir.join(part_name(step, config.rank));
        if let Err(e) = std::fs::remove_dir_all(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("oxtrain: could not remove old checkpoint {}: {e}", path.display());
            }
        }
    }
}
