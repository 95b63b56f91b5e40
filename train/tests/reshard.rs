//! Resume on another world size: a ZeRO-1 checkpoint of 2 ranks goes on on 3, and one of 3 on
//! 2. With the per-rank batch scaled so that the global batch stays 12, the global batches are
//! the same on both world sizes (one permutation, dealt round-robin), so the resumed run must
//! follow the run that never changed its world size: the same losses and final weights up to
//! the order of f32 sums (2 ranks and 3 sum the gradient in another order). A resume that lost
//! the optimizer's moments or the data position would leave that band at once.

#[path = "resume_support/mod.rs"]
mod support;
use std::path::Path;
use support::*;

fn shm_launch(port: u16, nproc: usize, args: Vec<String>) -> Vec<String> {
    let n = nproc.to_string();
    let head =
        ["launch", "--nproc-per-node", &n, "--backend", "shm", "--master-port", &port.to_string(), "--"];
    head.iter().map(|s| s.to_string()).chain(args).collect()
}

/// A run of `nproc` ranks whose global batch is 12, ZeRO-1, no dropout, a checkpoint at step 6.
fn args(d: &Path, name: &str, nproc: usize) -> Vec<String> {
    let batch = format!("data.batch_size={}", 12 / nproc);
    train_args(d, name, &[&batch, "ddp.shard_optimizer=true", "model.dropout=0", "checkpoint.every_steps=6"])
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// `run`'s directory as it was at its step-6 checkpoint: the checkpoint and the metrics up to it.
fn at_step_6(d: &Path, run: &str, copy: &str) {
    let (from, to) = (d.join(run), d.join(copy));
    for part in ["step-000006", "step-000006.rank-1", "step-000006.rank-2"] {
        let p = from.join("checkpoints").join(part);
        if p.exists() {
            copy_dir(&p, &to.join("checkpoints").join(part));
        }
    }
    let metrics = std::fs::read_to_string(from.join("metrics.jsonl")).unwrap();
    let upto: String = metrics
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap_or(0) <= 6)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(to.join("metrics.jsonl"), upto).unwrap();
}

fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let mut w: Vec<(String, Vec<f32>)> = oxtrain_tensor::safetensors::load_all(final_weights(run))
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(oxtrain_tensor::DType::F32).to_vec::<f32>()))
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// The resumed run follows the reference after step 6: every step logged, and the final
/// weights equal within f32 summation order. (The logged loss is rank 0's own batch, which
/// holds other samples on 2 ranks than on 3: it is not compared.)
fn assert_follows(reference: &Path, resumed: &Path) {
    let (a, b) = (losses(reference), losses(resumed));
    assert_eq!(a.len(), STEPS, "{a:?}");
    assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), b.iter().map(|x| x.0).collect::<Vec<_>>());
    assert!(b.iter().all(|(_, l)| f64::from_bits(*l).is_finite()), "{b:?}");
    let (wa, wb) = (weights(reference), weights(resumed));
    assert_eq!(wa.len(), wb.len());
    let mut worst = 0.0f32;
    for ((na, va), (nb, vb)) in wa.iter().zip(&wb) {
        assert_eq!(na, nb);
        worst = va.iter().zip(vb).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
    }
    println!("{}: largest final weight difference {worst:.2e}", resumed.display());
    // AdamW moves a weight by up to the learning rate (4e-3 here) per step: a resume that
    // lost the moments or the data position lands far outside this band.
    assert!(worst < 1e-5, "final weights differ by {worst:e}");
}

#[test]
fn a_zero_checkpoint_of_two_ranks_resumes_on_three_and_one_of_three_on_two() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("corpus.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();

    run_ok(d, &shm_launch(29841, 2, args(d, "two", 2)), &[]);
    at_step_6(d, "two", "two_then_three");
    let resume = [args(d, "two_then_three", 3), vec!["--resume".into()]].concat();
    let out = run_ok(d, &shm_launch(29842, 3, resume), &[]);
    assert!(out.contains("resuming 2 ranks' checkpoint on 3"), "{out}");
    assert_follows(&d.join("two"), &d.join("two_then_three"));

    run_ok(d, &shm_launch(29843, 3, args(d, "three", 3)), &[]);
    at_step_6(d, "three", "three_then_two");
    let resume = [args(d, "three_then_two", 2), vec!["--resume".into()]].concat();
    let out = run_ok(d, &shm_launch(29844, 2, resume), &[]);
    assert!(out.contains("resuming 3 ranks' checkpoint on 2"), "{out}");
    assert_follows(&d.join("three"), &d.join("three_then_two"));
}

#[test]
fn a_sharded_checkpoint_is_not_resumed_unsharded_and_says_how() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("corpus.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    run_ok(d, &shm_launch(29845, 2, args(d, "two", 2)), &[]);
    let plain = [args(d, "two", 2), vec!["ddp.shard_optimizer=false".into(), "--resume".into()]].concat();
    let (status, out) = start(d, &shm_launch(29846, 2, plain), &[]).finish();
    assert!(!status.success(), "{out}");
    assert!(out.contains("ddp.shard_optimizer = true") && out.contains("optimizer.safetensors"), "{out}");
}
