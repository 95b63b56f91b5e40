//! The pieces of writing one checkpoint part atomically: every file into a temporary
//! directory beside the target, each fsynced, the manifest last, the directory fsynced and
//! renamed into place, the parent fsynced. A crash at any point leaves either the complete part
//! or a hidden temporary directory that discovery reports and skips. `session.rs` puts them in
//! order.

use super::durable::write_durably;
use super::error::{io, Result};
use super::image::FileImage;
use super::manifest::{hex, FileEntry, Manifest, FORMAT, MANIFEST, VERSION};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use xxhash_rust::xxh3::xxh3_64;

/// What a part's file holds.
pub(crate) enum Content {
    /// A safetensors file, laid out in page-aligned memory as it goes to disk.
    Image(FileImage),
    Bytes(Vec<u8>),
}

impl Content {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Content::Image(image) => image.bytes(),
            Content::Bytes(b) => b,
        }
    }
}

pub(crate) struct PartFile {
    pub name: String,
    pub content: Content,
}

/// Files at least this large are hashed on a thread of their own while they are written.
const HASH_BESIDE: usize = 1 << 20;

/// How far a write has got, for a progress display (or a test that stops the process mid-write).
#[derive(Debug, Clone)]
pub struct WriteProgress {
    pub step: u64,
    /// The file being written, inside the part.
    pub file: String,
    /// Bytes of this part written so far, and the size of its files (the manifest excepted).
    pub written: u64,
    pub total: u64,
}

pub type ProgressFn = Arc<dyn Fn(&WriteProgress) + Send + Sync>;

/// One part being written: the temporary directory its files go into, and the count of
/// bytes written, shared by the threads writing its files.
pub(crate) struct PartWrite {
    pub temp: PathBuf,
    pub step: u64,
    progress: Option<ProgressFn>,
    written: AtomicU64,
    /// The size of the files handed over so far.
    total: AtomicU64,
    /// Opened when the training step no longer waits for this save: checksums start then, so
    /// they do not take a core from the step's copy (the writes themselves mostly wait for
    /// the device, and start at once).
    checksums: (Mutex<bool>, Condvar),
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) use super::layout::temp_prefix;

impl PartWrite {
    /// Creates a fresh temporary directory for the part `name` in `parent`.
    pub fn begin(parent: &Path, name: &str, step: u64, progress: Option<ProgressFn>) -> Result<PartWrite> {
        std::fs::create_dir_all(parent).map_err(io(parent, "creating the checkpoint folder"))?;
        let temp = parent.join(format!(
            "{}{}-{}",
            temp_prefix(name),
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&temp).map_err(io(&temp, "creating the temporary checkpoint directory"))?;
        Ok(PartWrite {
            temp,
            step,
            progress,
            written: AtomicU64::new(0),
            total: AtomicU64::new(0),
            checksums: (Mutex::new(false), Condvar::new()),
        })
    }

    /// Counts `f` into the part's size, before it is written.
    pub fn plan(&self, f: &PartFile) {
        self.total.fetch_add(f.content.bytes().len() as u64, Ordering::Relaxed);
    }

    /// Lets the checksums start (see `checksums`).
    pub fn start_checksums(&self) {
        *self.checksums.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.checksums.1.notify_all();
    }

    fn checksum(&self, bytes: &[u8]) -> u64 {
        let open = self.checksums.0.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.checksums.1.wait_while(open, |open| !*open).unwrap_or_else(|e| e.into_inner()));
        xxh3_64(bytes)
    }

    /// Bytes handed over so far, and of those written.
    pub fn sizes(&self) -> (u64, u64) {
        (self.total.load(Ordering::Relaxed), self.written.load(Ordering::Relaxed))
    }

    fn report(&self, file: &str, written: u64) {
        if let Some(p) = &self.progress {
            let total = self.total.load(Ordering::Relaxed);
            p(&WriteProgress { step: self.step, file: file.into(), written, total });
        }
    }

    /// Writes `f` into the temporary directory, durably; returns its manifest entry.
    pub fn write_file(&self, f: &PartFile) -> Result<FileEntry> {
        let path = self.temp.join(&f.name);
        let bytes = f.content.bytes();
        // `write_durably` reports this file's bytes so far; the part's count goes up by the difference.
        let file_written = AtomicU64::new(0);
        let report = |w: u64| {
            let new = w.saturating_sub(file_written.fetch_max(w, Ordering::Relaxed));
            let so_far = self.written.fetch_add(new, Ordering::Relaxed) + new;
            self.report(&f.name, so_far);
        };
        let file = File::create_new(&path).map_err(io(&path, "creating"))?;
        // The bytes do not change while they are written, so hashing them beside the write
        // (the writing thread mostly waits for the device) checksums exactly what is written.
        let (digest, done) = std::thread::scope(|s| {
            let hasher = (bytes.len() >= HASH_BESIDE).then(|| s.spawn(|| self.checksum(bytes)));
            let done = write_durably(&file, bytes, &report);
            let digest = match hasher {
                Some(h) => h.join().expect("the checksum thread panicked"),
                None => self.checksum(bytes),
            };
            (digest, done)
        });
        done.map_err(io(&path, "writing and flushing to disk"))?;
        Ok(FileEntry { name: f.name.clone(), bytes: bytes.len() as u64, xxh3: hex(digest) })
    }

    /// Writes the manifest listing `entries`, last; returns the part's size in bytes.
    pub fn write_manifest(&self, info: &PartInfo, entries: Vec<FileEntry>) -> Result<u64> {
        // The last point before the part can commit: every file is on disk, the manifest not yet.
        self.report(MANIFEST, self.written.load(Ordering::Relaxed));
        let manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            step: self.step,
            epoch: info.epoch,
            rank: info.rank,
            world_size: info.world_size,
            files: entries,
        };
        let path = self.temp.join(MANIFEST);
        let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
        let mut file = File::create(&path).map_err(io(&path, "creating"))?;
        file.write_all(&json).map_err(io(&path, "writing"))?;
        file.sync_all().map_err(io(&path, "flushing to disk"))?;
        Ok(self.written.load(Ordering::Relaxed) + json.len() as u64)
    }
}

/// What the manifest says of a part besides its files.
pub(crate) struct PartInfo {
    pub epoch: u64,
    pub rank: usize,
    pub world_size: usize,
}

/// Renames `temp` to `target` durably. A part already at `target` (the same step saved again
/// after a resume) is moved aside first and removed once the new one is in place.
pub(crate) fn commit(temp: &Path, target: &Path) -> Result<()> {
    sync_dir(temp)?;
    let parent = target.parent().expect("a part has a parent folder");
    let aside = target.exists().then(|| {
        let name = target.file_name().expect("a part has a name").to_string_lossy();
        parent.join(super::layout::replaced_name(&name))
    });
    if let Some(aside) = &aside {
        std::fs::rename(target, aside).map_err(io(target, "moving the older copy of this step aside"))?;
    }
    std::fs::rename(temp, target).map_err(io(target, "renaming the finished checkpoint into place"))?;
    sync_dir(parent)?;
    if let Some(aside) = aside {
        let _ = std::fs::remove_dir_all(aside);
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir, "flushing the directory to disk"))
}

pub(crate) fn is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC)
}

/// Free bytes for an unprivileged writer on the file system holding `dir`.
pub(crate) fn available_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}
