//! The fuzz targets' committed corpora (fuzz/corpus/<target>/) and the inputs of every crash
//! they found (fuzz/regressions/<target>/), replayed on stable through the very functions
//! the targets call (fuzz/entries.rs): an input that once panicked, hung or blew up memory
//! must not do so again. Fuzzing itself needs nightly: `cargo +nightly fuzz run <target>`.

#[path = "../../fuzz/entries.rs"]
mod entries;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = vec![];
    for dir in [root.join("corpus").join(target), root.join("regressions").join(target)] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()));
        }
    }
    files.sort();
    files
}

/// Feeds every input of `target` to `run`; fails naming the input that took too long.
fn replay(target: &str, minimum: usize, run: fn(&[u8])) {
    let files = inputs(target);
    assert!(files.len() >= minimum, "{target}: {} corpus files, expected at least {minimum}", files.len());
    let start = Instant::now();
    for f in &files {
        let t = Instant::now();
        run(&std::fs::read(f).unwrap());
        assert!(t.elapsed() < Duration::from_secs(5), "{}: took {:?}", f.display(), t.elapsed());
    }
    eprintln!("{target}: {} inputs in {:?}", files.len(), start.elapsed());
}

#[test]
fn safetensors_corpus() {
    replay("safetensors", 10, entries::safetensors);
}

#[test]
fn config_corpus() {
    replay("config", 10, entries::config);
}

#[test]
fn checkpoint_manifest_corpus() {
    replay("checkpoint_manifest", 5, entries::checkpoint_manifest);
}

#[test]
fn image_corpus() {
    replay("image", 10, entries::image);
}

#[test]
fn store_messages_corpus() {
    replay("store_messages", 5, entries::store_messages);
}
