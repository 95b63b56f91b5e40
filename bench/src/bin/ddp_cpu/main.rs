//! DDP on CPU: 2 processes over the `shm` backend against PyTorch DDP over gloo, same model
//! (torchvision's ResNet-18, 1000 classes, 64x64 images, batch 16 per rank, SGD momentum),
//! one thread per process, and each side's 1-process run (no DDP), all in the same run,
//! interleaved (oxtrain 1, torch 1, oxtrain 2, torch 2, per round).
//!
//! `cargo run --release -p oxtrain-bench --bin ddp_cpu` writes `bench/results/ddp-cpu.json`:
//! - `ddp_cpu_2r_resnet18_64_efficiency`: scaling efficiency, 2-process throughput over twice
//!   the 1-process throughput (oxtrain's; peer: PyTorch's, measured the same way). What DDP
//!   adds or hides; the goal is a ratio of at least 1.
//! - `ddp_cpu_2r_resnet18_64`: 2-process throughput, oxtrain over PyTorch (follows the
//!   compute speed of one process).
//!
//! The peer is `bench/peers/ddp_cpu.py` under `OXTRAIN_PEER_PYTHON` (default `python3`, with
//! torch and torchvision). `BENCH_ROUNDS` (default 2) rounds, `BENCH_STEPS` (default 10) timed
//! steps after 3 of warm-up, per run; a run's figure is its slowest rank's median step.
//!
//! Internally the same binary is each rank: `ddp_cpu rank` reads torchrun's variables.
//! `ddp_cpu step-rank` is one rank of the DDP step check of the scaling model
//! (`scripts/netns/ddp_step.sh`, see `step.rs`).

mod step;

use oxtrain_autograd::Var;
use oxtrain_bench::{
    git_commit, load_average, median, today, torchrun_command, Benchmark, OtherLoad, Report,
};
use oxtrain_ddp::{Ddp, DdpConfig};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{loss, Module};
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const BATCH: usize = 16;
const SIZE: usize = 64;
const WARMUP: usize = 3;

