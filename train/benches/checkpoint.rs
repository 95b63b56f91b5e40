//! Checkpoint benchmark: ResNet-50's full training state (weights, buffers, SGD momentum,
//! everything a resume needs) on the CPU.
//!
//! - `checkpoint_save_resnet50`: MB/s of a complete save (host copy, serialisation, write,
//!   fsync of every file, rename, directory fsyncs) against `dd` writing the same number of
//!   bytes with `conv=fsync` into the same folder, interleaved, median of the repetitions.
//! - `checkpoint_stall_resnet50`: how long the training step is blocked by a save (the copy
//!   to host memory and the hand-off to the writer thread), against the 50 ms budget
//!   (ratio = budget / stall).
//!
//! Run from the repository root: `cargo bench -p oxtrain --bench checkpoint [-- DIR]`, where DIR
//! (default: the system temp dir) is the folder to write into; writes
//! `bench/results/checkpoint.json`.

use oxtrain::checkpoint::{CheckpointConfig, Checkpointer};
use oxtrain_bench::{git_commit, load_average, median, today, Benchmark, OtherLoad, Report};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const REPS: usize = 5;
const BUDGET_MS: f64 = 50.0;

/// Seconds for `dd` to write `bytes` from /dev/zero into `dir` and fsync them.
fn dd_seconds(dir: &Path, bytes: u64) -> f64 {
    let out = dir.join("dd.bin");
    let mb = bytes.div_ceil(1 << 20);
    let start = Instant::now();
    let status = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", out.display()),
            "bs=1M",
            &format!("count={mb}"),
            "conv=fsync",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("dd");
    let t = start.elapsed().as_secs_f64();
    assert!(status.success(), "dd failed");
    std::fs::remove_file(out).unwrap();
    t
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .filter(|a| !a.starts_with('-'))
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir);
    let run = dir.join(format!("oxtrain-checkpoint-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).unwrap();

    let model = ResNet::new(&ResNetConfig::resnet50(), Device::Cpu).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    // One step with gradients of ones creates every momentum buffer, as a real step would.
    for p in model.parameters() {
        p.set_grad(Some(Tensor::ones(p.dims(), p.dtype(), Device::Cpu).unwrap()));
    }
    opt.step();

    let others = OtherLoad::start();
    let load_before = load_average();
    // No retention: the old checkpoint is removed outside the timed part, as dd's file is.
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&run)).unwrap();
    let (mut save_s, mut stall_s, mut dd_s, mut thread_s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for rep in 0..=REPS {
        // Save: from the call until the part is committed and durable.
        let start = Instant::now();
        let snap = ckpt.snapshot(rep as u64 + 1, 0).unwrap().model(&model).unwrap().optimizer(&opt).unwrap();
        ckpt.save(snap).unwrap();
        let stall = start.elapsed().as_secs_f64();
        let saved = ckpt.wait().unwrap().unwrap().clone();
        let total = start.elapsed().as_secs_f64();
        bytes = saved.bytes;
        std::fs::remove_dir_all(&saved.path).unwrap();
        let dd = dd_seconds(&run, bytes);
        // The first round warms the allocator, the page cache and the disk.
        if rep > 0 {
            save_s.push(total);
            stall_s.push(stall);
            dd_s.push(dd);
            thread_s.push(saved.write_time.as_secs_f64());
        }
        eprintln!(
            "rep {rep}: {:.0} MB, save {:.3} s (stall {:.1} ms, write thread {:.3} s), dd {:.3} s",
            bytes as f64 / 1e6,
            total,
            stall * 1e3,
            saved.write_time.as_secs_f64(),
            dd
        );
    }
    ckpt.finish().unwrap();
    let _ = std::fs::remove_dir_all(&run);

    let mb = bytes as f64 / 1e6;
    let (save, dd, stall_ms) = (mb / median(&save_s), mb / median(&dd_s), median(&stall_s) * 1e3);
    let thread = mb / median(&thread_s);
    let profile = if cfg!(debug_assertions) {
        "dev profile (workspace crates at opt-level 1, dependencies at 3, debug assertions on)"
    } else {
        "release profile"
    };
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: std::env::var("OXTRAIN_MACHINE").unwrap_or_else(|_| {
            format!("{} CPU cores", std::thread::available_parallelism().map_or(0, |n| n.get()))
        }),
        notes: format!(
            "ResNet-50 training state on the CPU: {mb:.0} MB (weights, buffers, SGD momentum, trainer and RNG \
             files). Median of {REPS} interleaved repetitions after one warm-up; save = snapshot + write + fsync \
             of each file + rename + directory fsyncs; dd = `dd if=/dev/zero bs=1M conv=fsync` of the same \
             bytes into the same folder. Stall = the time the training loop waits (host copy of the state and \
             hand-off to the writer thread); the writer thread alone (serialise, hash, write, fsync, rename) ran at \
             {thread:.0} MB/s. Built with the {profile}. Load average {load_before} at the start; other \
             processes kept {:.0}% of all cores busy during the run.",
            others.percent()
        ),
        benchmarks: vec![
            Benchmark::higher_is_better("checkpoint_save_resnet50", "MB/s", save, Some(dd), "dd conv=fsync, same bytes", Some(1.0)),
            Benchmark {
                name: "checkpoint_stall_resnet50".into(),
                unit: "ms".into(),
                oxtrain: stall_ms,
                peer: Some(BUDGET_MS),
                peer_name: "the 50 ms budget".into(),
                ratio: Some(BUDGET_MS / stall_ms),
                goal: Some(1.0),
            },
        ],
    };
    println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    if Path::new("bench/results").is_dir() {
        report.write("bench/results/checkpoint.json").unwrap();
        eprintln!("wrote bench/results/checkpoint.json");
    }
}
