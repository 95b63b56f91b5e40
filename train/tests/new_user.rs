//! What a new user met when trying the trainer, each now an error that says what to do or a
//! run that records the truth: one class, evaluation folders with fewer or other classes than
//! training, a second fresh start in a run's folder, damaged checkpoints and wrong paths given
//! to `eval` and `export`, a warmup longer than the run, and epochs counted one way.

mod common;
use common::{copy_dir, metrics, of_kind, oxtrain, oxtrain_with};
use std::path::{Path, PathBuf};

/// `train` on the image folder `train` (see `common::small_image_train_args`), without plots.
fn train_args(dir: &Path, train: &Path, extra: &[&str]) -> Vec<String> {
    common::small_image_train_args(dir, train, &[&["log.plots=false"], extra].concat())
}

fn shapes(root: &Path, classes: usize, per_class: usize, seed: u64) {
    oxtrain_datasets::synthetic::write_shapes_image_folder(root, classes, per_class, 16, seed).unwrap();
}

fn class_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    dirs
}

#[test]
fn a_training_folder_of_one_class_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    shapes(&root, 1, 8, 1);
    let r = oxtrain_with(dir.path(), &train_args(dir.path(), &root, &[]));
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("one class folder (circle): a classifier needs at least two classes"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

/// The accuracy `oxtrain eval` reports for `data` (a folder of class folders).
fn eval_accuracy(dir: &Path, model: &Path, data: &Path) -> f64 {
    let (m, d) = (model.display().to_string(), data.display().to_string());
    let r = oxtrain(dir, &["eval", "--checkpoint", &m, "--data", &d, "train.device=cpu"]);
    r.ok();
    let at = r.stdout.find("accuracy ").unwrap_or_else(|| panic!("{}", r.stdout));
    let percent = r.stdout[at + "accuracy ".len()..].split('%').next().unwrap();
    percent.parse::<f64>().unwrap() / 100.0
}

#[test]
fn evaluation_folders_are_labelled_by_the_training_classes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = d.join("train");
    shapes(&train, 2, 8, 1);
    let classes = class_dirs(&train);
    let r = oxtrain_with(d, &train_args(d, &train, &["train.steps=1"]));
    r.ok();
    let model = d.join("run/checkpoints/final");

    // The same 7 pictures, once as the first class alone and once as the second alone. The
    // model calls a picture one class or the other, so the two accuracies sum to 1 when each
    // folder is labelled by the training class list; numbered by its own sorted folders, each
    // lone class would be label 0 and both accuracies would be the same fraction.
    let pictures = d.join("pictures");
    copy_dir(&classes[0], &pictures);
    for f in class_dirs(&pictures).into_iter().skip(7) {
        std::fs::remove_file(f).unwrap();
    }
    let name = |p: &Path| p.file_name().unwrap().to_owned();
    let (only_first, only_second) = (d.join("only_first"), d.join("only_second"));
    copy_dir(&pictures, &only_first.join(name(&classes[0])));
    copy_dir(&pictures, &only_second.join(name(&classes[1])));
    let (a, b) = (eval_accuracy(d, &model, &only_first), eval_accuracy(d, &model, &only_second));
    assert!((a + b - 1.0).abs() < 1e-3, "accuracies {a} and {b} of the same pictures must sum to 1");

    // A class the model was not trained on is an error naming it, at eval and in training.
    copy_dir(&pictures, &d.join("other/zebra"));
    let other = d.join("other").display().to_string();
    let r = oxtrain(d, &["eval", "--checkpoint", &model.display().to_string(), "--data", &other]);
    assert_eq!(r.code, Some(2), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("the class folder(s) zebra are not among the 2 classes"), "{}", r.stderr);
    let val = format!("data.val={other}");
    let r = oxtrain_with(d, &train_args(d, &train, &[&val, "log.dir=run2"]));
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("data.val = ") && r.stderr.contains("zebra are not among"), "{}", r.stderr);
}

