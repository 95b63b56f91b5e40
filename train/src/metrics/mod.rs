//! What a run records: one JSONL line per logged step and per evaluation (with wall time), the
//! same scalars as a TensorBoard event file and as CSV, the progress display fed from the same
//! records, and PNG plots of the series.

pub mod csv_log;
pub mod plot;
pub mod progress;
pub mod tensorboard;

pub use progress::Progress;

use crate::config::LogConfig;
use crate::runtime::TrainError;
use csv_log::CsvLog;
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
    /// The epoch the step belongs to, counted from 1 (as the progress line and every message).
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
    /// JPEGs the GPU decoder refused and the CPU decoded instead, so far on this rank (only
    /// with data.decode on the GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_decode_fallbacks: Option<usize>,
    /// The gradient's global L2 norm at the logged step (before clipping), when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
}

/// An evaluation, with the task's metrics as extra keys (`accuracy`, `top5`, `perplexity`).
#[derive(Clone, Debug, PartialEq)]
pub struct EvalRecord {
    pub step: usize,
    /// Counted from 1, as in [`StepRecord`].
    pub epoch: usize,
    pub loss: f64,
    pub metrics: Vec<(String, f64)>,
    pub wall_time: f64,
    pub elapsed: f64,
}

/// A step record read back from metrics.jsonl (for the plots of a resumed run).
fn step_record(v: &serde_json::Value) -> StepRecord {
    let unit = ["img/s", "tokens/s", "samples/s"].into_iter().find(|u| v["unit"] == *u).unwrap_or("");
    StepRecord {
        kind: "train",
        step: v["step"].as_u64().unwrap_or(0) as usize,
        epoch: v["epoch"].as_u64().unwrap_or(0) as usize,
        loss: v["loss"].as_f64().unwrap_or(f64::NAN),
        lr: v["lr"].as_f64().unwrap_or(f64::NAN),
        throughput: v["throughput"].as_f64().unwrap_or(0.0),
        unit,
        wall_time: v["wall_time"].as_f64().unwrap_or(0.0),
        elapsed: v["elapsed"].as_f64().unwrap_or(0.0),
        bad_files: v["bad_files"].as_u64().unwrap_or(0) as usize,
        gpu_decode_fallbacks: v["gpu_decode_fallbacks"].as_u64().map(|n| n as usize),
        grad_norm: v["grad_norm"].as_f64(),
    }
}

/// An evaluation record read back from metrics.jsonl: every key not of the record itself is
/// one of the task's metrics.
fn eval_record(v: &serde_json::Value) -> EvalRecord {
    let own = ["kind", "step", "epoch", "loss", "wall_time", "elapsed"];
    let metrics = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| !own.contains(&k.as_str()))
                .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    EvalRecord {
        step: v["step"].as_u64().unwrap_or(0) as usize,
        epoch: v["epoch"].as_u64().unwrap_or(0) as usize,
        loss: v["loss"].as_f64().unwrap_or(f64::NAN),
        metrics,
        wall_time: v["wall_time"].as_f64().unwrap_or(0.0),
        elapsed: v["elapsed"].as_f64().unwrap_or(0.0),
    }
}

pub fn unix_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The files beside metrics.jsonl that a run writes (rank 0 only): `[log]` plots,
/// tensorboard and csv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outputs {
    pub plots: bool,
    pub tensorboard: bool,
    pub csv: bool,
}

impl Outputs {
    pub fn from_config(log: &LogConfig) -> Outputs {
        Outputs { plots: log.plots, tensorboard: log.tensorboard, csv: log.csv }
    }
}

/// The run's metrics file and the history the plots are drawn from. Only rank 0 writes.
pub struct MetricsLog {
    path: PathBuf,
    file: Option<std::fs::File>,
    plots: bool,
    tensorboard: Option<tensorboard::EventWriter>,
    csv: Option<CsvLog>,
    pub start: Instant,
    pub steps: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
}

impl MetricsLog {
    /// The run's records in `dir` as `log` says (rank 0 writes when `write`): afresh, or for a
    /// run resumed from the checkpoint of step `resumed` (see [`MetricsLog::resume`]).
    pub fn open(
        dir: &Path,
        write: bool,
        log: &LogConfig,
        resumed: Option<usize>,
    ) -> Result<MetricsLog, TrainError> {
        let outputs = Outputs::from_config(log);
        match resumed {
            Some(step) => MetricsLog::resume_with(dir, write, outputs, step),
            None => MetricsLog::start(dir, write, outputs, None),
        }
    }

    /// Starts `dir/metrics.jsonl` afresh (rank 0; other ranks keep the history only), with the
    /// TensorBoard and CSV files.
    pub fn create(dir: &Path, write: bool, plots: bool) -> Result<MetricsLog, TrainError> {
        MetricsLog::start(dir, write, Outputs { plots, tensorboard: true, csv: true }, None)
    }

    /// Continues `dir/metrics.jsonl` of a resumed run: the records up to `step` (where the
    /// checkpoint was taken) are kept, later ones (from the steps redone now) dropped. The kept
    /// records are the history the plots start from, so they show the whole run. The CSV files
    /// are written again from the kept records; the event file is appended to, with a mark
    /// that makes TensorBoard drop the steps after `step`.
    pub fn resume(dir: &Path, write: bool, plots: bool, step: usize) -> Result<MetricsLog, TrainError> {
        MetricsLog::resume_with(dir, write, Outputs { plots, tensorboard: true, csv: true }, step)
    }

