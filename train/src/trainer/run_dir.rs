//! A fresh start never writes over a run: a `log.dir` that holds metrics or checkpoints is
//! continued with `--resume`, left for a new `log.dir`, or replaced with `--overwrite`, as
//! Lightning gives every run its own version folder. Writing the new metrics over the old and
//! new checkpoints beside old ones would make a later `--resume` mix two runs.

use super::{checkpoint_dir, TrainError};
use crate::checkpoint::layout::is_run_output;
use crate::config::Config;
use std::path::{Path, PathBuf};

/// What of an earlier run `config` would write over: its metrics file and its checkpoint
/// folders (`step-*`, `final*`).
pub(crate) fn earlier_run(config: &Config) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let metrics = Path::new(&config.log.dir).join("metrics.jsonl");
    if metrics.is_file() {
        found.push(metrics);
    }
    let dir = checkpoint_dir(config);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut saved: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| is_run_output(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        saved.sort();
        found.extend(saved);
    }
    found
}

/// Refuses a fresh start over an earlier run unless `log.overwrite` is set; with it, rank 0
/// deletes the earlier run's metrics and checkpoints. A resumed run goes on in its folder.
pub(crate) fn claim(config: &Config, rank: usize) -> Result<(), TrainError> {
    if !config.checkpoint.resume.is_empty() {
        return Ok(());
    }
    let found = earlier_run(config);
    if found.is_empty() {
        return Ok(());
    }
    if !config.log.overwrite {
        return Err(TrainError::RunExists { dir: PathBuf::from(&config.log.dir), found });
    }
    if rank == 0 {
        for path in &found {
            let removed =
                if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
            removed.map_err(|e| {
                TrainError::output(
                    path,
                    crate::Error::other(format!("cannot delete it for --overwrite: {e}")),
                )
            })?;
        }
    }
    Ok(())
}

/// How to continue: this process's command line as a shell would take it back, with `--resume` in place of
/// any resume or overwrite it had; under `oxtrain launch`, inside the launcher's command, so
/// every rank starts again (a lone `oxtrain train --resume` refuses a checkpoint of N ranks).
pub(crate) fn resume_command(world_size: usize) -> String {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let mut kept = Vec::new();
    let mut iter = words.iter().peekable();
    while let Some(w) = iter.next() {
        if w == "--resume" {
            iter.next_if(|n| !n.contains('=') && !n.starts_with('-'));
        } else if !(w.starts_with("--resume=") || w.starts_with("checkpoint.resume=") || w == "--overwrite") {
            kept.push(shell_word(w));
        }
    }
    let worker = format!("oxtrain {} --resume", kept.join(" "));
    match std::env::var(crate::launch::LAUNCH_COMMAND_VAR) {
        Ok(launcher) => format!("`{launcher} -- {}`", worker.trim_start_matches("oxtrain ")),
        Err(_) if world_size > 1 => {
            format!("the same {world_size} workers as before, each running `{worker}`")
        }
        Err(_) => format!("`{worker}`"),
    }
}

/// `word`, quoted when a shell would split or expand it.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
