//! `oxtrain launch --nproc-per-node 2` on the CPU (shm): two DDP ranks train the built-in
//! example at toy size (SyncBatchNorm, gradient accumulation under no_sync) and end with the
//! same parameters and buffers, bit for bit.

mod common;
use std::process::Command;

#[test]
fn two_cpu_ranks_end_with_equal_weights() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .current_dir(dir.path())
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--backend",
            "shm",
            "--master-port",
            "29731",
            "--",
            "train",
        ])
        .args([
            format!("data.cache={}", dir.path().join("cache").display()),
            "data.classes=2".into(),
            "data.per_class=16".into(),
            "data.image_size=16".into(),
            "data.batch_size=4".into(),
            "data.workers=0".into(),
            "train.device=cpu".into(),
            "train.steps=4".into(),
            "train.grad_accum=2".into(),
            "log.every_steps=1".into(),
            "log.progress=lines".into(),
            "checkpoint.all_ranks=true".into(),
            // Batch-norm statistics reduced over the ranks: then buffers, too, are equal (with
            // plain BatchNorm each rank's running statistics follow its own last batch).
            "ddp.sync_batchnorm=true".into(),
            format!("log.dir={}", run.display()),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("DDP rank 0 of 2 (shm)"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("done: 4 steps")).count(),
        1,
        "rank 0 alone prints the summary: {stdout}"
    );
    let load = |name: &str| {
        oxtrain_tensor::safetensors::load_all(run.join("checkpoints").join(name).join("model.safetensors"))
            .unwrap()
    };
    let (a, b) = (load("final"), load("final-rank1"));
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        if ta.dtype().is_float() {
            let (va, vb): (Vec<f32>, Vec<f32>) = (
                ta.to_dtype(oxtrain_tensor::DType::F32).to_vec(),
                tb.to_dtype(oxtrain_tensor::DType::F32).to_vec(),
            );
            assert!(
                va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{na} differs between the ranks"
            );
        }
    }
    assert!(a.iter().any(|(n, _)| n == "fc.weight"), "the ResNet's classifier is in the file");
}