#[test]
fn a_fresh_start_in_a_runs_folder_is_refused_unless_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = d.join("train");
    shapes(&train, 2, 8, 1);
    let first = train_args(d, &train, &["checkpoint.every_steps=1"]);
    oxtrain_with(d, &first).ok();
    let metrics_file = d.join("run/metrics.jsonl");
    let before = std::fs::read_to_string(&metrics_file).unwrap();
    assert!(d.join("run/checkpoints/step-000004").is_dir());

    let r = oxtrain_with(d, &train_args(d, &train, &["train.steps=2"]));
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    for what in
        ["holds an earlier run", "metrics.jsonl", "`oxtrain train --resume`", "log.dir=", "--overwrite"]
    {
        assert!(r.stderr.contains(what), "{what}: {}", r.stderr);
    }
    assert_eq!(std::fs::read_to_string(&metrics_file).unwrap(), before, "the metrics are untouched");

    let r =
        oxtrain_with(d, &[train_args(d, &train, &["train.steps=2"]), vec!["--overwrite".into()]].concat());
    r.ok();
    assert!(!d.join("run/checkpoints/step-000004").exists(), "the earlier run's checkpoints are gone");
    assert_eq!(of_kind(&metrics(&metrics_file), "train").len(), 2, "only the new run's steps");
}

#[test]
fn epochs_count_from_one_in_the_metrics_and_on_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = d.join("train");
    shapes(&train, 2, 4, 1);
    let val = format!("data.val={}", train.display());
    let r = oxtrain_with(d, &train_args(d, &train, &["train.epochs=2", &val]));
    r.ok();
    let m = metrics(&d.join("run/metrics.jsonl"));
    let epochs: Vec<u64> = of_kind(&m, "train").iter().map(|v| v["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs, [1, 1, 2, 2], "{m:?}");
    let evals: Vec<u64> = of_kind(&m, "eval").iter().map(|v| v["epoch"].as_u64().unwrap()).collect();
    assert_eq!(evals, [1, 2], "{m:?}");
    assert!(
        r.stderr.contains("epoch 1/2 step 1/4") && r.stderr.contains("epoch 2/2 step 4/4"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_warmup_longer_than_the_run_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = d.join("train");
    shapes(&train, 2, 4, 1);
    let r = oxtrain_with(d, &train_args(d, &train, &["schedule.warmup_epochs=5"]));
    r.ok();
    assert!(
        r.stderr.contains(
            "warning: schedule.warmup_epochs = 5 is 10 steps, but the run has 2: it ends at the peak"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn eval_and_export_check_checkpoints_and_say_what_a_wrong_path_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = d.join("train");
    shapes(&train, 2, 4, 1);
    oxtrain_with(d, &train_args(d, &train, &["checkpoint.every_steps=1"])).ok();
    let ckpts = d.join("run/checkpoints");
    let newest = ckpts.join("step-000002");
    let weights = newest.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();

    let eval = |path: &Path| oxtrain(d, &["eval", "--checkpoint", &path.display().to_string()]);
    let r = eval(&newest);
    assert_eq!(r.code, Some(2), "a damaged checkpoint is not evaluated:\n{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("not a valid checkpoint") && r.stderr.contains("model.safetensors"),
        "{}",
        r.stderr
    );

    let out = d.join("model.safetensors").display().to_string();
    let r = oxtrain(d, &["export", "--checkpoint", &ckpts.display().to_string(), "--out", &out]);
    r.ok();
    assert!(r.stdout.contains("step-000001"), "the newest valid one: {}", r.stdout);
    assert!(
        r.stderr.contains("skipped the newer checkpoint") && r.stderr.contains("step-000002"),
        "{}",
        r.stderr
    );

    // The final model folder has a manifest too (the checkpoints' writer made it): eval
    // checks it as it checks a step.
    let final_weights = ckpts.join("final/model.safetensors");
    let mut bytes = std::fs::read(&final_weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&final_weights, bytes).unwrap();
    let r = eval(&ckpts.join("final"));
    assert_eq!(r.code, Some(2), "a damaged final model is not evaluated:\n{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("not a valid checkpoint"), "{}", r.stderr);

    let r = eval(&d.join("no_such_run"));
    assert!(r.stderr.contains("no_such_run is not a model folder: it does not exist"), "{}", r.stderr);
    let r = eval(&d.join("run"));
    assert!(r.stderr.contains("it holds a run; evaluate its final model with --checkpoint"), "{}", r.stderr);
    assert!(r.stderr.contains("checkpoints/final"), "{}", r.stderr);
}
