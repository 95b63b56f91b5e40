//! `ddp_cpu step-rank`: one rank of the DDP step check of the scaling model
//! (`scripts/netns/ddp_step.sh` runs it; `bench/src/bin/scaling_model/cpu_ddp.rs` reads what
//! it writes). ResNet-18 (1000 classes) on 32x32 images, batch 8 per rank, SGD momentum, one
//! thread, wrapped in DDP with its trace on, so every step gives forward, backward compute
//! (to the last gradient), the wait for the all-reduces, the optimizer, and each bucket's
//! bytes, launch (from the start of backward) and all-reduce time.
//!
//! - `BENCH_ALONE=1`: no other rank (a process group of one, in this process): the compute
//!   of a step and when each bucket becomes ready, with no communication. The check runs N
//!   of these side by side to get a rank's compute when N processes share the cores.
//! - otherwise the process group from the launcher's variables (torchrun's or mpirun's).
//! - `BENCH_BUCKET_MB=X`: both bucket caps at X MiB (a cap above the gradients' size gives
//!   one bucket, launched when backward ends: no overlap).
//! - `BENCH_OUT_DIR`: each rank writes `rank-R.json` there (mpirun's forwarded output may
//!   interleave lines), else prints it.

use oxtrain_bench::median;
use oxtrain_comm::Communicator;
use oxtrain_ddp::{Ddp, DdpConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{loss, Module};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

const BATCH: usize = 8;
const SIZE: usize = 32;
const WARMUP: usize = 3;

/// (name, start us, duration us, bytes) of every complete event of a DDP trace.
fn spans(trace: &str) -> Vec<(String, f64, f64, f64)> {
    let v: Value = serde_json::from_str(trace).unwrap_or(Value::Null);
    v["traceEvents"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| {
            let bytes = e["args"]["bytes"].as_str().and_then(|b| b.parse().ok()).unwrap_or(0.0);
            Some((e["name"].as_str()?.to_string(), e["ts"].as_f64()?, e["dur"].as_f64()?, bytes))
        })
        .collect()
}

pub fn step_rank() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let alone = std::env::var("BENCH_ALONE").is_ok_and(|v| v == "1");
    let mut cfg = DdpConfig::default();
    if let Some(mb) = std::env::var("BENCH_BUCKET_MB").ok().and_then(|s| s.parse().ok()) {
        cfg.bucket_cap_mb = mb;
        cfg.first_bucket_cap_mb = mb;
    }
    // A group of one keeps its heap (the shm segment) alive next to it.
    let (comm, _keep): (Arc<dyn Communicator>, Option<oxtrain_comm::ShmHeap>) = if alone {
        let w = oxtrain_comm::local_group(1)?.pop().ok_or("no local group")?;
        (Arc::new(w.comm), Some(w.heap))
    } else {
        (Arc::from(oxtrain_comm::init_from_env()?.comm), None)
    };
    let (rank, world, backend) = (comm.rank(), comm.world_size(), comm.backend().to_string());
    let (model, images, labels) = super::model_and_batch(rank, BATCH, SIZE)?;
    let ddp = Ddp::new(model, comm, cfg)?;
    ddp.enable_trace();
    let mut opt =
        Sgd::new(ddp.module().parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let (mut step_ms, mut opt_ms) = (vec![], vec![]);
    for i in 0..WARMUP + steps {
        let t = Instant::now();
        opt.zero_grad();
        loss::cross_entropy(&ddp.forward(&images), &labels).try_backward()?;
        let o = Instant::now();
        opt.step();
        if i >= WARMUP {
            opt_ms.push(1e3 * o.elapsed().as_secs_f64());
            step_ms.push(1e3 * t.elapsed().as_secs_f64());
        }
    }
    // Each step's spans: one forward, one backward (to the end of the wait), one backward
    // compute (to the last gradient), and its buckets' all-reduces, launched inside backward.
    let all = spans(&ddp.trace_json());
    let named = |n: &str| -> Vec<(f64, f64)> {
        all.iter().filter(|s| s.0 == n).skip(WARMUP).map(|s| (s.1, s.2)).collect()
    };
    let (forward, backward, compute) = (named("forward"), named("backward"), named("backward compute"));
    let ms = |v: &[(f64, f64)]| median(&v.iter().map(|s| s.1 / 1e3).collect::<Vec<_>>());
    let mut buckets: Vec<Vec<(f64, f64, f64)>> = vec![];
    for &(bw_start, bw_dur) in &backward {
        let inside = all
            .iter()
            .filter(|s| s.0.starts_with("all_reduce bucket ") && s.1 >= bw_start && s.1 <= bw_start + bw_dur);
        for (b, s) in inside.enumerate() {
            if buckets.len() <= b {
                buckets.push(vec![]);
            }
            buckets[b].push((s.3, (s.1 - bw_start) / 1e3, s.2 / 1e3));
        }
    }
    let column =
        |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let buckets: Vec<Value> = buckets
        .iter()
        .map(
            |v| json!({"bytes": v[0].0, "ready_ms": column(v, |s| s.1), "all_reduce_ms": column(v, |s| s.2)}),
        )
        .collect();
    let exposed: Vec<(f64, f64)> =
        backward.iter().zip(&compute).map(|(b, c)| (0.0, (b.1 - c.1).max(0.0))).collect();
    let out = json!({
        "rank": rank,
        "world": world,
        "backend": if alone { "alone".to_string() } else { backend },
        "steps": steps,
        "step_ms": median(&step_ms),
        "forward_ms": ms(&forward),
        "backward_ms": ms(&backward),
        "backward_compute_ms": ms(&compute),
        "exposed_ms": ms(&exposed),
        "optimizer_ms": median(&opt_ms),
        "buckets": buckets,
    });
    match std::env::var("BENCH_OUT_DIR") {
        Ok(dir) => {
            std::fs::write(std::path::Path::new(&dir).join(format!("rank-{rank}.json")), out.to_string())?
        }
        Err(_) => println!("{out}"),
    }
    Ok(())
}
