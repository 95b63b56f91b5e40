//! The progress display: an indicatif bar on a terminal (epoch, step, loss, lr, throughput,
//! ETA), plain lines otherwise, nothing on ranks other than 0. Both show a [`StepRecord`], so
//! the numbers are those of the metrics file.

use super::StepRecord;
use crate::config::ProgressMode;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    epochs: usize,
}

/// One record as the bar's message and the log line show it.
pub fn describe(r: &StepRecord) -> String {
    format!("loss {:.4} lr {:.3e} {:.1} {}", r.loss, r.lr, r.throughput, r.unit)
}

impl Progress {
    pub fn new(mode: ProgressMode, rank: usize, total_steps: usize, epochs: usize) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let (bar, lines) = match (rank, mode) {
            (r, _) if r != 0 => (false, false),
            (_, ProgressMode::Off) => (false, false),
            (_, ProgressMode::Lines) => (false, true),
            (_, ProgressMode::Bar) => (true, false),
            (_, ProgressMode::Auto) => (terminal, !terminal),
        };
        let bar = bar.then(|| {
            let b = ProgressBar::with_draw_target(Some(total_steps as u64), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{prefix} [{bar:24}] step {pos}/{len} {msg} ETA {eta}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            b
        });
        Progress { bar, lines, epochs }
    }

    pub fn start_epoch(&self, epoch: usize) {
        if let Some(b) = &self.bar {
            b.set_prefix(format!("epoch {}/{}", epoch + 1, self.epochs));
        }
    }

    /// One optimizer step done.
    pub fn step(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    pub fn record(&self, r: &StepRecord, total: usize) {
        if let Some(b) = &self.bar {
            b.set_message(describe(r));
        } else if self.lines {
            eprintln!("epoch {}/{} step {}/{} {}", r.epoch, self.epochs, r.step, total, describe(r));
        }
    }

    /// A line above the bar (evaluations, warnings), or on stderr.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None if self.lines => eprintln!("{line}"),
            None => {}
        }
    }

    /// A warning: above the bar, or on stderr even with the progress display off. Call it on
    /// rank 0 only.
    pub fn warn(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Clears the bar, so whatever follows starts on its own line.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