    fn resume_with(dir: &Path, write: bool, outputs: Outputs, step: usize) -> Result<MetricsLog, TrainError> {
        let path = dir.join("metrics.jsonl");
        let text = if write { std::fs::read_to_string(&path).unwrap_or_default() } else { String::new() };
        let kept: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["step"].as_u64().is_some_and(|s| s as usize <= step))
            .collect();
        let mut log = MetricsLog::start(dir, write, outputs, Some(step))?;
        for v in &kept {
            log.write_line(v)?;
            match v["kind"].as_str() {
                Some("eval") => {
                    let r = eval_record(v);
                    log.csv_write(|c| c.eval(&r))?;
                    log.evals.push(r);
                }
                Some(_) => {
                    let r = step_record(v);
                    log.csv_write(|c| c.step(&r))?;
                    log.steps.push(r);
                }
                None => {}
            }
        }
        Ok(log)
    }

    fn start(
        dir: &Path,
        write: bool,
        outputs: Outputs,
        resumed: Option<usize>,
    ) -> Result<MetricsLog, TrainError> {
        let path = dir.join("metrics.jsonl");
        let (mut file, mut tensorboard, mut csv) = (None, None, None);
        if write {
            std::fs::create_dir_all(dir).map_err(|e| TrainError::output(dir, e))?;
            file = Some(std::fs::File::create(&path).map_err(|e| TrainError::output(&path, e))?);
            if outputs.tensorboard {
                let events = match resumed {
                    Some(step) => tensorboard::EventWriter::resume(dir, step, unix_time()),
                    None => tensorboard::EventWriter::create(dir, unix_time()),
                };
                tensorboard =
                    Some(events.map_err(|e| TrainError::output(&dir.join(tensorboard::EVENT_FILE), e))?);
            }
            if outputs.csv {
                csv = Some(CsvLog::create(dir).map_err(|(p, e)| TrainError::output(&p, e))?);
            }
        }
        Ok(MetricsLog {
            path,
            file,
            plots: outputs.plots && write,
            tensorboard,
            csv,
            start: Instant::now(),
            steps: vec![],
            evals: vec![],
        })
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

    fn csv_write(
        &mut self,
        write: impl FnOnce(&mut CsvLog) -> Result<(), (PathBuf, std::io::Error)>,
    ) -> Result<(), TrainError> {
        match &mut self.csv {
            Some(c) => write(c).map_err(|(p, e)| TrainError::output(&p, e)),
            None => Ok(()),
        }
    }

    fn scalars(&mut self, step: usize, wall_time: f64, values: &[(String, f64)]) -> Result<(), TrainError> {
        match &mut self.tensorboard {
            Some(t) => t.scalars(step, wall_time, values).map_err(|e| TrainError::output(t.path(), e)),
            None => Ok(()),
        }
    }

    pub fn log_step(&mut self, r: StepRecord) -> Result<(), TrainError> {
        let v = serde_json::to_value(&r).expect("a step record is JSON");
        self.write_line(&v)?;
        let mut values = vec![
            ("train/loss".to_string(), r.loss),
            ("train/lr".to_string(), r.lr),
            ("train/throughput".to_string(), r.throughput),
        ];
        values.extend(r.grad_norm.map(|g| ("train/grad_norm".to_string(), g)));
        self.scalars(r.step, r.wall_time, &values)?;
        self.csv_write(|c| c.step(&r))?;
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
        let values: Vec<(String, f64)> = std::iter::once(("eval/loss".to_string(), r.loss))
            .chain(r.metrics.iter().map(|(k, x)| (format!("eval/{k}"), *x)))
            .collect();
        self.scalars(r.step, r.wall_time, &values)?;
        self.csv_write(|c| c.eval(&r))?;
        self.evals.push(r);
        if self.plots {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            plot::write_all(dir, &self.steps, &self.evals)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod output_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A resumed run's plots are drawn from the records it kept, not only from its own.
    #[test]
    fn a_resumed_log_holds_the_history_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            r#"{"kind":"train","step":1,"epoch":1,"loss":2.0,"lr":0.1,"throughput":5.0,"unit":"img/s","wall_time":1.0,"elapsed":1.0,"bad_files":0}"#,
            r#"{"kind":"train","step":2,"epoch":1,"loss":1.5,"lr":0.2,"throughput":5.0,"unit":"img/s","wall_time":2.0,"elapsed":2.0,"bad_files":0}"#,
            r#"{"kind":"eval","step":2,"epoch":1,"loss":1.7,"accuracy":0.25,"top5":0.75,"wall_time":2.5,"elapsed":2.5}"#,
            r#"{"kind":"train","step":3,"epoch":2,"loss":1.0,"lr":0.3,"throughput":5.0,"unit":"img/s","wall_time":3.0,"elapsed":3.0,"bad_files":0}"#,
        ];
        std::fs::write(dir.path().join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        let log = MetricsLog::resume(dir.path(), true, false, 2).unwrap();
        let steps: Vec<(usize, f64, f64)> = log.steps.iter().map(|r| (r.step, r.loss, r.lr)).collect();
        assert_eq!(steps, [(1, 2.0, 0.1), (2, 1.5, 0.2)]);
        assert_eq!(log.steps[0].unit, "img/s");
        assert_eq!(log.evals.len(), 1);
        let mut metrics = log.evals[0].metrics.clone();
        metrics.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(metrics, [("accuracy".to_string(), 0.25), ("top5".to_string(), 0.75)]);
        let kept = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(kept.lines().count(), 3, "{kept}");
    }
}
