//! manifest.json: the list of a checkpoint part's files with their sizes and xxh3 checksums.
//! It is written last, so a part without one is a write that never finished; a part whose
//! files do not match it is never used.

use super::error::{io, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Read;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

pub use super::layout::MANIFEST;
pub const FORMAT: &str = "oxtrain-checkpoint";
/// Bumped when the layout changes in a way older readers cannot follow.
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub step: u64,
    pub epoch: u64,
    /// The rank whose part this is (rank 0's part holds the replicated state).
    pub rank: usize,
    pub world_size: usize,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    /// xxh3-64 of the file's bytes, 16 hex digits.
    pub xxh3: String,
}

/// Why a checkpoint (part) is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A write that never finished: the part has no manifest.json.
    Partial,
    BadManifest(String),
    WrongVersion {
        format: String,
        version: u32,
    },
    Missing {
        file: String,
    },
    /// A file shorter (or longer) than the manifest says.
    Truncated {
        file: String,
        bytes: u64,
        expected: u64,
    },
    Checksum {
        file: String,
        found: String,
        expected: String,
    },
    /// Rank `rank`'s part of a multi-rank checkpoint is absent or invalid.
    RankPart {
        rank: usize,
        problem: Box<Problem>,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Partial => write!(f, "partial: no {MANIFEST} (its write never finished)"),
            Problem::BadManifest(e) => write!(f, "{MANIFEST} is unreadable: {e}"),
            Problem::WrongVersion { format, version } => write!(
                f,
                "{MANIFEST} is format {format:?} version {version}; this oxtrain reads {FORMAT:?} version {VERSION}"
            ),
            Problem::Missing { file } => write!(f, "{file} is missing"),
            Problem::Truncated { file, bytes, expected } => {
                write!(f, "{file} is {bytes} bytes, the manifest says {expected} (truncated or overwritten)")
            }
            Problem::Checksum { file, found, expected } => write!(
                f,
                "{file} fails its checksum (xxh3 {found}, the manifest says {expected}): the file changed after it was written"
            ),
            Problem::RankPart { rank, problem } => write!(f, "rank {rank}'s part: {problem}"),
        }
    }
}

/// Streams `reader` through xxh3; returns (bytes, hex digest).
pub fn checksum(mut reader: impl Read) -> std::io::Result<(u64, String)> {
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, hex(hasher.digest())))
}

pub fn hex(digest: u64) -> String {
    format!("{digest:016x}")
}

/// A manifest's text, checked for what the JSON types cannot say: the format and version,
/// a rank inside the world, and file names that stay inside the part's folder (a manifest
/// naming `../../x` or `/etc/passwd` would have the checksum pass read files elsewhere).
pub fn parse(text: &str) -> std::result::Result<Manifest, Problem> {
    let manifest: Manifest = serde_json::from_str(text).map_err(|e| Problem::BadManifest(e.to_string()))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(Problem::WrongVersion { format: manifest.format, version: manifest.version });
    }
    if manifest.rank >= manifest.world_size {
        return Err(Problem::BadManifest(format!(
            "rank {} of a world of {} ranks is impossible",
            manifest.rank, manifest.world_size
        )));
    }
    for entry in &manifest.files {
        let plain = !entry.name.is_empty()
            && Path::new(&entry.name).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(Problem::BadManifest(format!(
                "it lists the file {:?}, which is not a file inside the checkpoint's folder",
                entry.name
            )));
        }
    }
    Ok(manifest)
}

/// Reads `dir`'s manifest and checks every file it lists: presence, size, checksum. The
/// outer `Result` is for I/O errors other than missing files (permissions), the inner one
/// says whether the part is valid.
pub fn verify(dir: &Path) -> Result<std::result::Result<Manifest, Problem>> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err(Problem::Partial)),
        Err(e) => return Err(io(&path, "reading the manifest")(e)),
    };
    let manifest = match parse(&text) {
        Ok(m) => m,
        Err(problem) => return Ok(Err(problem)),
    };
    for entry in &manifest.files {
        let file = dir.join(&entry.name);
        let f = match std::fs::File::open(&file) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Err(Problem::Missing { file: entry.name.clone() }))
            }
            Err(e) => return Err(io(&file, "opening")(e)),
        };
        let len = f.metadata().map_err(io(&file, "reading its size"))?.len();
        if len != entry.bytes {
            return Ok(Err(Problem::Truncated {
                file: entry.name.clone(),
                bytes: len,
                expected: entry.bytes,
            }));
        }
        let (_, digest) = checksum(std::io::BufReader::new(f)).map_err(io(&file, "reading"))?;
        if digest != entry.xxh3 {
            return Ok(Err(Problem::Checksum {
                file: entry.name.clone(),
                found: digest,
                expected: entry.xxh3.clone(),
            }));
        }
    }
    Ok(Ok(manifest))
}
