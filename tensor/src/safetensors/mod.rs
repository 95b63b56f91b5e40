//! Reading and writing [safetensors](https://github.com/huggingface/safetensors) files, the
//! checkpoint format PyTorch, Hugging Face and oxtrain share.
//!
//! ```no_run
//! use oxtrain_tensor::{safetensors, DType, Device, Tensor};
//!
//! let w = Tensor::ones([2, 3], DType::F32, Device::Cpu)?;
//! safetensors::save(&[("w", &w)], None, "model.safetensors")?;
//! let file = safetensors::load("model.safetensors")?;
//! let w = file.get_checked("w", &[2, 3], DType::F32)?;
//! # Ok::<(), oxtrain_tensor::Error>(())
//! ```
//!
//! A file is an 8-byte little-endian header length `n`, `n` bytes of JSON mapping each tensor
//! name to its dtype, shape and byte range (`data_offsets`, relative to the data section), an
//! optional `__metadata__` map of strings, then the tightly packed row-major little-endian data.
//!
//! [`load`] maps the file into memory and validates the whole header before anything else:
//! the header length against the file size (so a corrupt prefix never causes a huge
//! allocation), every dtype, every shape's byte size against its offsets, and that the byte
//! ranges tile the data section exactly. Tensors are then copied out one at a time on demand.
//! Mapping a file assumes nobody truncates it while it is mapped, as every mmap-based loader does.
//!
//! [`save`] writes a temporary file beside the target, flushes it to disk and renames it over
//! the target, so a crash or an error part-way leaves the previous file intact.

#[cfg(test)]
mod tests;
mod write;

pub use write::{plan, save, write_to, FilePlan, NamedTensor};

use crate::storage::CpuStorage;
use crate::{DType, Device, Element, Error, Result, Tensor};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

// Element bytes are copied as they are in memory, and safetensors stores them little-endian.
#[cfg(target_endian = "big")]
compile_error!("oxtrain-tensor's safetensors I/O assumes a little-endian host");

/// Headers larger than this are refused, as the reference implementation does: no real
/// checkpoint comes close, and parsing a gigabyte of JSON is a denial of service.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The dtype names of the safetensors format that oxtrain supports.
const SUPPORTED: &str = "F32, F64, F16, BF16, I64, U32, U8 and BOOL";

pub(crate) fn dtype_to_str(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::U32 => "U32",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

fn dtype_from_str(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_to_str(d) == s)
}

/// Dtype and shape of one tensor in a file, read from the header alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    data: std::ops::Range<usize>,
}

/// The bytes of a file: mapped from disk, or owned (a file received over the network or
/// built in memory, given to [`load_bytes`]).
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An open safetensors file: a validated header over a memory map of the file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Bytes,
    data_start: usize,
    /// Names in the order their data sits in the file.
    names: Vec<String>,
    infos: HashMap<String, TensorInfo>,
    metadata: HashMap<String, String>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SafetensorsFile({}, {} tensors)", self.path.display(), self.names.len())
    }
}

/// Opens, maps and validates `path`; tensors are read later with [`SafetensorsFile::get`].
pub fn load(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
    SafetensorsFile::open(path.as_ref())
}

