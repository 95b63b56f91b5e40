//! GPU benchmark of oxtrain's kernels against PyTorch on the same GPU, in the same run.
//!
//! `cargo run --release -p oxtrain-bench --bin cuda_ops` writes `bench/results/cuda-ops-h200.json`.
//! The peer is `bench/peers/cuda_ops.py` under `OXTRAIN_PEER_PYTHON` (default `python3`, with
//! torch). Times come from CUDA events around `ITERS` calls, median of `TRIALS` trials after
//! warm-up. Figures that cannot be measured yet (an op without its CUDA kernel) are left out
//! and named in the notes.

use oxtrain_bench::{git_commit, time_gpu, today, Benchmark, Report, GPU_TRIALS as TRIALS};
use oxtrain_tensor::cuda::{self, Stream};
use oxtrain_tensor::{DType, Device, Tensor};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;

const GPU: Device = Device::Cuda(0);

fn rand(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::rand(shape, DType::F32, GPU).expect("a GPU tensor").to_dtype(dtype)
}

/// Runs one oxtrain measurement; an op that panics (no CUDA kernel yet) gives `None`.
fn measure(name: &str, missing: &mut Vec<String>, f: impl FnOnce() -> f64) -> Option<f64> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            missing.push(format!("{name}: {}", msg.lines().next().unwrap_or("")));
            None
        }
    }
}

/// The convolutions of ResNet-50's stages (3x3 and 1x1, stride 1), batch 128, channels-last.
pub const RESNET_CONVS: [(usize, usize, usize, usize); 6] = [
    (64, 64, 56, 3),
    (256, 64, 56, 1),
    (128, 128, 28, 3),
    (256, 256, 14, 3),
    (1024, 256, 14, 1),
    (512, 512, 7, 3),
];
const CONV_BATCH: usize = 128;

fn conv_flops() -> f64 {
    RESNET_CONVS
        .iter()
        .map(|&(cin, cout, hw, k)| 2.0 * (CONV_BATCH * cout * hw * hw * cin * k * k) as f64)
        .sum()
}

