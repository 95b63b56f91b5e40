//! CPU benchmark of oxtrain's matrix product and convolution against numpy and PyTorch, all
//! measured in the same run on the same machine.
//!
//! `cargo run --release -p oxtrain-bench --bin cpu_ops` writes `bench/results/cpu-ops.json`.
//! The peers run in `bench/peers/cpu_ops.py` under the interpreter named by
//! `OXTRAIN_PEER_PYTHON` (default `python3`; it needs numpy, torch and threadpoolctl).
//! `BENCH_REPS` sets the repetitions (default 10; matmul runs twice as many).
//!
//! Two measurements, each for oxtrain and the peers:
//! - wall-clock time with all threads: the figures the goals refer to;
//! - CPU time with one thread: when other processes load the machine, wall-clock figures
//!   mostly measure the scheduler, while the CPU time of a single thread still measures the
//!   kernel (extra entries, suffixed `_cpu_time_1thread`).

use oxtrain_bench::{
    bench_file, git_commit, load_average, median_cpu_seconds, median_seconds, today, uniform, Benchmark,
    OtherLoad, Report,
};
use serde_json::Value;
use std::process::Command;

const MATMUL_N: usize = 1024;
const CONV_INPUT: [usize; 4] = [32, 64, 56, 56];
const CONV_WEIGHT: [usize; 4] = [64, 64, 3, 3];

/// Peer figures from the Python script, which prints one JSON object.
fn run_peers(reps: usize, mode: &str) -> Result<Value, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = bench_file("peers/cpu_ops.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg(reps.to_string()).arg(mode);
    // The machine sets these for an old OpenBLAS; they force numpy's current OpenBLAS onto a
    // kernel of half the speed. numpy's users get the native kernel, so the peer runs without them.
    cmd.env_remove("OPENBLAS_CORETYPE").env_remove("OPENBLAS_L2_SIZE");
    if mode == "cpu1" {
        cmd.env("OPENBLAS_NUM_THREADS", "1");
    }
    let out = cmd.output().map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} {script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))
}

/// oxtrain's figures: matmul GFLOP/s and conv2d seconds, timed with `median`.
fn measure_oxtrain(reps: usize, median: fn(usize, usize, &mut dyn FnMut()) -> f64) -> (f64, f64) {
    let a = uniform(&[MATMUL_N, MATMUL_N], 1);
    let b = uniform(&[MATMUL_N, MATMUL_N], 2);
    let mm_s = median(3, 2 * reps, &mut || {
        a.matmul(&b);
    });
    let (x, w) = (uniform(&CONV_INPUT, 3), uniform(&CONV_WEIGHT, 4));
    let conv_s = median(2, reps, &mut || {
        x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1);
    });
    (matmul_flops() / mm_s / 1e9, conv_s)
}

fn matmul_flops() -> f64 {
    2.0 * (MATMUL_N as f64).powi(3)
}

fn conv_flops() -> f64 {
    let ([n, c, h, w], [o, _, kh, kw]) = (CONV_INPUT, CONV_WEIGHT);
    2.0 * (n * o * c * kh * kw * h * w) as f64
}

/// The three entries of one measurement; `suffix` tells measurements apart.
fn entries(suffix: &str, (mm_gflops, conv_s): (f64, f64), peers: &Result<Value, String>) -> Vec<Benchmark> {
    let peer = |k: &str| peers.as_ref().ok().and_then(|p| p[k].as_f64());
    let torch = match peers {
        Ok(p) => format!("torch {}", p["torch_version"].as_str().unwrap_or("?")),
        Err(_) => "torch".into(),
    };
    let gflops = |s: f64| conv_flops() / s / 1e9;
    let goal = |g: f64| if suffix.is_empty() { Some(g) } else { None };
    vec![
        Benchmark::higher_is_better(
            &format!("matmul_f32_1024{suffix}"),
            "GFLOP/s",
            mm_gflops,
            peer("numpy_matmul_gflops"),
            "numpy matmul (OpenBLAS)",
            goal(0.8),
        ),
        Benchmark::higher_is_better(
            &format!("conv2d_f32_b32_c64_56{suffix}"),
            "GFLOP/s",
            gflops(conv_s),
            peer("torch_conv2d_ms").map(|ms| gflops(ms / 1e3)),
            &format!("{torch} F.conv2d"),
            goal(0.5),
        ),
        Benchmark::higher_is_better(
            &format!("matmul_f32_1024_vs_torch{suffix}"),
            "GFLOP/s",
            mm_gflops,
            peer("torch_matmul_gflops"),
            &format!("{torch} torch.matmul"),
            None,
        ),
    ]
}

fn main() {
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let load_before = load_average();
    let other_load = OtherLoad::start();
    let threads = rayon::current_num_threads();

    let wall = measure_oxtrain(reps, median_seconds);
    eprintln!(
        "oxtrain, wall clock, {threads} threads: matmul {:.1} GFLOP/s, conv2d {:.2} ms",
        wall.0,
        wall.1 * 1e3
    );
    let peers_wall = run_peers(reps, "wall");

    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let cpu1 = one.install(|| measure_oxtrain(reps, median_cpu_seconds));
    eprintln!("oxtrain, CPU time, 1 thread: matmul {:.1} GFLOP/s, conv2d {:.2} ms", cpu1.0, cpu1.1 * 1e3);
    let peers_cpu1 = run_peers(reps, "cpu1");
    let load_after = load_average();
    let others = other_load.percent();

    let mut notes = format!(
        "oxtrain: gemm 0.19 (feature x86-v4), {threads} rayon threads, avx512f detected: {}; conv2d is \
         im2col over bands of output rows + GEMM, in parallel over the batch. Wall clock: median of {} \
         (matmul) / {reps} (conv) repetitions after warm-up; entries suffixed _cpu_time_1thread time \
         the CPU time of one thread instead (oxtrain in a one-thread rayon pool, torch.set_num_threads(1), \
         OPENBLAS_NUM_THREADS=1), which other processes on the machine disturb far less. Other processes \
         kept {others:.0}% of the machine's CPU time busy during the run (load average before/after: \
         {load_before} / {load_after} on 2 cores).",
        is_x86_feature_detected!("avx512f"),
        2 * reps,
    );
    match &peers_wall {
        Ok(p) => {
            notes += &format!(
                " Peers: numpy {}, BLAS as threadpoolctl sees it: {} (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE \
                 unset for the peer process only); torch {} with {} threads.",
                p["numpy_version"].as_str().unwrap_or("?"),
                p["numpy_blas"],
                p["torch_version"].as_str().unwrap_or("?"),
                p["torch_threads"],
            );
        }
        Err(e) => notes += &format!(" Peers not measured: {e}"),
    }
    let mut benchmarks = entries("", wall, &peers_wall);
    benchmarks.extend(entries("_cpu_time_1thread", cpu1, &peers_cpu1));
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: "cpu: 2-core AMD EPYC (AVX-512)".into(),
        notes,
        benchmarks,
    };
    report.write(&bench_file("results/cpu-ops.json")).expect("write the results file");
    println!("{:<42} {:>10} {:>10} {:>7} {:>5}", "benchmark", "oxtrain", "peer", "ratio", "goal");
    for b in &report.benchmarks {
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        println!(
            "{:<42} {:>10.1} {:>10} {:>7} {:>5}",
            b.name,
            b.oxtrain,
            opt(b.peer, 1),
            opt(b.ratio, 3),
            opt(b.goal, 2)
        );
    }
}