/// Validates a whole safetensors file held in memory, as [`load`] does a file on disk;
/// `name` stands for the file's path in error messages.
pub fn load_bytes(bytes: Vec<u8>, name: impl Into<PathBuf>) -> Result<SafetensorsFile> {
    let path = name.into();
    let len = bytes.len() as u64;
    if len < 8 {
        return Err(too_short(&path, len));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    check_header_len(&path, header_len, len)?;
    SafetensorsFile::from_bytes(path, Bytes::Owned(bytes), header_len as usize)
}

fn too_short(path: &Path, file_len: u64) -> Error {
    Error::SafetensorsFormat {
        path: path.to_path_buf(),
        reason: format!(
            "the file is {file_len} bytes long, too short for the 8-byte header length; it is \
             truncated or not a safetensors file - save or download it again"
        ),
    }
}

/// The header length prefix against the file's size, before anything is mapped or allocated.
fn check_header_len(path: &Path, header_len: u64, file_len: u64) -> Result<()> {
    let format_err = |reason: String| Error::SafetensorsFormat { path: path.to_path_buf(), reason };
    if header_len > file_len - 8 {
        return Err(format_err(format!(
            "the header length prefix says {header_len} bytes, but only {} bytes follow it; \
             the file is truncated or not a safetensors file - save or download it again",
            file_len - 8
        )));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(format_err(format!(
            "the header is {header_len} bytes, over the {MAX_HEADER_BYTES}-byte limit; the file is corrupt"
        )));
    }
    Ok(())
}

/// Every tensor of `path`, in file order, on the CPU.
pub fn load_all(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let file = load(path)?;
    file.names().iter().map(|name| Ok((name.clone(), file.get(name)?))).collect()
}

impl SafetensorsFile {
    fn open(path: &Path) -> Result<SafetensorsFile> {
        let io_err = |source| Error::Io { path: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(io_err)?;
        let file_len = file.metadata().map_err(io_err)?.len();
        if file_len < 8 {
            return Err(too_short(path, file_len));
        }
        // Check the header length against the file size before mapping or allocating anything.
        let mut prefix = [0u8; 8];
        file.read_exact(&mut prefix).map_err(io_err)?;
        let header_len = u64::from_le_bytes(prefix);
        check_header_len(path, header_len, file_len)?;
        // SAFETY: the map is read-only; like every mmap loader we rely on nobody truncating
        // the file while it is open (that would fault, not corrupt memory silently).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        if mmap.len() as u64 != file_len {
            return Err(Error::SafetensorsFormat {
                path: path.to_path_buf(),
                reason: "the file changed size while being opened; try again".into(),
            });
        }
        SafetensorsFile::from_bytes(path.to_path_buf(), Bytes::Mapped(mmap), header_len as usize)
    }

    /// `bytes` whose length prefix has been checked: parses and validates the header.
    fn from_bytes(path: PathBuf, bytes: Bytes, header_len: usize) -> Result<SafetensorsFile> {
        let data_start = 8 + header_len;
        let header = parse_header(&bytes[8..data_start], bytes.len() - data_start, &path)?;
        Ok(SafetensorsFile {
            path,
            mmap: bytes,
            data_start,
            names: header.names,
            infos: header.infos,
            metadata: header.metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names in the order their data sits in the file.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.infos.contains_key(name)
    }

    /// The `__metadata__` map of the header (empty when the file has none).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Dtype and shape of `name` without reading its data.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.infos.get(name)
    }

    /// The tensor `name`, copied out of the file into CPU memory.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let info = self.infos.get(name).ok_or_else(|| self.missing(name))?;
        let bytes = &self.mmap[self.data_start + info.data.start..self.data_start + info.data.end];
        let storage = storage_from_le_bytes(info.dtype, bytes);
        Ok(Tensor::from_cpu(storage, info.shape.as_slice()))
    }

    /// The tensor `name` on `device`.
    pub fn get_on(&self, name: &str, device: Device) -> Result<Tensor> {
        self.get(name)?.to_device(device)
    }

    /// The tensor `name`, or an error naming the file and the tensor unless it has exactly
    /// `shape` and `dtype` (what loading a checkpoint into a model needs).
    pub fn get_checked(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let info = self.infos.get(name).ok_or_else(|| self.missing(name))?;
        if info.shape != shape || info.dtype != dtype {
            return Err(self.tensor_err(
                name,
                format!(
                    "the file has shape {:?} and dtype {}, expected shape {shape:?} and dtype {dtype}; \
                     the checkpoint was saved from a different model or configuration",
                    info.shape, info.dtype
                ),
            ));
        }
        self.get(name)
    }

    fn missing(&self, name: &str) -> Error {
        const SHOWN: usize = 8;
        let mut listed =
            self.names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        if self.names.len() > SHOWN {
            listed.push_str(&format!(", ... ({} more)", self.names.len() - SHOWN));
        }
        self.tensor_err(
            name,
            format!(
                "no tensor of this name in the file (it holds {} tensors: {listed}); check the name",
                self.len()
            ),
        )
    }

    fn tensor_err(&self, name: &str, reason: String) -> Error {
        Error::SafetensorsTensor { path: self.path.clone(), name: name.to_string(), reason }
    }
}

/// Copies little-endian element bytes into typed storage. Goes through a copy because the
/// data in a file need not be aligned for its type; bool bytes other than 0 read as true.
pub(crate) fn storage_from_le_bytes(dtype: DType, bytes: &[u8]) -> CpuStorage {
    fn pod<T: Element + bytemuck::Pod>(bytes: &[u8]) -> CpuStorage {
        let mut values = vec![T::zero(); bytes.len() / std::mem::size_of::<T>()];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(bytes);
        T::into_storage(values)
    }
    match dtype {
        DType::F32 => pod::<f32>(bytes),
        DType::F64 => pod::<f64>(bytes),
        DType::F16 => pod::<half::f16>(bytes),
        DType::BF16 => pod::<half::bf16>(bytes),
        DType::I64 => pod::<i64>(bytes),
        DType::U32 => pod::<u32>(bytes),
        DType::U8 => CpuStorage::U8(bytes.to_vec()),
        DType::Bool => CpuStorage::Bool(bytes.iter().map(|&b| b != 0).collect()),
    }
}

struct Header {
    names: Vec<String>,
    infos: HashMap<String, TensorInfo>,
    metadata: HashMap<String, String>,
}

/// One header entry as JSON gives it, before validation.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInfo {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// The header's entries in file order, or the first name that appears twice. A JSON map
/// keeps the last of two equal keys, which would hide the first tensor and report its bytes
/// as a gap; reading the entries one by one finds the real fault.
enum EntriesInOrder {
    Unique(Vec<(String, serde_json::Value)>),
    Duplicate(String),
}

impl<'de> serde::Deserialize<'de> for EntriesInOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = EntriesInOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut entries = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !seen.insert(name.clone()) {
                        return Ok(EntriesInOrder::Duplicate(name));
                    }
                    entries.push((name, value));
                }
                Ok(EntriesInOrder::Unique(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Validates the JSON header against a data section of `data_len` bytes.
fn parse_header(header: &[u8], data_len: usize, path: &Path) -> Result<Header> {
    let format_err = |reason: String| Error::SafetensorsFormat { path: path.to_path_buf(), reason };
    let tensor_err = |name: &str, reason: String| Error::SafetensorsTensor {
        path: path.to_path_buf(),
        name: name.into(),
        reason,
    };
    let text = std::str::from_utf8(header).map_err(|e| {
        format_err(format!("the header is not UTF-8 ({e}); the file is corrupt or not a safetensors file"))
    })?;
    let json = match serde_json::from_str::<EntriesInOrder>(text) {
        Ok(EntriesInOrder::Unique(entries)) => entries,
        Ok(EntriesInOrder::Duplicate(name)) => {
            return Err(tensor_err(
                &name,
                "the header names this tensor twice; a safetensors header holds each name once - \
                 the file was written by a broken tool or edited by hand, save it again"
                    .into(),
            ))
        }
        Err(e) => {
            return Err(format_err(format!(
                "the header is not a JSON object ({e}); the file is corrupt or not a safetensors file"
            )))
        }
    };

    let mut metadata = HashMap::new();
    let mut entries: Vec<(String, TensorInfo)> = Vec::with_capacity(json.len());
    for (name, value) in json {
        if name == "__metadata__" {
            metadata = serde_json::from_value(value).map_err(|e| {
                format_err(format!("`__metadata__` must map strings to strings ({e}); the header is corrupt"))
            })?;
            continue;
        }
        let raw: RawInfo = serde_json::from_value(value).map_err(|e| {
            tensor_err(
                &name,
                format!("bad header entry ({e}); expected {{\"dtype\", \"shape\", \"data_offsets\"}}"),
            )
        })?;
        let dtype = dtype_from_str(&raw.dtype).ok_or_else(|| {
            let known = serde_json::from_value::<::safetensors::Dtype>(raw.dtype.clone().into()).is_ok();
            let what = if known { "is not supported by oxtrain" } else { "is not a safetensors dtype" };
            tensor_err(
                &name,
                format!(
                    "dtype {} {what}; supported are {SUPPORTED} - convert the tensor before saving \
                     (in PyTorch: `t.to(torch.float32)`)",
                    raw.dtype
                ),
            )
        })?;
        let [start, end] = raw.data_offsets;
        let nbytes = raw
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .ok_or_else(|| {
                tensor_err(
                    &name,
                    format!("shape {:?} has too many elements to address; the header is corrupt", raw.shape),
                )
            })?;
        if end < start {
            return Err(tensor_err(
                &name,
                format!("data_offsets [{start}, {end}] end before they start; the header is corrupt"),
            ));
        }
        if end > data_len {
            return Err(tensor_err(
                &name,
                format!(
                    "data_offsets [{start}, {end}] reach past the end of the data section ({data_len} bytes); \
                     the file is truncated - save or download it again"
                ),
            ));
        }
        if end - start != nbytes {
            return Err(tensor_err(
                &name,
                format!(
                    "dtype {} and shape {:?} need {nbytes} bytes, but data_offsets [{start}, {end}] span {}; \
                     the header is corrupt",
                    raw.dtype,
                    raw.shape,
                    end - start
                ),
            ));
        }
        entries.push((name, TensorInfo { dtype, shape: raw.shape, data: start..end }));
    }

    // The byte ranges must tile the data section: no overlap, no gap, nothing after.
    entries.sort_by(|(na, a), (nb, b)| (a.data.start, a.data.end, na).cmp(&(b.data.start, b.data.end, nb)));
    let mut covered = 0;
    let mut previous: Option<&str> = None;
    for (name, info) in &entries {
        if info.data.start != covered {
            let relation = if info.data.start < covered { "overlap" } else { "leave a gap after" };
            let prev =
                previous.map_or("the start of the data section".to_string(), |p| format!("tensor `{p}`"));
            return Err(tensor_err(
                name,
                format!(
                    "data_offsets [{}, {}] {relation} {prev} (which ends at byte {covered}); safetensors data \
                     must be tightly packed - the header is corrupt",
                    info.data.start, info.data.end
                ),
            ));
        }
        covered = info.data.end;
        previous = Some(name.as_str());
    }
    if covered != data_len {
        return Err(format_err(format!(
            "the tensors cover {covered} bytes of data but the file has {data_len}; the file has trailing \
             bytes or a corrupt header - save it again"
        )));
    }

    let names = entries.iter().map(|(n, _)| n.clone()).collect();
    Ok(Header { names, infos: entries.into_iter().collect(), metadata })
}
