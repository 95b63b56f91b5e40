//! The GPU backends on 2 GPUs, through comm-bench (which starts one process per GPU and checks
//! every element of every result). Ignored here; on a GPU machine run with `--ignored` and
//! comm-bench beside the test binary, in `../bin/` (gpu-pack's layout) or on PATH.

use std::path::PathBuf;
use std::process::Command;

fn comm_bench() -> PathBuf {
    if let Ok(p) = std::env::var("OXTRAIN_COMM_BENCH") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().expect("folder");
    for c in [dir.join("../comm-bench"), dir.join("../bin/comm-bench"), dir.join("comm-bench")] {
        if c.is_file() {
            return c;
        }
    }
    "comm-bench".into()
}

fn run(backend: &str, extra: &[&str]) {
    // Odd lengths in every dtype (4k+2 bytes, k odd), then powers of two.
    let mut args = vec![
        "--backend",
        backend,
        "--ranks",
        "2",
        "--sizes",
        "6,14,102,1030,65542,1048582,8,4096,1M",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--dtypes",
        "f32,bf16,f16",
    ];
    args.extend_from_slice(extra);
    let bench = comm_bench();
    let out = Command::new(&bench)
        .args(&args)
        .env("NCCL_NVLS_ENABLE", "0")
        .env("NVSHMEM_DISABLE_NVLS", "1")
        .env("NVSHMEM_REMOTE_TRANSPORT", "none")
        .output()
        .unwrap_or_else(|e| panic!("running {} (set OXTRAIN_COMM_BENCH): {e}", bench.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "comm-bench --backend {backend} failed:\n{text}");
    assert!(text.contains("all correct"), "comm-bench did not report a checked run:\n{text}");
}

#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn nccl_collectives_are_exact_on_two_gpus() {
    run("nccl", &[]);
}

#[test]
#[ignore = "needs 2 CUDA GPUs"]
fn nvshmem_collectives_are_exact_on_two_gpus() {
    run("nvshmem", &["--algo", "all"]);
}
