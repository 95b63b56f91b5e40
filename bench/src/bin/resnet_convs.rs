//! oxtrain's CPU convolution at every convolution shape of ResNet-50 (batch 8, 128x128 images,
//! torchvision's layout) against PyTorch's, forward, input gradient and weight gradient, each
//! shape weighted by how often one training step runs it.
//!
//! `cargo run --release -p oxtrain-bench --bin resnet_convs -- [THREADS] [cpu|wall]` prints a
//! table and one JSON line. `cpu` (the default) times process CPU time, which stays meaningful
//! on a loaded machine at one thread; `wall` is what a step feels. The peer runs in
//! `bench/peers/resnet_convs.py` under `OXTRAIN_PEER_PYTHON` (default `python3`). `BENCH_REPS`
//! sets the repetitions (default 5), `BENCH_STAT=min` reports the fastest repetition instead of
//! the median (steadier on a loaded machine, for comparing two builds).

use oxtrain_bench::{bench_file, median, uniform};
use oxtrain_tensor::Tensor;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

/// `(name, runs per step, in channels, input side, out channels, kernel, stride)`.
const SHAPES: &[(&str, usize, usize, usize, usize, usize, usize)] = &[
    ("conv1_7x7s2", 1, 3, 128, 64, 7, 2),
    ("l1_reduce_64", 1, 64, 32, 64, 1, 1),
    ("l1_reduce_256", 2, 256, 32, 64, 1, 1),
    ("l1_3x3", 3, 64, 32, 64, 3, 1),
    ("l1_expand", 4, 64, 32, 256, 1, 1),
    ("l2_reduce_first", 1, 256, 32, 128, 1, 1),
    ("l2_3x3s2", 1, 128, 32, 128, 3, 2),
    ("l2_down_s2", 1, 256, 32, 512, 1, 2),
    ("l2_reduce", 3, 512, 16, 128, 1, 1),
    ("l2_3x3", 3, 128, 16, 128, 3, 1),
    ("l2_expand", 4, 128, 16, 512, 1, 1),
    ("l3_reduce_first", 1, 512, 16, 256, 1, 1),
    ("l3_3x3s2", 1, 256, 16, 256, 3, 2),
    ("l3_down_s2", 1, 512, 16, 1024, 1, 2),
    ("l3_reduce", 5, 1024, 8, 256, 1, 1),
    ("l3_3x3", 5, 256, 8, 256, 3, 1),
    ("l3_expand", 6, 256, 8, 1024, 1, 1),
    ("l4_reduce_first", 1, 1024, 8, 512, 1, 1),
    ("l4_3x3s2", 1, 512, 8, 512, 3, 2),
    ("l4_down_s2", 1, 1024, 8, 2048, 1, 2),
    ("l4_reduce", 2, 2048, 4, 512, 1, 1),
    ("l4_3x3", 2, 512, 4, 512, 3, 1),
    ("l4_expand", 3, 512, 4, 2048, 1, 1),
];
const BATCH: usize = 8;
const PARTS: [&str; 3] = ["forward", "input_grad", "weight_grad"];

/// CPU time of this process so far (all threads), from `CLOCK_PROCESS_CPUTIME_ID`: on some
/// virtual machines /proc's schedstat advances in whole scheduler ticks (4 ms), too coarse for
/// a 1 ms convolution.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Seconds of `reps` calls of `f` after two warm-up calls, on the process CPU clock or the
/// wall clock; their median, or their minimum with `BENCH_STAT=min` (on a loaded machine
/// other processes only ever add time, so the minimum is the steadier figure for an A/B).
fn timed(reps: usize, cpu: bool, f: &mut dyn FnMut()) -> f64 {
    let start = std::time::Instant::now();
    let clock = || if cpu { cpu_seconds() } else { start.elapsed().as_secs_f64() };
    f();
    f();
    let times: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = clock();
            f();
            clock() - t
        })
        .collect();
    if std::env::var("BENCH_STAT").is_ok_and(|s| s == "min") {
        times.iter().copied().fold(f64::INFINITY, f64::min)
    } else {
        median(&times)
    }
}