fn main() {
    assert!(cuda::is_available(0), "cuda_ops needs a CUDA GPU");
    let dev = cuda::device(0).unwrap();
    let mut missing = Vec::new();
    let mb256 = 64 << 20; // f32 elements in 256 MB

    // Device copy bandwidth, the yardstick for the memory-bound ops (bytes read plus written).
    let big = rand(&[256 << 20], DType::F32); // 1 GiB
    let dst = Tensor::zeros([256 << 20], DType::F32, GPU).unwrap();
    let bytes = (1usize << 30) as f64;
    let memcpy_s = time_gpu(10, &mut || {
        let (s, d) = (big.storage(), dst.storage());
        let (oxtrain_tensor::Storage::Cuda(s), oxtrain_tensor::Storage::Cuda(d)) = (&*s, &*d) else {
            unreachable!()
        };
        let stream = Stream::current(0).unwrap();
        // SAFETY: both buffers hold 1 GiB and outlive the queued copy (synchronised by the timer).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(d.ptr(), s.ptr(), 1 << 30, stream.raw().cu_stream())
        }
        .unwrap();
    });
    let memcpy_gbs = 2.0 * bytes / memcpy_s / 1e9;
    let copy = measure("copy_bandwidth", &mut missing, || {
        let v = big.narrow(0, 0, 256 << 20);
        2.0 * bytes / time_gpu(10, &mut || drop(v.copy())) / 1e9
    });

    let add = measure("add_f32_256MB", &mut missing, || {
        let (a, b) = (rand(&[mb256], DType::F32), rand(&[mb256], DType::F32));
        3.0 * (256 << 20) as f64 / time_gpu(20, &mut || drop(&a + &b)) / 1e9
    });
    let softmax = measure("softmax_f32_256MB", &mut missing, || {
        let x = rand(&[mb256 / 1024, 1024], DType::F32);
        2.0 * (256 << 20) as f64 / time_gpu(20, &mut || drop(x.softmax(-1))) / 1e9
    });
    // The matmul is measured before the peer runs and again after it, and the two averaged:
    // an H200 at full bf16 load drifts by up to 10% with clocks and power between the two
    // processes' measurements, and a sandwich cancels most of that.
    let (ma, mb) = (rand(&[8192, 8192], DType::BF16), rand(&[8192, 8192], DType::BF16));
    let matmul_tflops = || 2.0 * 8192f64.powi(3) / time_gpu(10, &mut || drop(ma.matmul(&mb))) / 1e12;
    let matmul_before = measure("matmul_bf16_8192", &mut missing, matmul_tflops);
    let conv = measure("conv2d_bf16_nhwc_resnet50", &mut missing, || {
        let layers: Vec<(Tensor, Tensor, usize)> = RESNET_CONVS
            .iter()
            .map(|&(cin, cout, hw, k)| {
                let x = rand(&[CONV_BATCH, hw, hw, cin], DType::BF16).permute([0, 3, 1, 2]);
                let w = rand(&[cout, k, k, cin], DType::BF16).permute([0, 3, 1, 2]);
                (x, w, k / 2)
            })
            .collect();
        conv_flops()
            / time_gpu(5, &mut || {
                for (x, w, p) in &layers {
                    drop(x.conv2d(w, None, [1, 1], [*p, *p], [1, 1], 1));
                }
            })
            / 1e12
    });
    drop((big, dst));

    let peers = run_peers();
    let matmul_after = measure("matmul_bf16_8192", &mut missing, matmul_tflops);
    let matmul = matmul_before.zip(matmul_after).map(|(x, y)| (x + y) / 2.0);
    drop((ma, mb));
    let peer = |k: &str| peers.as_ref().ok().and_then(|p| p[k].as_f64());
    let torch = peers.as_ref().ok().and_then(|p| p["torch"].as_str()).unwrap_or("torch").to_string();
    let mut benchmarks = vec![Benchmark::higher_is_better(
        "copy_bandwidth",
        "GB/s",
        copy.unwrap_or(f64::NAN),
        Some(memcpy_gbs),
        "cuMemcpyDtoDAsync (bytes read + written)",
        None,
    )];
    let mut push = |name: &str, unit: &str, v: Option<f64>, key: &str, what: &str, goal: f64| {
        if let Some(v) = v {
            benchmarks.push(Benchmark::higher_is_better(
                name,
                unit,
                v,
                peer(key),
                &format!("{torch} {what}"),
                Some(goal),
            ));
        }
    };
    push("matmul_bf16_8192", "TFLOP/s", matmul, "matmul_bf16_8192", "torch.matmul", 0.95);
    push("add_f32_256MB", "GB/s", add, "add_f32_256MB", "torch.add", 0.9);
    push("softmax_f32_256MB", "GB/s", softmax, "softmax_f32_256MB", "torch.softmax(dim=-1)", 0.9);
    push(
        "conv2d_bf16_nhwc_resnet50",
        "TFLOP/s",
        conv,
        "conv2d_bf16_nhwc_resnet50",
        "F.conv2d channels_last",
        0.95,
    );
    for (name, v) in [("add_f32_256MB_vs_copy", add), ("softmax_f32_256MB_vs_copy", softmax)] {
        if let Some(v) = v {
            benchmarks.push(Benchmark::higher_is_better(
                name,
                "GB/s",
                v,
                Some(memcpy_gbs),
                "device copy bandwidth",
                Some(0.8),
            ));
        }
    }
    benchmarks.retain(|b| b.oxtrain.is_finite());
    let mut notes = format!(
        "{} (sm_{}); times from CUDA events, median of {TRIALS} trials after warm-up; GB/s count bytes read \
         plus written; conv is the sum over ResNet-50's stride-1 convs {:?} (cin, cout, hw, k) at batch \
         {CONV_BATCH}, bf16, channels-last. Peer: {torch}.",
        dev.name(),
        dev.arch(),
        RESNET_CONVS
    );
    if let (Some(x), Some(y)) = (matmul_before, matmul_after) {
        notes += &format!(
            " matmul_bf16_8192: oxtrain measured before ({x:.1}) and after ({y:.1} TFLOP/s) the peer process, \
             averaged."
        );
    }
    if let Err(e) = &peers {
        notes += &format!(" Peer not measured: {e}.");
    }
    if !missing.is_empty() {
        notes += &format!(" Not measured (no CUDA kernel yet): {}.", missing.join("; "));
    }
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: "nvidia-h200 (1x H200)".into(),
        notes,
        benchmarks,
    };
    let out = std::env::var("OXTRAIN_RESULTS").unwrap_or_else(|_| "bench/results/cuda-ops-h200.json".into());
    report.write(&out).expect("write the results file");
    println!("{}", std::fs::read_to_string(&out).unwrap());
}

fn run_peers() -> Result<Value, String> {
    let python = std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = if std::path::Path::new("bench/peers/cuda_ops.py").exists() {
        "bench/peers/cuda_ops.py".to_string()
    } else {
        format!("{}/peers/cuda_ops.py", env!("CARGO_MANIFEST_DIR"))
    };
    let out =
        Command::new(&python).arg(&script).output().map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("peer output is not JSON: {e}"))
}
