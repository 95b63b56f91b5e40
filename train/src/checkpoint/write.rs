//! Writing one checkpoint part atomically: every file into a temporary directory beside the
//! target, each fsynced, the manifest last, the directory fsynced and renamed into place, the
//! parent fsynced. A crash at any point leaves either the complete part or a hidden temporary
//! directory that discovery reports and skips.

use super::durable::write_durably;
use super::error::{io, CheckpointError, Result};
use super::image::FileImage;
use super::manifest::{hex, FileEntry, Manifest, FORMAT, MANIFEST, VERSION};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// What a part's file holds.
pub(crate) enum Content {
    /// A safetensors file, laid out in page-aligned memory as it goes to disk.
    Image(FileImage),
    Bytes(Vec<u8>),
}

impl Content {
    fn bytes(&self) -> &[u8] {
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

/// The identity of a part: where, which step, whose.
pub(crate) struct PartInfo<'a> {
    pub parent: &'a Path,
    pub name: String,
    pub step: u64,
    pub epoch: u64,
    pub rank: usize,
    pub world_size: usize,
    pub progress: Option<&'a ProgressFn>,
    /// The newest committed checkpoint, named in a disk-full error.
    pub previous: Option<PathBuf>,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The prefix of `name`'s temporary directories (hidden, so tools listing checkpoints skip them).
pub(crate) fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// Writes `files` plus a manifest as the part `info.name` under `info.parent`. Returns the
/// committed directory and its size in bytes.
pub(crate) fn write_part(info: &PartInfo<'_>, files: &[PartFile]) -> Result<(PathBuf, u64)> {
    let parent = info.parent;
    std::fs::create_dir_all(parent).map_err(io(parent, "creating the checkpoint folder"))?;
    let total: u64 = files.iter().map(|f| f.content.bytes().len() as u64).sum();
    let target = parent.join(&info.name);
    let disk_full = |available| CheckpointError::DiskFull {
        path: target.clone(),
        needed: total,
        available,
        previous: info.previous.clone(),
    };
    let available = available_bytes(parent);
    if available.is_some_and(|a| a < total) {
        return Err(disk_full(available));
    }
    let temp = parent.join(format!(
        "{}{}-{}",
        temp_prefix(&info.name),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&temp).map_err(io(&temp, "creating the temporary checkpoint directory"))?;
    let result = write_files(info, &temp, files, total).and_then(|bytes| {
        commit(&temp, &target)?;
        Ok(bytes)
    });
    match result {
        Ok(bytes) => Ok((target, bytes)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&temp);
            match e {
                CheckpointError::Io { source, .. } if is_disk_full(&source) => {
                    Err(disk_full(available_bytes(parent)))
                }
                e => Err(e),
            }
        }
    }
}

/// Writes the files side by side (one thread each: the model and the optimizer state are
/// the bulk, and one stream alone does not keep a disk busy), then the manifest.
fn write_files(info: &PartInfo<'_>, temp: &Path, files: &[PartFile], total: u64) -> Result<u64> {
    let written = AtomicU64::new(0);
    let counter = &written;
    let entries: Vec<Result<FileEntry>> = std::thread::scope(|scope| {
        let writers: Vec<_> =
            files.iter().map(|f| scope.spawn(move || write_file(info, temp, f, counter, total))).collect();
        writers.into_iter().map(|w| w.join().expect("a checkpoint file writer panicked")).collect()
    });
    let entries = entries.into_iter().collect::<Result<Vec<_>>>()?;
    if let Some(p) = info.progress {
        // The last point before the part can commit: every file is on disk, the manifest not yet.
        let so_far = written.load(Ordering::Relaxed);
        p(&WriteProgress { step: info.step, file: MANIFEST.into(), written: so_far, total });
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        step: info.step,
        epoch: info.epoch,
        rank: info.rank,
        world_size: info.world_size,
        files: entries,
    };
    let path = temp.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
    let mut file = File::create(&path).map_err(io(&path, "creating"))?;
    file.write_all(&json).map_err(io(&path, "writing"))?;
    file.sync_all().map_err(io(&path, "flushing to disk"))?;
    Ok(written.into_inner() + json.len() as u64)
}

fn write_file(
    info: &PartInfo<'_>,
    temp: &Path,
    f: &PartFile,
    written: &AtomicU64,
    total: u64,
) -> Result<FileEntry> {
    let path = temp.join(&f.name);
    let bytes = f.content.bytes();
    // `write_durably` reports this file's bytes so far; the part's count goes up by the difference.
    let file_written = AtomicU64::new(0);
    let report = |w: u64| {
        let new = w.saturating_sub(file_written.fetch_max(w, Ordering::Relaxed));
        let so_far = written.fetch_add(new, Ordering::Relaxed) + new;
        if let Some(p) = info.progress {
            p(&WriteProgress { step: info.step, file: f.name.clone(), written: so_far, total });
        }
    };
    let file = File::create_new(&path).map_err(io(&path, "creating"))?;
    // The bytes do not change while they are written, so hashing them beside the write
    // (the writing thread mostly waits for the device) checksums exactly what is written.
    let (digest, done) = std::thread::scope(|s| {
        let hasher = (bytes.len() >= HASH_BESIDE).then(|| s.spawn(|| xxh3_64(bytes)));
        let done = write_durably(&file, bytes, &report);
        let digest = match hasher {
            Some(h) => h.join().expect("the checksum thread panicked"),
            None => xxh3_64(bytes),
        };
        (digest, done)
    });
    done.map_err(io(&path, "writing and flushing to disk"))?;
    Ok(FileEntry { name: f.name.clone(), bytes: bytes.len() as u64, xxh3: hex(digest) })
}

/// Renames `temp` to `target` durably. A part already at `target` (the same step saved again
/// after a resume) is moved aside first and removed once the new one is in place.
fn commit(temp: &Path, target: &Path) -> Result<()> {
    sync_dir(temp)?;
    let parent = target.parent().expect("a part has a parent folder");
    let aside = target.exists().then(|| {
        let name = target.file_name().expect("a part has a name").to_string_lossy();
        parent.join(format!(".{name}.replaced-{}", std::process::id()))
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

fn is_disk_full(e: &std::io::Error) -> bool {
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
