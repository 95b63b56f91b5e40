//! Finding checkpoints: the step directories under a checkpoint folder, and the newest one
//! whose every part checks out against its manifest, with the reason each newer one was skipped.

use super::error::{io, Result};
use super::layout::{parse_step_dir as parse, part_name};
use super::manifest::{verify, Manifest, Problem};
use std::fmt;
use std::path::{Path, PathBuf};

/// What lies in a checkpoint folder for one step.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub step: u64,
    pub path: PathBuf,
    /// A temporary directory left by a write that never finished.
    pub partial: bool,
}

/// Step directories and unfinished writes of rank 0, newest step first.
pub(crate) fn list(dir: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir, "listing checkpoints")(e)),
    };
    for entry in read {
        let entry = entry.map_err(io(dir, "listing checkpoints"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((step, partial)) = parse(&name) {
            out.push(Entry { step, path: entry.path(), partial });
        }
    }
    out.sort_by(|a, b| b.step.cmp(&a.step).then(a.partial.cmp(&b.partial)));
    Ok(out)
}

/// Checks step directory `path` and, for a multi-rank checkpoint, every other rank's part.
pub fn verify_checkpoint(path: &Path) -> Result<std::result::Result<Manifest, Problem>> {
    let manifest = match verify(path)? {
        Ok(m) => m,
        Err(p) => return Ok(Err(p)),
    };
    let parent = path.parent().unwrap_or(Path::new("."));
    for rank in 1..manifest.world_size {
        let part = parent.join(part_name(manifest.step, rank));
        match verify(&part)? {
            Ok(m) if m.step == manifest.step && m.world_size == manifest.world_size => {}
            Ok(m) => {
                let why = format!("it says step {} of {} ranks", m.step, m.world_size);
                return Ok(Err(Problem::RankPart { rank, problem: Box::new(Problem::BadManifest(why)) }));
            }
            Err(p) => return Ok(Err(Problem::RankPart { rank, problem: Box::new(p) })),
        }
    }
    Ok(Ok(manifest))
}

/// A checkpoint that was not used, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub path: PathBuf,
    pub problem: Problem,
}

/// The outcome of [`latest_valid`]: the checkpoint picked (if any) and the newer ones skipped.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub dir: PathBuf,
    pub chosen: Option<(PathBuf, Manifest)>,
    pub skipped: Vec<Skipped>,
}

impl Discovery {
    pub fn path(&self) -> Option<&Path> {
        self.chosen.as_ref().map(|(p, _)| p.as_path())
    }

    pub fn step(&self) -> Option<u64> {
        self.chosen.as_ref().map(|(_, m)| m.step)
    }
}

impl fmt::Display for Discovery {
    /// One line per skipped checkpoint, then the choice, as a resumed run should print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.skipped {
            writeln!(f, "skipped checkpoint {}: {}", s.path.display(), s.problem)?;
        }
        match &self.chosen {
            Some((p, m)) => {
                write!(f, "resuming from {} (step {}, epoch {})", p.display(), m.step, m.epoch + 1)
            }
            None => write!(f, "no valid checkpoint in {}", self.dir.display()),
        }
    }
}

/// The newest checkpoint under `dir` (a run's `checkpoints/` folder) whose manifests check
/// out, with every newer one that did not and why (a partial write, a missing or truncated
/// file, a checksum mismatch, a missing rank's part). Every file is read and hashed.
pub fn latest_valid(dir: impl AsRef<Path>) -> Result<Discovery> {
    let dir = dir.as_ref();
    let mut found = Discovery { dir: dir.to_path_buf(), chosen: None, skipped: Vec::new() };
    for entry in list(dir)? {
        if entry.partial {
            found.skipped.push(Skipped { path: entry.path, problem: Problem::Partial });
            continue;
        }
        match verify_checkpoint(&entry.path)? {
            Ok(m) => {
                found.chosen = Some((entry.path, m));
                break;
            }
            Err(problem) => found.skipped.push(Skipped { path: entry.path, problem }),
        }
    }
    Ok(found)
}

/// Removes unfinished writes of `rank`'s parts (left by a process that died mid-write). Run
/// when a writer starts: no other writer of this rank is alive then.
pub(crate) fn remove_stale_temps(dir: &Path, rank: usize) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(part) = name.strip_prefix('.').and_then(|n| n.split_once(".tmp-")).map(|(p, _)| p) else {
            continue;
        };
        let mine = match rank {
            0 => !part.contains(".rank-"),
            r => part.ends_with(&format!(".rank-{r}")),
        };
        if part.starts_with("step-") && mine {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
