//! The model's DDP step checked against DDP steps measured on CPU (`ddp-cpu-netns.json`,
//! written by `scripts/netns/ddp_step.sh`). For a run of N ranks the model takes what it
//! would take on a cluster: one rank's compute measured with no communication (the `alone-N`
//! run: N processes side by side, so a rank's share of the cores is the same), its buckets
//! (bytes, and when each is ready from the start of backward), and the all-reduce fits of
//! `comm-netns-cpu.json` (shm: its 2-rank fit; mpi across the namespaces: the cluster of the
//! CPU check, Open MPI's own algorithm), and places the buckets' all-reduces on that step
//! (`ddp::step`): with overlap for DDP's default buckets, without for one bucket launched
//! when backward ends.

use crate::cluster::{Algo, Cluster};
use crate::ddp::{self, Bucket, Profile};
use crate::fit::Fit;
use serde_json::Value;

/// One rank's figures of a run, medians over its timed steps (ms).
#[derive(Clone, Debug)]
pub struct RankFigures {
    pub step_ms: f64,
    pub forward_ms: f64,
    pub backward_compute_ms: f64,
    pub exposed_ms: f64,
    pub optimizer_ms: f64,
    /// (bytes, launched ms from the start of backward, all-reduce ms)
    pub buckets: Vec<(f64, f64, f64)>,
}

impl RankFigures {
    fn from_json(v: &Value) -> Option<RankFigures> {
        let f = |k: &str| v[k].as_f64();
        Some(RankFigures {
            step_ms: f("step_ms")?,
            forward_ms: f("forward_ms")?,
            backward_compute_ms: f("backward_compute_ms")?,
            exposed_ms: f("exposed_ms")?,
            optimizer_ms: f("optimizer_ms")?,
            buckets: v["buckets"]
                .as_array()?
                .iter()
                .map(|b| Some((b["bytes"].as_f64()?, b["ready_ms"].as_f64()?, b["all_reduce_ms"].as_f64()?)))
                .collect::<Option<Vec<_>>>()?,
        })
    }

    pub fn all_reduce_ms(&self) -> f64 {
        self.buckets.iter().map(|b| b.2).sum()
    }

    pub fn grad_bytes(&self) -> f64 {
        self.buckets.iter().map(|b| b.0).sum()
    }
}

/// The slowest rank (longest median step) of run `label`.
pub fn slowest(doc: &Value, label: &str) -> Option<RankFigures> {
    doc["runs"][label]
        .as_array()?
        .iter()
        .filter_map(RankFigures::from_json)
        .max_by(|a, b| a.step_ms.total_cmp(&b.step_ms))
}

/// A measured DDP run beside the model's prediction of it.
pub struct Check {
    pub label: String,
    pub ranks: usize,
    pub overlap: bool,
    /// The compute-only step the prediction starts from (alone-N, the slowest process, less
    /// its wait for its own all-reduces).
    pub compute_ms: f64,
    pub buckets: usize,
    pub measured: RankFigures,
    pub predicted: ddp::Step,
}

/// The runs of the check: (label, ranks, overlap, all-reduce predictor).
type Run<'a> = (&'static str, usize, bool, Box<dyn Fn(f64) -> f64 + 'a>);

/// Every run of `doc` that has its compute-only counterpart, predicted.
pub fn checks(doc: &Value, shm: Option<&Fit>, ns: &Cluster) -> Vec<Check> {
    let mut runs: Vec<Run> = vec![];
    if let Some(f) = shm {
        let f = f.clone();
        let g = f.clone();
        runs.push(("shm-1h2r", 2, true, Box::new(move |b| f.predict_us(b) / 1e3)));
        runs.push(("shm-1h2r-1bucket", 2, false, Box::new(move |b| g.predict_us(b) / 1e3)));
    }
    for (label, overlap) in [("mpi-2h2r", true), ("mpi-2h2r-1bucket", false)] {
        let c = ns.clone();
        runs.push((label, 4, overlap, Box::new(move |b| c.all_reduce_us(b, 2, Algo::OpenMpiDefault) / 1e3)));
    }
    let mut out = vec![];
    for (label, ranks, overlap, ar_ms) in runs {
        let (Some(measured), Some(alone)) = (slowest(doc, label), slowest(doc, &format!("alone-{ranks}")))
        else {
            continue;
        };
        // The compute-only step, all of it but the wait for the group of one's all-reduces
        // (copies on its worker thread): what is neither forward nor backward (zero_grad, the
        // loss, the optimizer) counts as the optimizer's part, after backward.
        let compute_ms = alone.step_ms - alone.exposed_ms;
        let profile = Profile {
            name: label.to_string(),
            forward_ms: alone.forward_ms,
            backward_ms: alone.backward_compute_ms,
            optimizer_ms: (compute_ms - alone.forward_ms - alone.backward_compute_ms).max(0.0),
            params: vec![],
        };
        let buckets: Vec<Bucket> = if overlap {
            alone.buckets.iter().map(|b| Bucket { bytes: b.0, ready_ms: b.1 }).collect()
        } else {
            vec![Bucket { bytes: alone.grad_bytes(), ready_ms: alone.backward_compute_ms }]
        };
        let predicted = ddp::step(&profile, &buckets, overlap, ar_ms);
        out.push(Check {
            label: label.to_string(),
            ranks,
            overlap,
            compute_ms,
            buckets: buckets.len(),
            measured,
            predicted,
        });
    }
    out
}
