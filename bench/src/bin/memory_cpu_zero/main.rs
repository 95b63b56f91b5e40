//! Optimizer-state bytes per rank under ZeRO-1 for GPT-2 (4x256 and the 124M config, AdamW)
//! at 1, 2 and 4 ranks, against PyTorch's `ZeroRedundancyOptimizer(AdamW)` measured the same
//! way in the same run: after one step (state is made lazily), the bytes of every tensor of
//! the rank's optimizer state, the largest over ranks. oxtrain's ranks are threads over the
//! `local` backend; the peer's (`bench/peers/zero_memory.py`, under `OXTRAIN_PEER_PYTHON`,
//! default `python3`) are processes over gloo.
//!
//! Also the step-time cost of ZeRO-1: a GPT-2 4x256 training step (forward, backward, AdamW) on
//! 2 ranks with the optimizer sharded over the time of the same step with plain DDP, each rank
//! a fresh process of this program with one thread (`memory_cpu_zero child-time ...`) against
//! `bench/peers/zero_step_time.py` (DDP with `ZeroRedundancyOptimizer` over DDP with AdamW,
//! gloo, one thread per rank), interleaved.
//!
//! Writes its entries (`optimizer_state_gpt2_<config>_ranks<N>`, `zero_step_time_cost_*`) into
//! `bench/results/memory-cpu.json`, keeping the other entries of that file (the activation
//! checkpointing section): run from the repository root or `bench/`.

use oxtrain_bench::{bench_file, git_commit, today, Benchmark};
use oxtrain_comm::{Communicator, ShmOptions};
use oxtrain_ddp::{Ddp, DdpConfig, ZeroOptimizer};
use oxtrain_models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

const RESULT_FILE: &str = "memory-cpu.json";
const PREFIXES: [&str; 2] = ["optimizer_state_gpt2_", "zero_step_time_cost_"];
const PREFIX: &str = PREFIXES[0];

/// Model building draws from the process-wide generator: one rank at a time.
static BUILD: Mutex<()> = Mutex::new(());

/// The largest optimizer-state bytes of any rank after one ZeRO-1 step on `world` threads.
fn oxtrain_state_bytes(config: &Gpt2Config, world: usize) -> usize {
    let ranks = oxtrain_comm::shm::local_group(world, &ShmOptions::default()).expect("local ranks");
    let threads: Vec<_> = ranks
        .into_iter()
        .map(|w| {
            let config = config.clone();
            std::thread::spawn(move || {
                let comm: Arc<dyn Communicator> = Arc::new(w.comm);
                let model = {
                    let _lock = BUILD.lock().unwrap_or_else(|e| e.into_inner());
                    Gpt2LMHeadModel::new(&config, Device::Cpu).expect("GPT-2")
                };
                let ddp_config = DdpConfig { shard_optimizer: true, ..DdpConfig::default() };
                let ddp = Ddp::new(model, comm, ddp_config).expect("DDP");
                let mut opt = ZeroOptimizer::new(&ddp, ddp.module().parameters(), |g| {
                    AdamW::new(g, AdamWConfig { lr: 1e-4, ..Default::default() })
                })
                .expect("ZeRO-1");
                let ids: Vec<i64> = (0..8).map(|i| (i * 997 % config.vocab_size) as i64).collect();
                let ids = Tensor::from_vec(ids, [1, 8], Device::Cpu).expect("ids");
                let logits = ddp.forward_with(|m| m.forward(&ids, None));
                Gpt2LMHeadModel::loss(&logits, &ids).try_backward().expect("backward");
                opt.step();
                opt.state_bytes()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("a rank panicked")).max().unwrap_or(0)
}

/// The peer's figure, or why there is none.
fn peer_state_bytes(config: &Gpt2Config, world: usize) -> Result<(f64, String), String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = bench_file("peers/zero_memory.py");
    let args = [config.n_layer, config.n_embd, config.n_head, world].map(|x| x.to_string());
    let out = Command::new(&python)
        .arg(&script)
        .args(&args)
        .output()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))?;
    let bytes = v["state_bytes_per_rank"].as_f64().ok_or("no state_bytes_per_rank in the peer's output")?;
    Ok((bytes, v["torch"].as_str().unwrap_or("?").to_string()))
}

