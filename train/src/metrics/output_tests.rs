//! The event file and the CSV files hold every record a run logs, and a resumed run keeps them.

use super::tensorboard::{read_events, EventFileError, What, EVENT_FILE};
use super::*;

fn step(step: usize, loss: f64, grad_norm: Option<f64>) -> StepRecord {
    StepRecord {
        kind: "train",
        step,
        epoch: 1,
        loss,
        lr: 0.01 * step as f64,
        throughput: 100.0 + step as f64,
        unit: "tokens/s",
        wall_time: 1000.0 + step as f64,
        elapsed: step as f64,
        bad_files: 0,
        gpu_decode_fallbacks: None,
        grad_norm,
    }
}

fn eval(step: usize, loss: f64) -> EvalRecord {
    let metrics = vec![("accuracy".to_string(), 0.5), ("top5".to_string(), 0.875)];
    EvalRecord { step, epoch: 1, loss, metrics, wall_time: 2000.0 + step as f64, elapsed: step as f64 }
}

/// (tag, step, value) of every scalar in the run's event file, checksums verified.
fn scalars(dir: &Path) -> Vec<(String, i64, f32)> {
    let mut out = Vec::new();
    for e in read_events(&dir.join(EVENT_FILE)).unwrap() {
        if let What::Scalars(values) = e.what {
            out.extend(values.into_iter().map(|(t, v)| (t, e.step, v as f32)));
        }
    }
    out
}

fn logged_run(dir: &Path) -> MetricsLog {
    let mut log = MetricsLog::create(dir, true, false).unwrap();
    log.log_step(step(1, 2.5, None)).unwrap();
    log.log_step(step(2, 2.25, Some(0.75))).unwrap();
    log.log_eval(eval(2, 2.375)).unwrap();
    log.log_step(step(3, 2.125, Some(0.5))).unwrap();
    log
}

#[test]
fn every_logged_scalar_is_in_the_event_file_with_its_step() {
    let dir = tempfile::tempdir().unwrap();
    logged_run(dir.path());
    let events = read_events(&dir.path().join(EVENT_FILE)).unwrap();
    assert_eq!(
        events[0].what,
        What::FileVersion("brain.Event:2".into()),
        "TensorBoard reads the version first"
    );
    let t = |tag: &str, step: i64, v: f64| (tag.to_string(), step, v as f32);
    let expected = vec![
        t("train/loss", 1, 2.5),
        t("train/lr", 1, 0.01),
        t("train/throughput", 1, 101.0),
        t("train/loss", 2, 2.25),
        t("train/lr", 2, 0.02),
        t("train/throughput", 2, 102.0),
        t("train/grad_norm", 2, 0.75),
        t("eval/loss", 2, 2.375),
        t("eval/accuracy", 2, 0.5),
        t("eval/top5", 2, 0.875),
        t("train/loss", 3, 2.125),
        t("train/lr", 3, 0.03),
        t("train/throughput", 3, 103.0),
        t("train/grad_norm", 3, 0.5),
    ];
    assert_eq!(scalars(dir.path()), expected);
    assert_eq!(events[1].wall_time, 1001.0, "the record's own wall time");
}

#[test]
fn a_damaged_event_file_is_refused_at_the_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    logged_run(dir.path());
    let path = dir.path().join(EVENT_FILE);
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    assert!(matches!(read_events(&path), Err(EventFileError::Checksum { part: "data", .. })));
    std::fs::write(&path, &good[..good.len() - 2]).unwrap();
    assert!(matches!(read_events(&path), Err(EventFileError::Truncated { .. })));
}

/// A run resumed from step 2: the event file keeps its records and gains a session start at
/// step 3 (TensorBoard then drops the first attempt's step 3); the CSV keeps rows up to 2.
#[test]
fn a_resumed_run_appends_to_the_event_file_and_keeps_the_csv_rows() {
    let dir = tempfile::tempdir().unwrap();
    drop(logged_run(dir.path()));
    let mut log = MetricsLog::resume(dir.path(), true, false, 2).unwrap();
    log.log_step(step(3, 1.0, None)).unwrap();
    let events = read_events(&dir.path().join(EVENT_FILE)).unwrap();
    let starts: Vec<i64> = events.iter().filter(|e| e.what == What::SessionStart).map(|e| e.step).collect();
    assert_eq!(starts, [3]);
    let all = scalars(dir.path());
    assert_eq!(all.iter().filter(|s| s.0 == "train/loss").count(), 4, "the first attempt's records stay");
    assert_eq!(all.last().unwrap(), &("train/throughput".to_string(), 3, 103.0));

    let rows = read_csv(&dir.path().join(csv_log::STEP_FILE));
    let steps: Vec<(&str, &str, &str)> =
        rows[1..].iter().map(|r| (r[0].as_str(), r[2].as_str(), r[4].as_str())).collect();
    assert_eq!(steps, [("1", "2.5", ""), ("2", "2.25", "0.75"), ("3", "1", "")]);
    assert_eq!(read_csv(&dir.path().join(csv_log::EVAL_FILE)).len(), 2, "header and the eval of step 2");
}

fn read_csv(path: &Path) -> Vec<Vec<String>> {
    let mut r = csv::ReaderBuilder::new().has_headers(false).from_path(path).unwrap();
    r.records().map(|rec| rec.unwrap().iter().map(String::from).collect()).collect()
}

#[test]
fn the_csv_files_have_a_header_and_a_row_per_record() {
    let dir = tempfile::tempdir().unwrap();
    logged_run(dir.path());
    let steps = read_csv(&dir.path().join("log.csv"));
    assert_eq!(steps[0], csv_log_header());
    assert_eq!(steps.len(), 4);
    assert_eq!(steps[2], ["2", "1", "2.25", "0.02", "0.75", "102", "tokens/s", "1002", "2", "0"]);
    let evals = read_csv(&dir.path().join("eval.csv"));
    assert_eq!(evals[0], ["step", "epoch", "loss", "accuracy", "top5", "wall_time", "elapsed"]);
    assert_eq!(evals[1], ["2", "1", "2.375", "0.5", "0.875", "2002", "2"]);
}

fn csv_log_header() -> Vec<String> {
    ["step", "epoch", "loss", "lr", "grad_norm", "throughput", "unit", "wall_time", "elapsed", "bad_files"]
        .map(String::from)
        .to_vec()
}

/// `log.tensorboard = false` and `log.csv = false` leave those files out; ranks other than 0
/// write nothing.
#[test]
fn the_log_keys_turn_the_outputs_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { tensorboard: false, csv: false, plots: false, ..LogConfig::default() };
    let mut log = MetricsLog::open(dir.path(), true, &config, None).unwrap();
    log.log_step(step(1, 1.0, None)).unwrap();
    log.log_eval(eval(1, 1.0)).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert_eq!(names, ["metrics.jsonl"]);

    let other = tempfile::tempdir().unwrap();
    let mut log = MetricsLog::open(other.path(), false, &LogConfig::default(), None).unwrap();
    log.log_step(step(1, 1.0, Some(1.0))).unwrap();
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
}

/// grad_norm goes into metrics.jsonl when measured and reads back from it on resume.
#[test]
fn grad_norm_round_trips_through_metrics_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    drop(logged_run(dir.path()));
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert!(!text.lines().next().unwrap().contains("grad_norm"), "absent when not measured: {text}");
    let log = MetricsLog::resume(dir.path(), true, false, 3).unwrap();
    let norms: Vec<Option<f64>> = log.steps.iter().map(|s| s.grad_norm).collect();
    assert_eq!(norms, [None, Some(0.75), Some(0.5)]);
}
