//! Checkpoint benchmark: ResNet-50's full training state (weights, buffers, SGD momentum,
//! everything a resume needs) on the CPU.
//!
//! - `checkpoint_save_resnet50`: MB/s of a complete save (host copy, serialisation, write,
//!   fsync of every file, rename, directory fsyncs) against `dd` writing the same number of
//!   bytes with `conv=fsync` into the same folder, interleaved, median of the repetitions.
//!   `dd oflag=direct` (the page cache bypassed, as the save does) is measured beside it and
//!   reported in the notes, so a reader sees the save against both ways of writing.
//! - `checkpoint_stall_resnet50`: how long the training step is blocked by a save (the copy
//!   to host memory and the hand-off to the writer thread), against the 50 ms budget
//!   (ratio = budget / stall).
//!
//! Run `cargo run --release -p oxtrain-bench --bin checkpoint [-- DIR]`, where DIR
//! (default: the system temp dir) is the folder to write into; writes
//! `bench/results/checkpoint.json`.

use oxtrain::checkpoint::{CheckpointConfig, Checkpointer, Saved};
use oxtrain_bench::{cpu_description, git_commit, load_average, median, today, Benchmark, OtherLoad, Report};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const REPS: usize = 7;
const BUDGET_MS: f64 = 50.0;

/// Seconds for `dd` to write `bytes` from /dev/zero into `dir` and fsync them; `direct`:
/// with `oflag=direct` in 16 MiB blocks (the request size of the save's O_DIRECT writes).
fn dd_seconds(dir: &Path, bytes: u64, direct: bool) -> f64 {
    let out = dir.join("dd.bin");
    let block: u64 = if direct { 16 << 20 } else { 1 << 20 };
    let mut args = vec![
        "if=/dev/zero".to_string(),
        format!("of={}", out.display()),
        format!("bs={block}"),
        format!("count={}", bytes.div_ceil(block)),
        "conv=fsync".into(),
    ];
    if direct {
        args.push("oflag=direct".into());
    }
    let start = Instant::now();
    let status = Command::new("dd").args(&args).stderr(std::process::Stdio::null()).status().expect("dd");
    let t = start.elapsed().as_secs_f64();
    assert!(status.success(), "dd {args:?} failed");
    std::fs::remove_file(out).unwrap();
    t
}

/// The file system holding `dir` and its device, from /proc/self/mounts (Linux).
fn file_system(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && dir.starts_with(f[1])).then(|| (f[1].len(), format!("{} on {}", f[2], f[0])))
        })
        .max_by_key(|(len, _)| *len)
        .map_or_else(|| "an unknown file system".into(), |(_, fs)| fs)
}

/// One complete save of step `step`, its part then removed (outside the timing, as dd's file
/// is): what was saved, the stall and the whole save in seconds.
fn save_once(ckpt: &mut Checkpointer, model: &ResNet, opt: &Sgd, step: u64) -> (Saved, f64, f64) {
    // From the call until the part is committed and durable.
    let start = Instant::now();
    let snap = ckpt.snapshot(step + 1, 0).unwrap().model(model).unwrap().optimizer(opt).unwrap();
    ckpt.save(snap).unwrap();
    let stall = start.elapsed().as_secs_f64();
    let saved = ckpt.wait().unwrap().unwrap().clone();
    let total = start.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&saved.path).unwrap();
    (saved, stall, total)
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
    let (mut save_s, mut stall_s, mut thread_s) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dd_s, mut dd_direct_s) = (Vec::new(), Vec::new());
    // The state's size, from a first save that also warms the allocator, the page cache and the disk.
    let bytes = save_once(&mut ckpt, &model, &opt, 0).0.bytes;
    for rep in 1..=REPS {
        // Each of the three goes first, second and third in turn: each write follows the
        // removal of another's file (the file system may be trimming it).
        let (mut save, mut dd, mut dd_direct) = (None, 0.0, 0.0);
        for turn in 0..3 {
            match (rep + turn) % 3 {
                0 => save = Some(save_once(&mut ckpt, &model, &opt, rep as u64)),
                1 => dd = dd_seconds(&run, bytes, false),
                _ => dd_direct = dd_seconds(&run, bytes, true),
            }
        }
        let (saved, stall, total) = save.expect("one turn saves");
        save_s.push(total);
        stall_s.push(stall);
        dd_s.push(dd);
        dd_direct_s.push(dd_direct);
        thread_s.push(saved.write_time.as_secs_f64());
        eprintln!(
            "rep {rep}: {:.0} MB, save {total:.3} s (stall {:.1} ms, write thread {:.3} s), dd {dd:.3} s, \
             dd oflag=direct {dd_direct:.3} s",
            bytes as f64 / 1e6,
            stall * 1e3,
            saved.write_time.as_secs_f64(),
        );
    }
    ckpt.finish().unwrap();
    let _ = std::fs::remove_dir_all(&run);

    let mb = bytes as f64 / 1e6;
    let (save, dd, stall_ms) = (mb / median(&save_s), mb / median(&dd_s), median(&stall_s) * 1e3);
    let (thread, dd_direct) = (mb / median(&thread_s), mb / median(&dd_direct_s));
    let load_after = load_average();
    let profile = if cfg!(debug_assertions) {
        "dev profile (workspace crates at opt-level 1, dependencies at 3, debug assertions on)"
    } else {
        "release profile"
    };
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: std::env::var("OXTRAIN_MACHINE").unwrap_or_else(|_| cpu_description()),
        notes: format!(
            "ResNet-50 training state on the CPU: {mb:.0} MB (weights, buffers, SGD momentum, trainer and \
             RNG files), written into {fs}. Median of {REPS} repetitions after one warm-up, the three \
             writers taking turns to go first. Save = the snapshot (each tensor copied once, with \
             streaming stores, into page-aligned file images kept from the previous save) and the writer \
             (each file written with O_DIRECT as soon as its image is complete, its last partial block \
             through the page cache, checksummed beside the write; fsync of every file, the manifest, \
             directory fsync, rename, parent fsync), timed from the snapshot call until the part is \
             committed. dd = `dd if=/dev/zero bs=1M conv=fsync` of the same bytes into the same folder; \
             `dd bs=16M oflag=direct conv=fsync` of the same bytes ran at {dd_direct:.0} MB/s in the same \
             repetitions. Stall = the time the training loop waits (the host copy and the hand-off to the \
             writer thread); the writer alone (its first file to the commit) ran at {thread:.0} MB/s. \
             Built with the {profile}. Load average {load_before} at the start and {load_after} at the \
             end; other processes kept {:.0}% of all cores busy during the run.",
            others.percent(),
            fs = file_system(&run),
        ),
        benchmarks: vec![
            Benchmark::higher_is_better(
                "checkpoint_save_resnet50",
                "MB/s",
                save,
                Some(dd),
                "dd conv=fsync, same bytes",
                Some(1.0),
            ),
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
    // `cargo run` keeps the caller's folder: the repository root, or bench/ for a user who
    // runs it from there.
    match ["bench/results", "../bench/results"].iter().map(Path::new).find(|d| d.is_dir()) {
        Some(dir) => {
            let file = dir.join("checkpoint.json").display().to_string();
            report.write(&file).unwrap();
            eprintln!("wrote {file}");
        }
        None => eprintln!("no bench/results folder here or one level up: results printed only"),
    }
}
