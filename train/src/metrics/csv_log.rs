//! The run's records as CSV for spreadsheets: `log.csv` has a row per logged training step,
//! `eval.csv` a row per evaluation (its metric columns are the task's, known from the first
//! evaluation). Both start with a header row.

use super::{EvalRecord, StepRecord};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const STEP_FILE: &str = "log.csv";
pub const EVAL_FILE: &str = "eval.csv";

const STEP_COLUMNS: [&str; 10] =
    ["step", "epoch", "loss", "lr", "grad_norm", "throughput", "unit", "wall_time", "elapsed", "bad_files"];

/// The two CSV files of a run being written.
pub struct CsvLog {
    dir: PathBuf,
    steps: csv::Writer<File>,
    evals: Option<(csv::Writer<File>, Vec<String>)>,
}

fn io(e: csv::Error) -> std::io::Error {
    e.into()
}

impl CsvLog {
    /// Starts `dir/log.csv` afresh (and removes an earlier run's `eval.csv`, which the first
    /// evaluation writes anew).
    pub fn create(dir: &Path) -> Result<CsvLog, (PathBuf, std::io::Error)> {
        let eval = dir.join(EVAL_FILE);
        match std::fs::remove_file(&eval) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err((eval, e)),
            _ => {}
        }
        let path = dir.join(STEP_FILE);
        let mut steps = csv::Writer::from_path(&path).map_err(|e| (path.clone(), io(e)))?;
        steps
            .write_record(STEP_COLUMNS)
            .and_then(|_| Ok(steps.flush()?))
            .map_err(|e| (path.clone(), io(e)))?;
        Ok(CsvLog { dir: dir.to_path_buf(), steps, evals: None })
    }

    pub fn step(&mut self, r: &StepRecord) -> Result<(), (PathBuf, std::io::Error)> {
        let grad_norm = r.grad_norm.map(|g| g.to_string()).unwrap_or_default();
        let row = [
            r.step.to_string(),
            r.epoch.to_string(),
            r.loss.to_string(),
            r.lr.to_string(),
            grad_norm,
            r.throughput.to_string(),
            r.unit.to_string(),
            r.wall_time.to_string(),
            r.elapsed.to_string(),
            r.bad_files.to_string(),
        ];
        let path = self.dir.join(STEP_FILE);
        self.steps.write_record(&row).map_err(|e| (path.clone(), io(e)))?;
        self.steps.flush().map_err(|e| (path, e))
    }

    pub fn eval(&mut self, r: &EvalRecord) -> Result<(), (PathBuf, std::io::Error)> {
        let path = self.dir.join(EVAL_FILE);
        if self.evals.is_none() {
            let names: Vec<String> = r.metrics.iter().map(|(k, _)| k.clone()).collect();
            let mut w = csv::Writer::from_path(&path).map_err(|e| (path.clone(), io(e)))?;
            let header = ["step", "epoch", "loss"]
                .into_iter()
                .map(String::from)
                .chain(names.iter().cloned())
                .chain(["wall_time".into(), "elapsed".into()]);
            w.write_record(header.collect::<Vec<_>>()).map_err(|e| (path.clone(), io(e)))?;
            self.evals = Some((w, names));
        }
        let (w, names) = self.evals.as_mut().expect("set above");
        // A metric missing from this evaluation is an empty cell, not a shifted row.
        let metric = |n: &String| r.metrics.iter().find(|(k, _)| k == n).map(|(_, v)| v.to_string());
        let row: Vec<String> = [r.step.to_string(), r.epoch.to_string(), r.loss.to_string()]
            .into_iter()
            .chain(names.iter().map(|n| metric(n).unwrap_or_default()))
            .chain([r.wall_time.to_string(), r.elapsed.to_string()])
            .collect();
        w.write_record(&row).map_err(|e| (path.clone(), io(e)))?;
        w.flush().map_err(|e| (path, e))
    }
}