fn steps() -> usize {
    std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

/// A ResNet-18 and rank `rank`'s batch of `batch` `size`x`size` images: random images
/// (seeded by the rank) and fixed labels.
fn model_and_batch(
    rank: usize,
    batch: usize,
    size: usize,
) -> Result<(ResNet, Var, Tensor), Box<dyn std::error::Error>> {
    let model = ResNet::new(&ResNetConfig::resnet18(), Device::Cpu)?;
    let mut g = Generator::new(rank as u64);
    let images =
        Distribution::STANDARD_NORMAL.sample_with(&mut g, [batch, 3, size, size], DType::F32, Device::Cpu)?;
    let labels: Vec<i64> = (0..batch).map(|i| ((i * 37 + rank * 11) % 1000) as i64).collect();
    Ok((model, Var::constant(images), Tensor::from_vec(labels, batch, Device::Cpu)?))
}

/// One rank (or the single process when WORLD_SIZE is 1): prints its median step time.
fn rank() -> Result<(), Box<dyn std::error::Error>> {
    let world: usize = std::env::var("WORLD_SIZE")?.parse()?;
    let rank: usize = std::env::var("RANK")?.parse()?;
    let (model, images, labels) = model_and_batch(rank, BATCH, SIZE)?;
    let sgd = SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() };
    let mut times = Vec::new();
    let mut exposed = Vec::new();
    if world == 1 {
        let mut opt = Sgd::new(model.parameters(), sgd);
        for i in 0..WARMUP + steps() {
            let t = Instant::now();
            opt.zero_grad();
            loss::cross_entropy(&model.forward(&images), &labels).backward();
            opt.step();
            if i >= WARMUP {
                times.push(t.elapsed().as_secs_f64());
            }
        }
    } else {
        let pg = oxtrain_comm::init_from_env()?;
        let ddp = Ddp::new(model, pg.comm, DdpConfig::default())?;
        let mut opt = Sgd::new(ddp.module().parameters(), sgd);
        for i in 0..WARMUP + steps() {
            let t = Instant::now();
            opt.zero_grad();
            loss::cross_entropy(&ddp.forward(&images), &labels).try_backward()?;
            opt.step();
            if i >= WARMUP {
                times.push(t.elapsed().as_secs_f64());
                exposed.push(ddp.last_step().map_or(0.0, |s| s.exposed_comm.as_secs_f64()));
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({"rank": rank, "step_s": median(&times), "exposed_s": if exposed.is_empty() { 0.0 } else { median(&exposed) }})
    );
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29500)
}

/// Runs `world` ranks of `program args` with torchrun's variables, one thread each; returns
/// every rank's JSON line.
fn launch(program: &str, args: &[&str], world: usize) -> Result<Vec<Value>, String> {
    let port = free_port().to_string();
    let children: Vec<_> = (0..world)
        .map(|r| {
            torchrun_command(program, r, world, &port)
                .args(args)
                .env("OXTRAIN_COMM_BACKEND", "shm")
                .env("RAYON_NUM_THREADS", "1")
                .env("OMP_NUM_THREADS", "1")
                .env("BENCH_STEPS", steps().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not start {program}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for c in children {
        let o = c.wait_with_output().map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!("{program} {args:?} failed: {}", String::from_utf8_lossy(&o.stderr)));
        }
        let line = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or("").to_string();
        out.push(serde_json::from_str(&line).map_err(|e| format!("{program}: not JSON ({e}): {line}"))?);
    }
    Ok(out)
}

/// Images per second of a run: the global batch over the slowest rank's median step.
fn throughput(ranks: &[Value]) -> (f64, f64) {
    let slowest = ranks.iter().map(|r| r["step_s"].as_f64().unwrap_or(f64::NAN)).fold(0.0, f64::max);
    let exposed = ranks.iter().map(|r| r["exposed_s"].as_f64().unwrap_or(0.0)).fold(0.0, f64::max);
    ((BATCH * ranks.len()) as f64 / slowest, exposed)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().nth(1).as_deref() {
        Some("rank") => return rank(),
        Some("step-rank") => return step::step_rank(),
        _ => {}
    }
    let me = std::env::current_exe()?.to_string_lossy().into_owned();
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = if Path::new("bench/peers").is_dir() {
        "bench/peers/ddp_cpu.py".to_string()
    } else {
        format!("{}/peers/ddp_cpu.py", env!("CARGO_MANIFEST_DIR"))
    };
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let load_before = load_average();
    let others = OtherLoad::start();
    let (mut ox1, mut ox2, mut pt1, mut pt2, mut ox_exposed) = (vec![], vec![], vec![], vec![], vec![]);
    let mut peer_error = None;
    for round in 0..rounds {
        ox1.push(throughput(&launch(&me, &["rank"], 1)?).0);
        match launch(&python, &[&script], 1) {
            Ok(r) => pt1.push(throughput(&r).0),
            Err(e) => peer_error = Some(e),
        }
        let (t, e) = throughput(&launch(&me, &["rank"], 2)?);
        ox2.push(t);
        ox_exposed.push(e);
        if peer_error.is_none() {
            match launch(&python, &[&script], 2) {
                Ok(r) => pt2.push(throughput(&r).0),
                Err(e) => peer_error = Some(e),
            }
        }
        eprintln!(
            "round {round}: oxtrain 1p {:.1} img/s, 2p {:.1} img/s (exposed comm {:.1} ms); torch 1p {:?}, 2p {:?}",
            ox1[round],
            ox2[round],
            1e3 * ox_exposed[round],
            pt1.last(),
            pt2.last()
        );
    }
    let (o1, o2) = (median(&ox1), median(&ox2));
    let ox_eff = o2 / (2.0 * o1);
    let (p_eff, p1, p2) = if pt1.is_empty() || pt2.is_empty() {
        (None, None, None)
    } else {
        let (p1, p2) = (median(&pt1), median(&pt2));
        (Some(p2 / (2.0 * p1)), Some(p1), Some(p2))
    };
    let torch_version = Command::new(&python)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let peer_name = format!("PyTorch {torch_version} DDP (gloo), torchvision resnet18");
    let mut notes = format!(
        "ResNet-18 (1000 classes), 64x64, batch {BATCH} per rank, SGD momentum, synthetic data; one thread per \
         process (RAYON_NUM_THREADS=1 / torch.set_num_threads(1)); {rounds} rounds interleaved (oxtrain 1p, torch 1p, \
         oxtrain 2p, torch 2p), {} timed steps after {WARMUP} warm-up per run, a run's figure from its slowest rank's \
         median step. oxtrain: shm backend, default DdpConfig; 1-process figures {o1:.2} img/s (oxtrain){}; exposed \
         communication of oxtrain's 2-process step {:.1} ms (median). Load average {load_before} before; other \
         processes kept {:.0}% of the machine busy during the run.",
        steps(),
        p1.map(|p| format!(", {p:.2} img/s (PyTorch)")).unwrap_or_default(),
        1e3 * median(&ox_exposed),
        others.percent()
    );
    if let Some(e) = &peer_error {
        notes.push_str(&format!(" The peer did not run: {e}"));
    }
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: format!(
            "{} cores (this workplace's CPU machine)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
        notes,
        benchmarks: vec![
            Benchmark::higher_is_better(
                "ddp_cpu_2r_resnet18_64_efficiency",
                "fraction",
                ox_eff,
                p_eff,
                &peer_name,
                Some(1.0),
            ),
            Benchmark::higher_is_better("ddp_cpu_2r_resnet18_64", "img/s", o2, p2, &peer_name, None),
        ],
    };
    std::fs::create_dir_all("bench/results")?;
    report.write("bench/results/ddp-cpu.json")?;
    println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    Ok(())
}
