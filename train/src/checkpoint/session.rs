//! One save on the writer thread. Its files are written as soon as each is complete in host
//! memory (the model's while the training step still copies the optimizer's), then the small
//! ones, the manifest, and the commit. A snapshot dropped unsaved is discarded together with
//! what was written of it.

use super::error::{io, CheckpointError, Result};
use super::layout::part_name;
use super::manifest::FileEntry;
use super::snapshot::{Snapshot, Staging};
use super::write::{available_bytes, commit, is_disk_full, Content, PartFile, PartInfo, PartWrite};
use super::writer::{CheckpointConfig, Saved};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// A file being written on a thread of its own; its memory comes back with the result.
type FileWrite = JoinHandle<(Result<FileEntry>, PartFile)>;

pub(crate) struct Session {
    start: Instant,
    step: u64,
    parent: PathBuf,
    target: PathBuf,
    /// The part being written (none if its directory could not be made: `failed` says why).
    part: Option<Arc<PartWrite>>,
    failed: Option<CheckpointError>,
    writes: Vec<FileWrite>,
    /// Files not written because the part had failed already (kept for their memory).
    unwritten: Vec<PartFile>,
    /// The disk had no room for what was still to write when a file was handed over.
    no_room: bool,
    /// The newest committed checkpoint, named in a disk-full error.
    previous: Option<PathBuf>,
}

impl Session {
    pub fn begin(config: &CheckpointConfig, step: u64, previous: Option<PathBuf>) -> Session {
        let name = part_name(step, config.rank);
        let part = PartWrite::begin(&config.dir, &name, step, config.on_progress.clone()).map(Arc::new);
        let (part, failed) = match part {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        Session {
            start: Instant::now(),
            step,
            parent: config.dir.clone(),
            target: config.dir.join(name),
            part,
            failed,
            writes: Vec::new(),
            unwritten: Vec::new(),
            no_room: false,
            previous,
        }
    }

    /// Starts writing `f`, unless the part has failed or the disk cannot hold what is left to
    /// write (then the save fails at its end, having filled nothing).
    pub fn start(&mut self, f: PartFile) {
        let Some(part) = self.part.clone().filter(|_| self.failed.is_none()) else {
            return self.unwritten.push(f);
        };
        part.plan(&f);
        let (total, written) = part.sizes();
        if self.no_room || available_bytes(&self.parent).is_some_and(|free| free < total - written) {
            self.no_room = true;
            return self.unwritten.push(f);
        }
        let write = std::thread::Builder::new().name("oxtrain-checkpoint-file".into()).spawn(move || {
            let r = part.write_file(&f);
            (r, f)
        });
        match write {
            Ok(w) => self.writes.push(w),
            Err(e) => self.failed = Some(io(&self.target, "starting a file writer thread")(e)),
        }
    }

    /// Writes the rest of `snap` (the small files), waits for every file, then writes the
    /// manifest and commits the part. Returns the memory of the images for the next save.
    pub fn finish(mut self, mut snap: Box<Snapshot>, info: &PartInfo) -> (Result<Saved>, Staging) {
        if let Some(part) = &self.part {
            part.start_checksums();
        }
        for f in snap.take_files() {
            self.start(f);
        }
        let (entries, files) = self.join();
        let mut staging = staging_of(files);
        staging.extend(snap.take_staging());
        let failed = self.failed.take();
        let committed = match &self.part {
            None => Err(failed.expect("a session without a part has failed")),
            Some(part) => {
                let written = match failed {
                    Some(e) => Err(e),
                    None if self.no_room => Err(self.disk_full(part)),
                    None => entries.into_iter().collect::<Result<Vec<_>>>().and_then(|entries| {
                        let bytes = part.write_manifest(info, entries)?;
                        commit(&part.temp, &self.target)?;
                        Ok(bytes)
                    }),
                };
                written.map_err(|e| {
                    let _ = std::fs::remove_dir_all(&part.temp);
                    match e {
                        CheckpointError::Io { source, .. } if is_disk_full(&source) => self.disk_full(part),
                        e => e,
                    }
                })
            }
        };
        let saved = committed.map(|bytes| Saved {
            step: self.step,
            path: self.target.clone(),
            bytes,
            write_time: self.start.elapsed(),
        });
        (saved, staging)
    }

    /// Waits for the files in flight and removes what was written; returns their memory.
    pub fn abandon(self) -> Staging {
        staging_of(self.recall())
    }

    /// Waits for the files in flight and removes what was written; returns the files.
    pub fn recall(mut self) -> Vec<PartFile> {
        if let Some(part) = &self.part {
            part.start_checksums();
        }
        let (_, files) = self.join();
        if let Some(part) = &self.part {
            let _ = std::fs::remove_dir_all(&part.temp);
        }
        files
    }

    /// Waits for every file write: their entries, in the order the files were handed over,
    /// and all the files handed over, written or not.
    fn join(&mut self) -> (Vec<Result<FileEntry>>, Vec<PartFile>) {
        let mut entries = Vec::new();
        let mut files = Vec::new();
        for w in self.writes.drain(..) {
            let (entry, f) = w.join().expect("a checkpoint file writer panicked");
            entries.push(entry);
            files.push(f);
        }
        files.append(&mut self.unwritten);
        (entries, files)
    }

    /// The error of a part the disk had no room for, once its temporary directory is gone.
    fn disk_full(&self, part: &PartWrite) -> CheckpointError {
        let _ = std::fs::remove_dir_all(&part.temp);
        CheckpointError::DiskFull {
            path: self.target.clone(),
            needed: part.sizes().0,
            available: available_bytes(&self.parent),
            previous: self.previous.clone(),
        }
    }
}

/// The images' memory among `files`, for the next save.
fn staging_of(files: Vec<PartFile>) -> Staging {
    files
        .into_iter()
        .filter_map(|f| match f.content {
            Content::Image(image) => Some((f.name, image.into_buffer())),
            Content::Bytes(_) => None,
        })
        .collect()
}
