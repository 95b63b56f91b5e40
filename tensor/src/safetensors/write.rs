//! Saving tensors to a safetensors file, atomically.

use super::dtype_to_str;
use crate::storage::Storage;
use crate::{Error, Result, Tensor};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A (name, tensor) pair as [`save`] takes them: `(&str, &Tensor)`, `(String, Tensor)`, the
/// items of a `HashMap<String, Tensor>` or `BTreeMap` by reference, and references to any of these.
pub trait NamedTensor {
    fn name(&self) -> &str;
    fn tensor(&self) -> &Tensor;
}

impl<S: AsRef<str>> NamedTensor for (S, Tensor) {
    fn name(&self) -> &str {
        self.0.as_ref()
    }
    fn tensor(&self) -> &Tensor {
        &self.1
    }
}

impl<S: AsRef<str>> NamedTensor for (S, &Tensor) {
    fn name(&self) -> &str {
        self.0.as_ref()
    }
    fn tensor(&self) -> &Tensor {
        self.1
    }
}

impl<N: NamedTensor> NamedTensor for &N {
    fn name(&self) -> &str {
        (*self).name()
    }
    fn tensor(&self) -> &Tensor {
        (*self).tensor()
    }
}

/// Writes `tensors` (and the optional `__metadata__` strings) to `path` as safetensors.
///
/// Non-contiguous tensors are written in row-major order. Data is laid out largest element
/// size first, keeping the given order within one size, so every tensor's data is aligned
/// for its type in the file (as the reference implementation does; zero-copy readers need it).
/// The file is written beside `path` under a temporary name, flushed to disk, then renamed
/// over `path`: a crash or an error part-way leaves any previous file untouched.
/// Pass a `Vec` or a `BTreeMap` rather than a `HashMap` for byte-identical files across runs.
pub fn save<I>(tensors: I, metadata: Option<&HashMap<String, String>>, path: impl AsRef<Path>) -> Result<()>
where
    I: IntoIterator,
    I::Item: NamedTensor,
{
    let path = path.as_ref();
    let layout = FileLayout::new(tensors, metadata, path)?;
    write_atomically(path, |w| layout.write_to(w))
}

/// The bytes of the safetensors file [`save`] would write, into `out` (a file the caller
/// manages, a socket, a hashing writer). `name` stands for the destination in error messages.
/// Returns the number of bytes written.
pub fn write_to<I>(
    tensors: I,
    metadata: Option<&HashMap<String, String>>,
    out: &mut impl Write,
    name: &Path,
) -> Result<u64>
where
    I: IntoIterator,
    I::Item: NamedTensor,
{
    let layout = FileLayout::new(tensors, metadata, name)?;
    layout.write_to(out).map_err(|source| Error::SaveFailed {
        path: name.into(),
        stage: "writing",
        source,
    })?;
    Ok(layout.len_bytes())
}

/// Where the file [`write_to`] would write puts everything: its first bytes (the header's
/// length and the header) and each tensor's data, for a writer that places the bytes itself
/// (a checkpoint copying tensors straight into the memory it hands to the disk).
#[derive(Debug, Clone)]
pub struct FilePlan {
    /// The file's first bytes: the header's length (u64, little-endian) and the header.
    pub prefix: Vec<u8>,
    /// Each tensor's bytes in the file, in the order the tensors were given (row-major,
    /// little-endian, as [`write_to`] writes them).
    pub ranges: Vec<Range<usize>>,
    /// The file's length in bytes.
    pub len: usize,
}

/// The layout of the file [`write_to`] would write for `tensors`, without writing it.
/// `name` stands for the destination in error messages (duplicate or reserved names).
pub fn plan<I>(tensors: I, metadata: Option<&HashMap<String, String>>, name: &Path) -> Result<FilePlan>
where
    I: IntoIterator,
    I::Item: NamedTensor,
{
    let layout =
        FileLayout::new(tensors.into_iter().enumerate().map(|(i, t)| Indexed(i, t)), metadata, name)?;
    let mut prefix = (layout.header.len() as u64).to_le_bytes().to_vec();
    prefix.extend_from_slice(&layout.header);
    let mut ranges = vec![0..0; layout.entries.len()];
    let mut offset = prefix.len();
    for e in &layout.entries {
        let t = e.tensor();
        let end = offset + t.elem_count() * t.dtype().size_in_bytes();
        ranges[e.0] = offset..end;
        offset = end;
    }
    Ok(FilePlan { prefix, ranges, len: layout.len_bytes() as usize })
}

