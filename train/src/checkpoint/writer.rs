//! The background writer: `save` hands a host snapshot to a thread that serialises, writes,
//! commits and prunes, while training goes on. One save is in flight at a time; the next
//! waits for it, and its error (if any) comes back then or at `finish`.

use super::discover::{list, part_name, remove_stale_temps};
use super::error::{CheckpointError, Result};
use super::retention::to_remove;
use super::snapshot::{take_staging, Snapshot, Staging};
use super::write::{write_part, PartInfo, ProgressFn};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// Serialising, writing, fsyncing and renaming, on the writer thread.
    pub write_time: Duration,
}

pub struct Checkpointer {
    config: CheckpointConfig,
    jobs: Option<Sender<Snapshot>>,
    results: Receiver<(Result<Saved>, Staging)>,
    in_flight: bool,
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
        let (jobs, job_rx) = bounded::<Snapshot>(1);
        let (result_tx, results) = bounded::<(Result<Saved>, Staging)>(1);
        let thread_config = config.clone();
        let thread = std::thread::Builder::new()
            .name("oxtrain-checkpoint".into())
            .spawn(move || {
                let mut previous = newest_committed(&thread_config);
                for snap in job_rx.iter() {
                    let (r, staging) = write_one(&thread_config, snap, previous.clone());
                    if let Ok(saved) = &r {
                        previous = Some(saved.path.clone());
                    }
                    if result_tx.send((r, staging)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| CheckpointError::WriterGone(format!("could not start it: {e}")))?;
        Ok(Checkpointer {
            config,
            jobs: Some(jobs),
            results,
            in_flight: false,
            staging: Staging::new(),
            last: None,
            thread: Some(thread),
        })
    }

    /// A snapshot of step `step` in `epoch` for this rank: chain `.model(&m)?.optimizer(&o)?`
    /// and the rest, then pass it to [`Checkpointer::save`]. The default generator's state is
    /// taken now. Waits for the previous save first (its host buffers are reused) and returns
    /// its error if it failed.
    pub fn snapshot(&mut self, step: u64, epoch: u64) -> Result<Snapshot> {
        self.wait()?;
        let staging = std::mem::take(&mut self.staging);
        Ok(Snapshot::new(step, epoch, self.config.rank, self.config.world_size, staging))
    }

    /// Hands `snap` to the writer thread and returns. Waits first for the previous save, and
    /// returns its error if it failed (the new one is then not started).
    pub fn save(&mut self, snap: Snapshot) -> Result<()> {
        self.wait()?;
        let sent = self.jobs.as_ref().expect("the writer runs until finish").send(snap);
        if sent.is_err() {
            return Err(CheckpointError::WriterGone(self.thread_end()));
        }
        self.in_flight = true;
        Ok(())
    }

    /// Waits for the save in flight, if any; returns what it committed.
    pub fn wait(&mut self) -> Result<Option<&Saved>> {
        if self.in_flight {
            self.in_flight = false;
            match self.results.recv() {
                Ok((saved, staging)) => {
                    self.staging = staging;
                    self.last = Some(saved?);
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
        self.jobs = None;
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

fn write_one(
    config: &CheckpointConfig,
    snap: Snapshot,
    previous: Option<PathBuf>,
) -> (Result<Saved>, Staging) {
    let start = Instant::now();
    let step = snap.step();
    let info = PartInfo {
        parent: &config.dir,
        name: part_name(step, config.rank),
        step,
        epoch: snap.trainer.epoch,
        rank: config.rank,
        world_size: config.world_size,
        progress: config.on_progress.as_ref(),
        previous,
    };
    let files = snap.into_files();
    let written = write_part(&info, &files);
    let staging = take_staging(files);
    let saved = written.map(|(path, bytes)| {
        prune(config, step);
        Saved { step, path, bytes, write_time: start.elapsed() }
    });
    (saved, staging)
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
