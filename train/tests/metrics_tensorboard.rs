//! The event file opens in TensorBoard itself: `metrics/check_tensorboard.py` reads a run's
//! folder with the `tensorboard` package's EventAccumulator and finds every scalar at its
//! step, with the steps a resumed run logged again dropped as TensorBoard drops them. Runs
//! with `$OXTRAIN_TEST_PYTHON` (default `python3`); without the package it says so and passes,
//! unless `OXTRAIN_REQUIRE_TENSORBOARD=1` (CI installs the package and sets it).

use oxtrain::metrics::{EvalRecord, MetricsLog, StepRecord};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn python() -> String {
    std::env::var("OXTRAIN_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn has_tensorboard(python: &str) -> bool {
    let import = "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator";
    Command::new(python).args(["-c", import]).output().is_ok_and(|o| o.status.success())
}

fn step(step: usize, loss: f64, grad_norm: Option<f64>) -> StepRecord {
    StepRecord {
        kind: "train",
        step,
        epoch: 1,
        loss,
        lr: 1e-3 * step as f64,
        throughput: 1000.0 + step as f64,
        unit: "img/s",
        wall_time: 1.7e9 + step as f64,
        elapsed: step as f64,
        bad_files: 0,
        gpu_decode_fallbacks: None,
        grad_norm,
    }
}

#[test]
fn tensorboard_reads_every_scalar_of_a_resumed_run() {
    let python = python();
    if !has_tensorboard(&python) {
        let required = std::env::var("OXTRAIN_REQUIRE_TENSORBOARD").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "`{python}` cannot import tensorboard (pip install tensorboard, or set OXTRAIN_TEST_PYTHON)"
        );
        println!("skipped: `{python}` cannot import tensorboard");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A first attempt logs steps 1 to 4 and an evaluation at 2, then stops; the run resumes
    // from the checkpoint of step 2 and logs steps 3 and 4 again with other values.
    let mut first = MetricsLog::create(d, true, false).unwrap();
    for s in 1..=4 {
        first.log_step(step(s, 4.0 - s as f64 * 0.5, (s > 1).then_some(s as f64 * 0.25))).unwrap();
    }
    let metrics = vec![("accuracy".to_string(), 0.625)];
    let eval = EvalRecord { step: 2, epoch: 1, loss: 3.25, metrics, wall_time: 1.7e9 + 2.5, elapsed: 2.5 };
    first.log_eval(eval).unwrap();
    drop(first);
    let mut resumed = MetricsLog::resume(d, true, false, 2).unwrap();
    for s in 3..=4 {
        resumed.log_step(step(s, 10.0 + s as f64, None)).unwrap();
    }
    drop(resumed);

    let mut expected: BTreeMap<&str, Vec<(usize, f64)>> = BTreeMap::new();
    for (s, loss) in [(1, 3.5), (2, 3.0), (3, 13.0), (4, 14.0)] {
        expected.entry("train/loss").or_default().push((s, loss));
        expected.entry("train/lr").or_default().push((s, 1e-3 * s as f64));
        expected.entry("train/throughput").or_default().push((s, 1000.0 + s as f64));
    }
    expected.insert("train/grad_norm", vec![(2, 0.5)]);
    expected.insert("eval/loss", vec![(2, 3.25)]);
    expected.insert("eval/accuracy", vec![(2, 0.625)]);
    // The float32 values TensorBoard holds.
    let expected: BTreeMap<&str, Vec<(usize, f64)>> = expected
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().map(|(s, x)| (s, x as f32 as f64)).collect()))
        .collect();
    let expected_path = d.join("expected.json");
    std::fs::write(&expected_path, serde_json::to_string(&expected).unwrap()).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/metrics/check_tensorboard.py");
    let out = Command::new(&python).arg(&script).arg(d).arg(&expected_path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("ok"), "check_tensorboard.py failed:\n{text}");
}
