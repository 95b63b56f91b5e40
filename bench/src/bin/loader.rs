//! Data-loading throughput per core: oxtrain's `ImageFolder` + `DataLoader` against
//! torchvision's `ImageFolder` + `DataLoader` (PIL), both with RandomResizedCrop(224) +
//! RandomHorizontalFlip + ToTensor + Normalize, on the same files, measured in the same run.
//!
//! `cargo run --release -p oxtrain-bench --bin loader` writes `bench/results/loader.json`.
//! The peer runs `bench/peers/loader.py` under `OXTRAIN_PEER_PYTHON` (default `python3`; it
//! needs numpy, torch, torchvision and Pillow), which also writes the images: `BENCH_IMAGES`
//! (default 320) textured 500x375 JPEGs of about 77 KB, quality 90, 4:2:0, as ImageNet's are.
//! `BENCH_REPS` epochs are timed after one of warm-up (default 5).
//!
//! Two figures each:
//! - images per second with one loader worker (wall clock; the goal's figure);
//! - images per CPU second with the loading on the calling thread (`num_workers=0`), which
//!   other processes on the machine disturb far less.

use oxtrain_bench::{
    bench_file, git_commit, load_average, process_cpu_seconds, today, Benchmark, OtherLoad, Report,
};
use oxtrain_datasets::{
    DataLoader, DistributedSampler, ImageFolder, ImageTransform, LoaderConfig, PinMemory,
};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn python(args: &[&str]) -> Result<Value, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = bench_file("peers/loader.py");
    let out = Command::new(&python)
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} {script} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Images per second (wall clock, `workers` threads) and per CPU second, over `reps` epochs.
fn measure(root: &Path, workers: usize, reps: usize, cpu: bool) -> f64 {
    let ds =
        ImageFolder::new(root, ImageTransform::imagenet_train(224)).expect("the benchmark's image folder");
    let n = ds.len();
    let sampler = DistributedSampler::single(n).seed(0);
    let config = LoaderConfig {
        batch_size: 32,
        num_workers: workers,
        prefetch_factor: 4,
        seed: 0,
        pin_memory: PinMemory::Off, // as torch's default; this is a CPU measurement
        ..Default::default()
    };
    let loader = DataLoader::new(ds, sampler, config).expect("a loader");
    let mut times = Vec::new();
    for epoch in 0..=reps as u64 {
        let (t0, c0) = (Instant::now(), process_cpu_seconds());
        let mut seen = 0;
        for b in loader.epoch(epoch) {
            seen += b.expect("every benchmark image loads").len();
        }
        assert_eq!(seen, n);
        let dt = if cpu { process_cpu_seconds() - c0 } else { t0.elapsed().as_secs_f64() };
        if epoch > 0 {
            times.push(dt);
        }
    }
    n as f64 / median(times)
}

fn main() {
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let images: usize = std::env::var("BENCH_IMAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(320);
    let root = std::env::temp_dir().join(format!("oxtrain-bench-loader-{}", std::process::id()));
    let written = python(&["write", root.to_str().expect("a UTF-8 temp dir"), &images.to_string()])
        .unwrap_or_else(|e| {
            panic!("writing the benchmark images needs the peer's Python (numpy, Pillow): {e}")
        });
    let load_before = load_average();
    let other_load = OtherLoad::start();

    let ox_wall = measure(&root, 1, reps, false);
    eprintln!("oxtrain: {ox_wall:.0} img/s with one worker");
    let ox_cpu = measure(&root, 0, reps, true);
    eprintln!("oxtrain: {ox_cpu:.0} img per CPU second on the calling thread");
    let peer = python(&["run", root.to_str().unwrap(), &reps.to_string()]);
    if let Ok(p) = &peer {
        eprintln!("torchvision: {:.0} img/s, {:.0} img per CPU second", p["img_per_s"], p["cpu_img_per_s"]);
    }
    let others = other_load.percent();
    let load_after = load_average();
    std::fs::remove_dir_all(&root).ok();

    let get = |k: &str| peer.as_ref().ok().and_then(|p| p[k].as_f64());
    let peer_name = match &peer {
        Ok(p) => format!(
            "torchvision {} ImageFolder + torch {} DataLoader (Pillow {})",
            p["torchvision_version"].as_str().unwrap_or("?"),
            p["torch_version"].as_str().unwrap_or("?"),
            p["pillow_version"].as_str().unwrap_or("?")
        ),
        Err(_) => "torchvision ImageFolder + DataLoader".into(),
    };
    let mut notes = format!(
        "{} JPEGs of 500x375, mean {:.0} bytes, written by Pillow at quality 90 (4:2:0), textured. \
         Both sides: RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet) \
         to f32 NCHW, batch 32, shuffled. Main figure: wall-clock images/s with one loader worker \
         (oxtrain: one worker thread; torch: num_workers=1, persistent, torch.set_num_threads(1)), \
         median of {reps} epochs after one of warm-up. The _cpu_time entry: images per CPU second with \
         the loading on the calling thread (num_workers=0). oxtrain decodes with zune-jpeg (DCT scaling \
         never applies to 500x375 images with 224 crops), resizes with fast_image_resize (AVX2). Other \
         processes kept {others:.0}% of the machine's CPU time busy during the run (load average \
         before/after: {load_before} / {load_after} on 2 cores).",
        written["files"],
        written["mean_bytes"].as_f64().unwrap_or(0.0)
    );
    if let Err(e) = &peer {
        notes += &format!(" Peer not measured: {e}");
    }
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: "cpu: 2-core AMD EPYC (AVX-512)".into(),
        notes,
        benchmarks: vec![
            Benchmark::higher_is_better(
                "loader_train_224_per_core",
                "img/s",
                ox_wall,
                get("img_per_s"),
                &peer_name,
                Some(1.5),
            ),
            Benchmark::higher_is_better(
                "loader_train_224_per_core_cpu_time",
                "img/CPU-s",
                ox_cpu,
                get("cpu_img_per_s"),
                &peer_name,
                None,
            ),
        ],
    };
    report.write(&bench_file("results/loader.json")).expect("write the results file");
    println!("{:<40} {:>10} {:>10} {:>7} {:>5}", "benchmark", "oxtrain", "peer", "ratio", "goal");
    for b in &report.benchmarks {
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        println!(
            "{:<40} {:>10.1} {:>10} {:>7} {:>5}",
            b.name,
            b.oxtrain,
            opt(b.peer, 1),
            opt(b.ratio, 3),
            opt(b.goal, 2)
        );
    }
}