fn configs() -> Vec<(&'static str, Gpt2Config)> {
    let small = Gpt2Config { n_layer: 4, n_embd: 256, n_head: 4, ..Gpt2Config::gpt2() };
    vec![("4x256", small), ("124m", Gpt2Config::gpt2())]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child-time") {
        step_time::child(&args[2..]);
        return;
    }
    let mut entries = Vec::new();
    let mut torch = String::from("?");
    for (label, config) in configs() {
        for world in [1, 2, 4] {
            let ours = oxtrain_state_bytes(&config, world) as f64;
            let peer = match peer_state_bytes(&config, world) {
                Ok((bytes, version)) => {
                    torch = version;
                    Some(bytes)
                }
                Err(e) => {
                    eprintln!("peer, {label} on {world} ranks: {e}");
                    None
                }
            };
            eprintln!("{label}, {world} ranks: oxtrain {ours} bytes per rank, peer {peer:?}");
            // Fewer bytes is better: the ratio is peer over oxtrain.
            entries.push(Benchmark {
                name: format!("{PREFIX}{label}_ranks{world}"),
                unit: "bytes per rank".into(),
                oxtrain: ours,
                peer,
                peer_name: format!("torch {torch} ZeroRedundancyOptimizer(AdamW), gloo"),
                ratio: peer.map(|p| p / ours),
                goal: Some(1.0),
            });
        }
    }
    entries.extend(step_time::measure());
    let notes = "optimizer_state_*: ZeRO-1 AdamW state bytes after one step, largest rank; oxtrain ranks are \
                 threads (local backend), the peer's gloo processes; a step counter is 8 bytes in oxtrain (i64), \
                 4 in torch (f32); zero_step_time_cost_*: the median step (forward, backward, AdamW step) with \
                 ZeRO-1 over the median step of plain DDP, slowest rank, ranks as one-thread processes (oxtrain: \
                 shm backend, the all-gather overlapped with the next forward; PyTorch: gloo, \
                 ZeroRedundancyOptimizer), 5 rounds interleaved, the median round; lower is better, ratio = \
                 PyTorch's cost over oxtrain's";
    merge_into_results(&entries, notes);
}

mod step_time;

/// Replaces this program's entries in `memory-cpu.json` (created if absent), keeping the rest.
fn merge_into_results(entries: &[Benchmark], notes: &str) {
    let mine: Vec<Value> = entries.iter().map(Benchmark::to_json).collect();
    let Some(dir) = ["bench/results", "../bench/results"].iter().map(Path::new).find(|d| d.is_dir()) else {
        eprintln!("no bench/results folder here or one level up: results printed only");
        println!("{}", serde_json::to_string_pretty(&mine).expect("JSON"));
        return;
    };
    let path = dir.join(RESULT_FILE);
    let mut report: Value =
        std::fs::read_to_string(&path).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_else(
            || json!({ "machine": oxtrain_bench::cpu_description(), "notes": "", "benchmarks": [] }),
        );
    report["date"] = json!(today());
    report["commit"] = json!(git_commit());
    let old_notes = report["notes"].as_str().unwrap_or("").to_string();
    if !old_notes.contains("optimizer_state_*") {
        let joined = if old_notes.is_empty() { notes.to_string() } else { format!("{old_notes}; {notes}") };
        report["notes"] = json!(joined);
    }
    let mut all: Vec<Value> = report["benchmarks"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|b| !b["name"].as_str().is_some_and(|n| PREFIXES.iter().any(|p| n.starts_with(p))))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    all.extend(mine);
    report["benchmarks"] = json!(all);
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON") + "\n")
        .expect("writing results");
    eprintln!("wrote {}", path.display());
}
