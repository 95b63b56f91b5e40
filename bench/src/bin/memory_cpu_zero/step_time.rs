//! The step-time cost of ZeRO-1 on the CPU: a GPT-2 4x256 step on 2 ranks with the optimizer
//! sharded, over the same step with plain DDP, oxtrain's and PyTorch's, interleaved.
//!
//! Each rank is a process with one compute thread (ranks as threads would share one rayon
//! pool): `memory_cpu_zero child-time MODE STEPS` started with torchrun's variables, on the
//! shm backend. The peer is `bench/peers/zero_step_time.py MODE STEPS WORLD`.

use oxtrain_bench::{bench_file, median, Benchmark};
use oxtrain_comm::{init_from_env, Communicator};
use oxtrain_ddp::{Ddp, DdpConfig, ZeroOptimizer};
use oxtrain_models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_nn::optim::{AdamW, AdamWConfig, IntoParamGroups, Optimizer, ParamGroupSpec};
use oxtrain_nn::Module;
use oxtrain_tensor::{manual_seed, Device, Generator, Tensor};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

const WORLD: usize = 2;
const STEPS: usize = 6;
const ROUNDS: usize = 5;
/// Tokens per rank and step: 2 sequences of 128.
const BATCH: [usize; 2] = [2, 128];

fn config() -> Gpt2Config {
    Gpt2Config { n_layer: 4, n_embd: 256, n_head: 4, ..Gpt2Config::gpt2() }
}

/// One rank's median step after the first: prints `{"step_seconds": s}`.
pub fn child(args: &[String]) {
    let [mode, steps] = args else { panic!("child-time MODE STEPS, got {args:?}") };
    let steps: usize = steps.parse().expect("STEPS is a number");
    let group = init_from_env().expect("the process group (torchrun's variables, shm)");
    let rank = group.env.rank;
    let comm: Arc<dyn Communicator> = Arc::from(group.comm);
    manual_seed(0);
    let model = Gpt2LMHeadModel::new(&config(), Device::Cpu).expect("GPT-2");
    model.train(true);
    let sharded = mode == "zero";
    let ddp =
        Ddp::new(model, comm, DdpConfig { shard_optimizer: sharded, ..DdpConfig::default() }).expect("DDP");
    let adamw = |g: Vec<ParamGroupSpec>| AdamW::new(g, AdamWConfig { lr: 1e-4, ..Default::default() });
    let mut opt: Box<dyn Optimizer> = if sharded {
        Box::new(ZeroOptimizer::new(&ddp, ddp.module().parameters(), adamw).expect("ZeRO-1"))
    } else {
        Box::new(adamw(ddp.module().parameters().into_param_groups()))
    };
    let ids = Tensor::randint_with(&mut Generator::new(1 + rank as u64), 0, 50257, BATCH, Device::Cpu)
        .expect("token ids");
    let mut times = Vec::new();
    for _ in 0..steps {
        let start = Instant::now();
        opt.zero_grad();
        let logits = ddp.forward_with(|m| m.forward(&ids, None));
        Gpt2LMHeadModel::loss(&logits, &ids).try_backward().expect("backward");
        opt.step();
        times.push(start.elapsed().as_secs_f64());
    }
    println!("{}", json!({ "step_seconds": median(&times[1..]) }));
}

/// A free TCP port on this host for a group's store.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The slowest rank's median step of one oxtrain group in `mode` ("ddp" or "zero").
fn oxtrain_step(mode: &str) -> Result<f64, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port().to_string();
    let ranks: Vec<_> = (0..WORLD)
        .map(|r| {
            Command::new(&me)
                .args(["child-time", mode, &STEPS.to_string()])
                .envs([("RANK", r.to_string()), ("LOCAL_RANK", r.to_string())])
                .envs([("WORLD_SIZE", WORLD.to_string()), ("LOCAL_WORLD_SIZE", WORLD.to_string())])
                .envs([("MASTER_ADDR", "127.0.0.1".to_string()), ("MASTER_PORT", port.clone())])
                .env("OXTRAIN_COMM_BACKEND", "shm")
                .env("RAYON_NUM_THREADS", "1")
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting rank {r}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut slowest: f64 = 0.0;
    for (r, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().map_err(|e| format!("rank {r}: {e}"))?;
        if !out.status.success() {
            return Err(format!("rank {r} of the {mode} group failed ({})", out.status));
        }
        slowest = slowest.max(step_seconds(&out.stdout)?);
    }
    Ok(slowest)
}

fn step_seconds(stdout: &[u8]) -> Result<f64, String> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {line}"))?;
    v["step_seconds"].as_f64().ok_or_else(|| format!("no step_seconds in {line}"))
}

/// The peer's slowest-rank median step in `mode`.
fn peer_step(mode: &str) -> Result<f64, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = bench_file("peers/zero_step_time.py");
    let out = Command::new(&python)
        .args([script.as_str(), mode, &STEPS.to_string(), &WORLD.to_string()])
        .env("OMP_NUM_THREADS", "1")
        .output()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    step_seconds(&out.stdout)
}

/// ROUNDS rounds of the four groups (oxtrain and PyTorch, plain and sharded), interleaved; the
/// cost of each round's pair, the median round.
pub fn measure() -> Vec<Benchmark> {
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut peer_error = None;
    for round in 0..ROUNDS {
        let pair = oxtrain_step("ddp").and_then(|plain| Ok((plain, oxtrain_step("zero")?)));
        let peer = peer_step("ddp").and_then(|plain| Ok((plain, peer_step("zero")?)));
        eprintln!("zero step time, round {round}: oxtrain (ddp, zero) {pair:?}, torch {peer:?}");
        match pair {
            Ok(p) => ours.push(p),
            Err(e) => {
                eprintln!("oxtrain's step-time groups failed: {e}");
                return Vec::new();
            }
        }
        match peer {
            Ok(p) => theirs.push(p),
            Err(e) => peer_error = Some(e),
        }
    }
    let cost =
        |pairs: &[(f64, f64)]| median(&pairs.iter().map(|(plain, zero)| zero / plain).collect::<Vec<_>>());
    let oxtrain = cost(&ours);
    // Rounds whose peer group failed are left out (said on stderr), the others kept.
    let peer = (!theirs.is_empty()).then(|| cost(&theirs));
    if let Some(e) = peer_error {
        eprintln!("peer: {} of {ROUNDS} rounds ran; the last failure: {e}", theirs.len());
    }
    vec![Benchmark {
        name: format!("zero_step_time_cost_gpt2_4x256_ranks{WORLD}"),
        unit: "x".into(),
        oxtrain,
        peer,
        peer_name: "torch DDP + ZeroRedundancyOptimizer(AdamW) over DDP + AdamW, gloo".into(),
        ratio: peer.map(|p| p / oxtrain),
        goal: None,
    }]
}
