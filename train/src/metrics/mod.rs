//! What a run records: one JSONL line per logged step and per evaluation (with wall time), the
//! progress display fed from the same records, and PNG plots of the series.

pub mod plot;
pub mod progress;

pub use progress::Progress;

use crate::trainer::TrainError;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A logged training step: the mean loss since the last record, the learning rate of the
/// step, and the throughput over the same window (the bar shows these very numbers).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRecord {
    pub kind: &'static str,
    pub step: usize,
    pub epoch: usize,
    pub loss: f64,
    pub lr: f64,
    pub throughput: f64,
    pub unit: &'static str,
    /// Seconds since the Unix epoch, and since the run started.
    pub wall_time: f64,
    pub elapsed: f64,
    /// Files that did not decode so far on this rank, replaced or skipped (data.bad_files).
    pub bad_files: usize,
}

/// An evaluation, with the task's metrics as extra keys (`accuracy`, `top5`, `perplexity`).
#[derive(Clone, Debug, PartialEq)]
pub struct EvalRecord {
    pub step: usize,
    pub epoch: usize,
    pub loss: f64,
    pub metrics: Vec<(String, f64)>,
    pub wall_time: f64,
    pub elapsed: f64,
}

pub fn unix_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The run's metrics file and the history the plots are drawn from. Only rank 0 writes.
pub struct MetricsLog {
    path: PathBuf,
    file: Option<std::fs::File>,
    plots: bool,
    pub start: Instant,
    pub steps: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
}

impl MetricsLog {
    /// Starts `dir/metrics.jsonl` afresh (rank 0; other ranks keep the history only).
    pub fn create(dir: &Path, write: bool, plots: bool) -> Result<MetricsLog, TrainError> {
        let path = dir.join("metrics.jsonl");
        let file = if write {
            std::fs::create_dir_all(dir).map_err(|e| TrainError::output(dir, e))?;
            Some(std::fs::File::create(&path).map_err(|e| TrainError::output(&path, e))?)
        } else {
            None
        };
        Ok(MetricsLog {
            path,
            file,
            plots: plots && write,
            start: Instant::now(),
            steps: vec![],
            evals: vec![],
        })
    }

    /// Continues `dir/metrics.jsonl` of a resumed run: the records up to `step` (where the
    /// checkpoint was taken) are kept, later ones (from the steps redone now) dropped.
    pub fn resume(dir: &Path, write: bool, plots: bool, step: usize) -> Result<MetricsLog, TrainError> {
        let path = dir.join("metrics.jsonl");
        let kept: Vec<String> = if write {
            match std::fs::read_to_string(&path) {
                Ok(text) => text
                    .lines()
                    .filter(|l| {
                        serde_json::from_str::<serde_json::Value>(l)
                            .ok()
                            .and_then(|v| v["step"].as_u64())
                            .is_some_and(|s| s as usize <= step)
                    })
                    .map(String::from)
                    .collect(),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        let mut log = MetricsLog::create(dir, write, plots)?;
        if let Some(f) = &mut log.file {
            for line in kept {
                writeln!(f, "{line}").map_err(|e| TrainError::output(&path, e))?;
            }
            f.flush().map_err(|e| TrainError::output(&path, e))?;
        }
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn write_line(&mut self, value: &serde_json::Value) -> Result<(), TrainError> {
        if let Some(f) = &mut self.file {
            writeln!(f, "{value}").and_then(|_| f.flush()).map_err(|e| TrainError::output(&self.path, e))?;
        }
        Ok(())
    }

    pub fn log_step(&mut self, r: StepRecord) -> Result<(), TrainError> {
        let v = serde_json::to_value(&r).expect("a step record is JSON");
        self.write_line(&v)?;
        self.steps.push(r);
        Ok(())
    }

    /// Records an evaluation and redraws the plots beside the metrics file.
    pub fn log_eval(&mut self, r: EvalRecord) -> Result<(), TrainError> {
        let mut v = serde_json::json!({
            "kind": "eval", "step": r.step, "epoch": r.epoch, "loss": r.loss,
            "wall_time": r.wall_time, "elapsed": r.elapsed,
        });
        for (k, x) in &r.metrics {
            v[k] = serde_json::json!(x);
        }
        self.write_line(&v)?;
        self.evals.push(r);
        if self.plots {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            plot::write_all(dir, &self.steps, &self.evals)?;
        }
        Ok(())
    }
}