/// A tensor and its place in the caller's order.
struct Indexed<T>(usize, T);

impl<T: NamedTensor> NamedTensor for Indexed<T> {
    fn name(&self) -> &str {
        self.1.name()
    }
    fn tensor(&self) -> &Tensor {
        self.1.tensor()
    }
}

/// A validated, ordered set of tensors and the header that describes them.
struct FileLayout<T> {
    header: Vec<u8>,
    entries: Vec<T>,
    data_bytes: usize,
}

impl<T: NamedTensor> FileLayout<T> {
    fn new<I>(tensors: I, metadata: Option<&HashMap<String, String>>, path: &Path) -> Result<FileLayout<T>>
    where
        I: IntoIterator<Item = T>,
    {
        let mut entries: Vec<T> = tensors.into_iter().collect();
        let mut seen = HashSet::new();
        for e in &entries {
            let reason = if e.name() == "__metadata__" {
                "this name is reserved for the metadata map; rename the tensor"
            } else if !seen.insert(e.name()) {
                "two tensors have this name; names in a safetensors file must be unique"
            } else {
                continue;
            };
            return Err(Error::SafetensorsTensor {
                path: path.into(),
                name: e.name().into(),
                reason: reason.into(),
            });
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.tensor().dtype().size_in_bytes()));

        let mut header = serde_json::Map::new();
        if let Some(metadata) = metadata {
            header.insert("__metadata__".into(), serde_json::to_value(metadata).expect("strings serialise"));
        }
        let mut offset = 0usize;
        for e in &entries {
            let t = e.tensor();
            let nbytes = t.elem_count() * t.dtype().size_in_bytes();
            header.insert(
                e.name().into(),
                serde_json::json!({
                    "dtype": dtype_to_str(t.dtype()),
                    "shape": t.dims(),
                    "data_offsets": [offset, offset + nbytes],
                }),
            );
            offset += nbytes;
        }
        let mut header = serde_json::to_vec(&header).expect("a JSON map serialises");
        // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
        header.resize(header.len().next_multiple_of(8), b' ');
        Ok(FileLayout { header, entries, data_bytes: offset })
    }

    fn len_bytes(&self) -> u64 {
        (8 + self.header.len() + self.data_bytes) as u64
    }

    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&(self.header.len() as u64).to_le_bytes())?;
        w.write_all(&self.header)?;
        for e in &self.entries {
            write_row_major(w, e.tensor())?;
        }
        Ok(())
    }
}

/// The elements' little-endian bytes in row-major order, copying only non-contiguous views.
fn write_row_major(w: &mut impl Write, t: &Tensor) -> std::io::Result<()> {
    if t.elem_count() == 0 {
        return Ok(());
    }
    // GPU tensors are copied to the host first; a failed copy is reported as a write error.
    let t = t.to_device(crate::Device::Cpu).map_err(|e| std::io::Error::other(e.to_string()))?;
    let t = if t.is_contiguous() { t.clone() } else { t.copy() };
    let size = t.dtype().size_in_bytes();
    let start = t.layout().offset() * size;
    let end = start + t.elem_count() * size;
    let storage = t.storage();
    match &*storage {
        Storage::Cpu(s) => w.write_all(&s.as_bytes()[start..end]),
        Storage::Cuda(_) => unreachable!("copied to the host above"),
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Runs `write` on a new temporary file in `path`'s folder, syncs it and renames it to `path`.
/// On any failure the temporary file is removed and `path` is left as it was.
pub(crate) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    let fail = |stage, source| Error::SaveFailed { path: path.to_path_buf(), stage, source };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        fail("the path names no file", std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))
    })?;
    let temp = folder.join(format!(
        ".{}.{}-{}.tmp",
        file_name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(|e| fail("creating a temporary file in its folder", e))?;
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w).map_err(|e| fail("writing", e))?;
        let file = w.into_inner().map_err(|e| fail("writing", e.into_error()))?;
        file.sync_all().map_err(|e| fail("flushing to disk", e))?;
        drop(file);
        std::fs::rename(&temp, path).map_err(|e| fail("renaming the temporary file into place", e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
        return result;
    }
    // Make the rename itself durable. Best effort: the data is already safe on disk, and some
    // platforms and file systems cannot open or sync a folder.
    if let Ok(dir) = File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}
