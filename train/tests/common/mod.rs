//! Running the `oxtrain` binary in a folder and reading what a run leaves behind.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "oxtrain failed:\n{}\n{}", self.stdout, self.stderr);
        self
    }
}

/// `oxtrain ARGS` in `dir`, with the progress as plain lines.
pub fn oxtrain(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .args(args)
        .current_dir(dir)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .expect("oxtrain runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The repository's root (examples/configs live there).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn config(name: &str) -> String {
    repo().join("examples/configs").join(name).display().to_string()
}

/// The lines of a metrics.jsonl.
pub fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn of_kind<'a>(m: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    m.iter().filter(|v| v["kind"] == kind).collect()
}

/// The training loss fell: the median of the last third of the logged losses is at least 5%
/// below the median of the first third (medians, so one noisy batch decides nothing).
pub fn assert_loss_falls(m: &[serde_json::Value]) {
    let losses: Vec<f64> = of_kind(m, "train").iter().map(|v| v["loss"].as_f64().unwrap()).collect();
    assert!(losses.len() >= 6, "too few logged steps: {losses:?}");
    let third = losses.len() / 3;
    let median = |s: &[f64]| {
        let mut v = s.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (first, last) = (median(&losses[..third]), median(&losses[losses.len() - third..]));
    assert!(last < first * 0.95, "the loss did not fall (median {first} -> {last}): {losses:?}");
}

/// A toy ImageNet: `root/train/<class>/*` and `root/val/<class>/*` of drawn shapes.
pub fn toy_imagenet(root: &Path, classes: usize, per_class: usize, size: u32) {
    oxtrain_datasets::synthetic::write_shapes_image_folder(root.join("train"), classes, per_class, size, 1)
        .unwrap();
    oxtrain_datasets::synthetic::write_shapes_image_folder(root.join("val"), classes, per_class / 2, size, 2)
        .unwrap();
}

/// `oxtrain train` on the image folder `train` (16-pixel pictures, ResNet-18, CPU, batches of 4,
/// one epoch, a plain log line a step), logging into `dir/run`, with `extra` overrides.
pub fn small_image_train_args(dir: &Path, train: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "train".into(),
        "data.kind=image_folder".into(),
        format!("data.train={}", train.display()),
        "data.image_size=16".into(),
        "data.batch_size=4".into(),
        "data.workers=0".into(),
        "model.name=resnet18".into(),
        "train.device=cpu".into(),
        "train.epochs=1".into(),
        "log.every_steps=1".into(),
        "log.progress=lines".into(),
        format!("log.dir={}", dir.join("run").display()),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// [`oxtrain`] with owned arguments, as [`small_image_train_args`] makes them.
pub fn oxtrain_with(dir: &Path, args: &[String]) -> Run {
    oxtrain(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Copies the files (not subfolders) of `from` into `to`, made if missing.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