fn peer(threads: usize, reps: usize, clock: &str) -> Result<Value, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python)
        .arg(bench_file("peers/resnet_convs.py"))
        .args([threads.to_string(), reps.to_string(), clock.to_string()])
        .env("OMP_NUM_THREADS", threads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    for &(name, _, c, hw, o, k, stride) in SHAPES {
        let line = json!({"name": name, "c": c, "hw": hw, "o": o, "k": k, "stride": stride});
        writeln!(stdin, "{line}").map_err(|e| e.to_string())?;
    }
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("the peer failed with {}", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))
}

/// Seconds per call of forward, input gradient and weight gradient at one shape.
fn measure(shape: (usize, usize, usize, usize, usize), reps: usize, cpu: bool) -> [f64; 3] {
    let (c, hw, o, k, s) = shape;
    let x = uniform(&[BATCH, c, hw, hw], 1);
    let w = uniform(&[o, c, k, k], 2);
    let (stride, padding, dil) = ([s, s], [k / 2, k / 2], [1, 1]);
    let y = x.conv2d(&w, None, stride, padding, dil, 1);
    let gy = uniform(y.dims(), 3);
    let time = |f: &mut dyn FnMut()| timed(reps, cpu, f);
    let wshape = [o, c, k, k];
    [
        time(&mut || {
            x.conv2d(&w, None, stride, padding, dil, 1);
        }),
        time(&mut || {
            Tensor::conv2d_backward_input(&gy, &w, [BATCH, c, hw, hw], stride, padding, dil, 1);
        }),
        time(&mut || {
            Tensor::conv2d_backward_weight(&gy, &x, wshape, stride, padding, dil, 1);
        }),
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let clock = args.get(2).map_or("cpu", String::as_str).to_string();
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("rayon pool");
    let ours: Vec<[f64; 3]> = pool.install(|| {
        SHAPES.iter().map(|&(_, _, c, hw, o, k, s)| measure((c, hw, o, k, s), reps, clock == "cpu")).collect()
    });
    let peer = peer(threads, reps, &clock).map_err(|e| eprintln!("peer: {e}")).ok();
    let theirs = |name: &str, part: &str| peer.as_ref().and_then(|p| p["shapes"][name][part].as_f64());
    println!("{threads} thread(s), {clock} time, ms per call (x runs per step); ratio = torch / oxtrain");
    println!("{:<16} {:>3}  {:>21}  {:>21}  {:>21}", "shape", "n", PARTS[0], PARTS[1], PARTS[2]);
    let mut totals = [[0.0f64; 2]; 3];
    let mut rows = vec![];
    for (&(name, runs, ..), t) in SHAPES.iter().zip(&ours) {
        let mut line = format!("{name:<16} {runs:>3}");
        let mut row = json!({"name": name, "runs": runs});
        for (p, part) in PARTS.iter().enumerate() {
            let peer_t = theirs(name, part).unwrap_or(f64::NAN);
            // The stem's input is the image: a step never needs its gradient.
            let counted = !(name.starts_with("conv1") && p == 1);
            if counted {
                totals[p][0] += t[p] * runs as f64;
                totals[p][1] += peer_t * runs as f64;
            }
            line += &format!("  {:>7.2} {:>7.2} {:>5.2}", t[p] * 1e3, peer_t * 1e3, peer_t / t[p]);
            row[part] = json!({"oxtrain_ms": t[p] * 1e3, "torch_ms": peer_t * 1e3});
        }
        println!("{line}");
        rows.push(row);
    }
    let mut line = format!("{:<20}", "step total");
    for [o, p] in totals {
        line += &format!("  {:>7.1} {:>7.1} {:>5.2}", o * 1e3, p * 1e3, p / o);
    }
    println!("{line}");
    let (o, p): (f64, f64) = totals.iter().fold((0.0, 0.0), |(a, b), t| (a + t[0], b + t[1]));
    println!(
        "all convolutions of a step: oxtrain {:.1} ms, torch {:.1} ms, ratio {:.2}",
        o * 1e3,
        p * 1e3,
        p / o
    );
    println!("{}", json!({"threads": threads, "clock": clock, "shapes": rows}));
}
