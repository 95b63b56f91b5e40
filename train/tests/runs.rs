//! A small run end to end: the metrics file, the plots, the progress lines (same numbers as
//! the file), the summary line, the model folder and `oxtrain eval` on it; and the stop or
//! skip on a non-finite loss.

mod common;
use common::{metrics, of_kind, oxtrain};
use std::path::Path;

/// Synthetic shapes at toy size: 2 classes x 16 pictures of 16 px, batch 8 -> 4 steps an epoch.
fn toy(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "train".to_string(),
        format!("data.cache={}", dir.join("cache").display()),
        "data.classes=2".into(),
        "data.per_class=16".into(),
        "data.image_size=16".into(),
        "data.batch_size=8".into(),
        "data.workers=0".into(),
        "train.device=cpu".into(),
        "log.progress=lines".into(),
        format!("log.dir={}", dir.join("run").display()),
    ]
    .into();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn run(dir: &Path, args: &[String]) -> common::Run {
    oxtrain(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The number after `key` in a line ("... 123.4 img/s" -> key "img/s" looks before it).
fn throughput_of(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "img/s").expect("a throughput in the line");
    words[i - 1].to_string()
}

#[test]
fn a_run_writes_metrics_plots_and_a_model_that_eval_reads() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), &toy(dir.path(), &["train.epochs=3", "log.every_steps=2"]));
    r.ok();
    let m = metrics(&dir.path().join("run/metrics.jsonl"));
    let steps = of_kind(&m, "train");
    let evals = of_kind(&m, "eval");
    // 12 steps logged every 2, an evaluation after each of the 3 epochs.
    assert_eq!(steps.iter().map(|v| v["step"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 4, 6, 8, 10, 12]);
    assert_eq!(evals.iter().map(|v| v["step"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 8, 12]);
    for v in steps.iter().chain(&evals) {
        assert!(v["wall_time"].as_f64().unwrap() > 1.6e9 && v["elapsed"].as_f64().is_some(), "{v}");
    }
    assert!(evals.iter().all(|v| (0.0..=1.0).contains(&v["accuracy"].as_f64().unwrap())));
    // Every logged step has the gradient norm of its last optimizer step (no clipping here:
    // measured on log steps only).
    for v in &steps {
        let norm = v["grad_norm"].as_f64().unwrap_or_else(|| panic!("no grad_norm: {v}"));
        assert!(norm.is_finite() && norm > 0.0, "{v}");
    }

    // The same losses in the TensorBoard event file (float32) and in log.csv.
    let run_dir = dir.path().join("run");
    let events =
        oxtrain::metrics::tensorboard::read_events(&run_dir.join("events.out.tfevents.oxtrain")).unwrap();
    let tb_losses: Vec<(i64, f32)> = events
        .iter()
        .filter_map(|e| match &e.what {
            oxtrain::metrics::tensorboard::What::Scalars(v) => {
                v.iter().find(|(t, _)| t == "train/loss").map(|(_, x)| (e.step, *x as f32))
            }
            _ => None,
        })
        .collect();
    let jsonl_losses: Vec<(i64, f32)> =
        steps.iter().map(|v| (v["step"].as_i64().unwrap(), v["loss"].as_f64().unwrap() as f32)).collect();
    assert_eq!(tb_losses, jsonl_losses);
    let tb_norms = events
        .iter()
        .filter(|e| match &e.what {
            oxtrain::metrics::tensorboard::What::Scalars(v) => v.iter().any(|(t, _)| t == "train/grad_norm"),
            _ => false,
        })
        .count();
    assert_eq!(tb_norms, steps.len(), "train/grad_norm at every logged step");
    let csv = std::fs::read_to_string(run_dir.join("log.csv")).unwrap();
    assert_eq!(csv.lines().count(), steps.len() + 1, "a header and a row per logged step: {csv}");
    assert_eq!(std::fs::read_to_string(run_dir.join("eval.csv")).unwrap().lines().count(), evals.len() + 1);

    // The progress lines show the file's throughput (one source), step by step.
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains(" img/s")).collect();
    assert_eq!(lines.len(), steps.len(), "{}", r.stderr);
    for (line, v) in lines.iter().zip(&steps) {
        assert!(line.contains(&format!("step {}/12", v["step"])), "{line}");
        assert_eq!(throughput_of(line), format!("{:.1}", v["throughput"].as_f64().unwrap()), "{line}");
    }

    // The summary is stdout's only line, on its own.
    let out: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(out.len(), 1, "{}", r.stdout);
    assert!(out[0].starts_with("done: 12 steps (3 epochs)") && out[0].contains("accuracy"), "{}", out[0]);

    // The plots decode and show their series: blue training loss and lr, red evaluation loss.
    let count = |file: &str, rgb: [u8; 3]| {
        let img = image::open(dir.path().join("run").join(file)).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (800, 480), "{file}");
        img.pixels().filter(|p| p.0 == rgb).count()
    };
    assert!(count("loss.png", [0, 0, 255]) > 100, "no training loss drawn");
    assert!(count("loss.png", [255, 0, 0]) > 30, "no evaluation loss drawn");
    assert!(count("accuracy.png", [0, 0, 255]) > 30, "no accuracy drawn");
    assert!(count("lr.png", [0, 0, 255]) > 100, "no learning rate drawn");

    // eval --checkpoint reads the model folder and finds the run's last accuracy again.
    let ckpt = dir.path().join("run/checkpoints/final");
    assert!(ckpt.join("model.safetensors").is_file() && ckpt.join("config.toml").is_file());
    let e = oxtrain(dir.path(), &["eval", "--checkpoint", &ckpt.display().to_string()]);
    e.ok();
    let last = evals.last().unwrap();
    let want = format!(
        "loss {:.4}, accuracy {:.2}%",
        last["loss"].as_f64().unwrap(),
        100.0 * last["accuracy"].as_f64().unwrap()
    );
    assert!(e.stdout.contains(&want), "eval printed {:?}, the run's last eval {want:?}", e.stdout);
}

#[test]
fn a_nan_loss_stops_or_skips_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), &toy(dir.path(), &["train.steps=1"])).ok();
    // The run's weights with one NaN in the classifier: every loss is NaN.
    let model = dir.path().join("run/checkpoints/final/model.safetensors");
    let mut state = oxtrain_tensor::safetensors::load_all(&model).unwrap();
    for (name, t) in state.iter_mut() {
        if name == "fc.bias" {
            let mut v: Vec<f32> = t.to_vec();
            v[0] = f32::NAN;
            *t = oxtrain_tensor::Tensor::from_vec(v, t.dims().to_vec(), oxtrain_tensor::Device::Cpu).unwrap();
        }
    }
    let bad = dir.path().join("nan.safetensors");
    let refs: Vec<(&str, &oxtrain_tensor::Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    oxtrain_tensor::safetensors::save(&refs, None, &bad).unwrap();
    let init = format!("model.init_from={}", bad.display());

    // New runs in the first one's folder: --overwrite says so.
    let r = run(dir.path(), &toy(dir.path(), &[&init, "--overwrite"]));
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains("the loss is NaN at step 1 (epoch 1); stopping (train.on_nonfinite = \"stop\")"),
        "{}",
        r.stderr
    );

    let r = run(
        dir.path(),
        &toy(dir.path(), &[&init, "train.on_nonfinite=skip", "train.max_skipped=3", "--overwrite"]),
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(r.stderr.matches("skipping this update").count(), 3, "{}", r.stderr);
    assert!(r.stderr.contains("more than train.max_skipped steps were skipped"), "{}", r.stderr);
}
