//! CPU benchmark of the memory-bound ops of a training step against PyTorch, one thread each,
//! in the same run: relu, the broadcast multiplies of batch norm (per channel, per row), the
//! per-channel sum, copy, same-shape add, ReLU's backward and batch norm's forward and
//! forward+backward, all on one 8x64x64x64 f32 tensor.
//!
//! `cargo run --release -p oxtrain-bench --bin elementwise` writes
//! `bench/results/cpu-elementwise.json` (`ELEMENTWISE_OUT` names another file). The peer is
//! `bench/peers/elementwise.py` under `OXTRAIN_PEER_PYTHON` (default `python3`).
//! `BENCH_REPS` sets the repetitions (default 15).

use oxtrain_autograd::Var;
use oxtrain_bench::{
    bench_file, git_commit, load_average, median_seconds, today, uniform, Benchmark, OtherLoad, Report,
};
use serde_json::Value;
use std::process::Command;

const SHAPE: [usize; 4] = [8, 64, 64, 64];

fn run_peer(reps: usize) -> Result<Value, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = bench_file("peers/elementwise.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(reps.to_string())
        .env("OMP_NUM_THREADS", "1")
        .output()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} {script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))
}

/// oxtrain's time of each op in milliseconds, in the peer's key order.
fn measure(reps: usize) -> Vec<(&'static str, f64)> {
    let x = uniform(&SHAPE, 1);
    let y = uniform(&SHAPE, 2);
    let c = uniform(&[1, 64, 1, 1], 3);
    let r = uniform(&[1, 1, 1, 64], 4);
    let (w, b) = (uniform(&[64], 5), uniform(&[64], 6));
    let ms = |f: &mut dyn FnMut()| median_seconds(3, reps, f) * 1e3;
    let mut out = vec![
        ("relu", ms(&mut || drop(x.relu()))),
        ("mul_channel", ms(&mut || drop(x.mul(&c)))),
        ("mul_row", ms(&mut || drop(x.mul(&r)))),
        ("sum_channel", ms(&mut || drop(x.sum([0, 2, 3], false)))),
        ("copy", ms(&mut || drop(x.copy()))),
        ("add", ms(&mut || drop(x.add(&y)))),
    ];
    // The kernel alone, as the peer times aten.threshold_backward alone.
    out.push(("relu_backward", ms(&mut || drop(y.threshold_backward(&x, 0.0)))));
    out.push(("batch_norm_forward", ms(&mut || drop(x.batch_norm_training(Some(&w), Some(&b), 1e-5)))));
    let (xv, wv, bv) = (Var::parameter(x.clone()), Var::parameter(w.clone()), Var::parameter(b.clone()));
    out.push((
        "batch_norm_forward_backward",
        ms(&mut || {
            let (o, _, _) = xv.batch_norm_training(Some(&wv), Some(&bv), 1e-5);
            o.backward_with(y.clone(), false);
            for v in [&xv, &wv, &bv] {
                v.set_grad(None);
            }
        }),
    ));
    out
}

fn main() {
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let load_before = load_average();
    let other_load = OtherLoad::start();
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    // Interleaved: oxtrain, torch, oxtrain, torch; each figure is the better of its two runs'
    // medians, so a burst of load from other processes hits at most one of them.
    let mut ours = one.install(|| measure(reps));
    let mut peer = run_peer(reps);
    let ours2 = one.install(|| measure(reps));
    for (o, (_, t)) in ours.iter_mut().zip(ours2) {
        o.1 = o.1.min(t);
    }
    if let (Ok(p1), Ok(p2)) = (&mut peer, run_peer(reps)) {
        for (k, _) in &ours {
            if let (Some(a), Some(b)) = (p1[*k].as_f64(), p2[*k].as_f64()) {
                p1[*k] = a.min(b).into();
            }
        }
    }
    let torch = match &peer {
        Ok(p) => format!("torch {}", p["torch_version"].as_str().unwrap_or("?")),
        Err(_) => "torch".into(),
    };
    let benchmarks = ours
        .iter()
        .map(|(k, ms)| {
            let p = peer.as_ref().ok().and_then(|p| p[*k].as_f64());
            let mut bm =
                Benchmark::higher_is_better(&format!("{k}_f32_8x64x64x64_1t"), "ms", *ms, p, &torch, None);
            // Times: the ratio is peer time over oxtrain time.
            bm.ratio = p.map(|p| p / ms);
            bm
        })
        .collect();
    let others = other_load.percent();
    let mut notes = format!(
        "One thread each (a one-thread rayon pool; torch.set_num_threads(1)); median of {reps} after 3 \
         warm-up calls, run twice interleaved (oxtrain, torch, oxtrain, torch), the better median kept. \
         ratio = torch time / oxtrain time. avx512f detected: {}. Other processes kept {others:.0}% of \
         the machine busy (load average before/after {load_before} / {})",
        is_x86_feature_detected!("avx512f"),
        load_average()
    );
    if let Err(e) = &peer {
        notes += &format!("; peer not measured: {e}");
    }
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: "cpu: 2-core Intel Xeon (Sapphire Rapids, AVX-512)".into(),
        notes,
        benchmarks,
    };
    let path =
        std::env::var("ELEMENTWISE_OUT").unwrap_or_else(|_| bench_file("results/cpu-elementwise.json"));
    report.write(&path).expect("write the results file");
    println!("{:<48} {:>9} {:>9} {:>7}", "benchmark (ms)", "oxtrain", "torch", "ratio");
    for b in &report.benchmarks {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!("{:<48} {:>9.3} {:>9} {:>7}", b.name, b.oxtrain, opt(b.peer), opt(b.ratio));
    }
}
