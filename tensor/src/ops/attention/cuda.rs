//! CUDA dispatch for fused attention: the second kernels (`attention_v2.cu`, launched from
//! `cuda_v2.rs`) by default, the first (`attention.cu`, launched here) when
//! `OXTRAIN_ATTENTION=v1` is set or where the second cannot run (before sm_80, too little shared
//! memory, a scale that is not positive).

use super::cuda_v2;
use crate::cuda::{self, expect_launch, CudaStorage, KernelSource};
use crate::storage::Storage;
use crate::{DType, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

pub(crate) const SOURCE: KernelSource = cuda::source!("attention", "src/ops/attention/attention.cu");

/// Rows of q (forward, dq) or of k (dk, dv) one block of the first kernels takes (`ATT_ROWS`),
/// and its threads.
const ROWS: usize = 64;
const THREADS: u32 = 128;

/// Element strides of a `[B, H, T, D]` view whose last dim is contiguous (`struct Bhtd`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Bhtd {
    b: i64,
    h: i64,
    t: i64,
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for Bhtd {}

/// Whether the kernels take this dtype and head dim.
pub(super) fn supported(dtype: DType, head_dim: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) && matches!(head_dim, 32 | 64 | 128)
}

/// Which kernels run attention on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// `attention.cu`: 64-row tiles loaded synchronously, fragments by scalar shared loads.
    V1,
    /// `attention_v2.cu`: ldmatrix, cp.async double buffering, masks on edge tiles only.
    V2,
}

fn v2_flag() -> &'static AtomicBool {
    static V2: OnceLock<AtomicBool> = OnceLock::new();
    V2.get_or_init(|| {
        let v1 = std::env::var("OXTRAIN_ATTENTION").is_ok_and(|v| v.eq_ignore_ascii_case("v1"));
        AtomicBool::new(!v1)
    })
}

/// Lets fused attention on CUDA run the second kernels (`attention_v2.cu`) where they can
/// (sm_80 and later). On by default; `OXTRAIN_ATTENTION=v1` in the environment turns them off
/// at start, which runs the first kernels (`attention.cu`) everywhere: for comparisons, or as a
/// fallback with no rebuild. Process-wide.
pub fn set_attention_v2(enabled: bool) {
    v2_flag().store(enabled, Ordering::Relaxed);
}

/// Whether fused attention on CUDA may run the second kernels (see [`set_attention_v2`]).
pub fn attention_v2() -> bool {
    v2_flag().load(Ordering::Relaxed)
}

#[cfg(test)]
thread_local! {
    /// Tests pick the kernels per thread, since the process-wide switch is shared by tests that
    /// run in parallel.
    static FORCED: std::cell::Cell<Option<Kernels>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with `kernels` forced on this thread (tests compare both versions in one process).
#[cfg(test)]
pub(super) fn with_kernels<R>(kernels: Kernels, f: impl FnOnce() -> R) -> R {
    let before = FORCED.with(|c| c.replace(Some(kernels)));
    let r = f();
    FORCED.with(|c| c.set(before));
    r
}

/// The kernels asked for: the test override, else the process-wide switch.
fn requested() -> Kernels {
    #[cfg(test)]
    if let Some(k) = FORCED.with(|c| c.get()) {
        return k;
    }
    if attention_v2() {
        Kernels::V2
    } else {
        Kernels::V1
    }
}

/// The kernels that run for this device, head dim and scale: the requested ones, unless the
/// second cannot run here.
fn chosen(dev: &cuda::CudaDevice, d: usize, scale: f64) -> Kernels {
    match requested() {
        Kernels::V2 if cuda_v2::runs_on(dev, d, scale) => Kernels::V2,
        _ => Kernels::V1,
    }
}

/// `t` as the kernels read it: last dim contiguous, every row starting on 16 bytes (the tile
/// loads are 16-byte vectors); copied only when it is not so already.
pub(super) fn prepared(t: &Tensor) -> Tensor {
    let (st, off) = (t.layout().strides(), t.layout().offset());
    let aligned = st[3] == 1 && st[..3].iter().all(|s| s % 8 == 0) && off % 8 == 0;
    if aligned {
        t.clone()
    } else {
        t.contiguous()
    }
}

/// The device address of `t`'s first element and its strides (`t` prepared).
pub(super) fn operand(t: &Tensor) -> (u64, Bhtd) {
    let st = t.layout().strides();
    (operand_flat(t), Bhtd { b: st[0] as i64, h: st[1] as i64, t: st[2] as i64 })
}

pub(super) fn device_of(
    t: &Tensor,
) -> (std::sync::Arc<cuda::CudaDevice>, std::sync::Arc<cudarc::driver::CudaStream>) {
    match &*t.storage() {
        Storage::Cuda(s) => (s.device().clone(), s.stream()),
        Storage::Cpu(_) => unreachable!("checked to be on one CUDA device"),
    }
}

fn grid(rows: usize, bh: usize, op: &str) -> LaunchConfig {
    assert!(bh <= 65535, "{op}: batch * heads = {bh} is more than the 65535 one launch takes");
    LaunchConfig {
        grid_dim: (rows.div_ceil(ROWS) as u32, bh as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn key_lens_ptr(lens: Option<&Tensor>) -> u64 {
    lens.map_or(0, operand_flat)
}

pub(super) fn operand_flat(t: &Tensor) -> u64 {
    match &*t.storage() {
        Storage::Cuda(s) => s.ptr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("checked to be on one CUDA device"),
    }
}

/// `(B, H, L, S, D)`: batch, heads, queries, keys, head dim.
pub(super) type Dims = (usize, usize, usize, usize, usize);

/// `(out as [B, L, H, D], lse as [B, H, L] f32)`.
pub(super) fn forward(
    qkv: (&Tensor, &Tensor, &Tensor),
    lens: Option<&Tensor>,
    dims: Dims,
    scale: f64,
    causal: bool,
    op: &str,
) -> (CudaStorage, CudaStorage) {
    match chosen(&device_of(qkv.0).0, dims.4, scale) {
        Kernels::V2 => cuda_v2::forward(qkv, lens, dims, scale, causal, op),
        Kernels::V1 => forward_v1(qkv, lens, dims, scale, causal, op),
    }
}

fn forward_v1(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    lens: Option<&Tensor>,
    (b, h, l, s, d): Dims,
    scale: f64,
    causal: bool,
    op: &str,
) -> (CudaStorage, CudaStorage) {
    let (dev, stream) = device_of(q);
    let out = expect_launch(CudaStorage::alloc(&dev, q.dtype(), b * l * h * d), op);
    let lse = expect_launch(CudaStorage::alloc(&dev, DType::F32, b * h * l), op);
    if b * h * l == 0 {
        return (out, lse);
    }
    let f = expect_launch(
        dev.function(&SOURCE, &format!("attention_forward_{}_d{d}", cuda::suffix(q.dtype()))),
        op,
    );
    let ((pq, sq), (pk, sk), (pv, sv)) = (operand(q), operand(k), operand(v));
    let (po, pl, pn) = (out.ptr(), lse.ptr(), key_lens_ptr(lens));
    let (h32, l32, s32, scale32, causal32) = (h as i32, l as i32, s as i32, scale as f32, causal as i32);
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq).arg(&sq).arg(&pk).arg(&sk).arg(&pv).arg(&sv).arg(&po).arg(&pl);
    bld.arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: q, k, v are [B, H, T, D] views inside their storages with the strides passed
    // (prepared: last dim contiguous, 16-byte rows); out holds B*L*H*D, lse B*H*L; key_lens,
    // when set, B i64 values.
    expect_launch(unsafe { bld.launch(grid(l, b * h, op)) }, op);
    (out, lse)
}

/// `(dq as [B, L, H, D], dk and dv as [B, S, H, D])`.
pub(super) fn backward(
    qkv: (&Tensor, &Tensor, &Tensor),
    saved: (&Tensor, &Tensor, &Tensor),
    lens: Option<&Tensor>,
    dims @ (b, h, l, s, d): Dims,
    scale: f64,
    causal: bool,
    op: &str,
) -> (CudaStorage, CudaStorage, CudaStorage) {
    let dev = device_of(qkv.0).0;
    if b * h * l == 0 || s == 0 {
        // Nothing attends: every gradient is zero.
        let zeros = |n| expect_launch(CudaStorage::zeros(&dev, qkv.0.dtype(), n), op);
        return (zeros(b * l * h * d), zeros(b * s * h * d), zeros(b * s * h * d));
    }
    match chosen(&dev, d, scale) {
        Kernels::V2 => cuda_v2::backward(qkv, saved, lens, dims, scale, causal, op),
        Kernels::V1 => backward_v1(qkv, saved, lens, dims, scale, causal, op),
    }
}

fn backward_v1(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (dout, out, lse): (&Tensor, &Tensor, &Tensor),
    lens: Option<&Tensor>,
    (b, h, l, s, d): Dims,
    scale: f64,
    causal: bool,
    op: &str,
) -> (CudaStorage, CudaStorage, CudaStorage) {
    let (dev, stream) = device_of(q);
    let dtype = q.dtype();
    let alloc = |dtype, n| expect_launch(CudaStorage::alloc(&dev, dtype, n), op);
    let (dq, dk, dv) =
        (alloc(dtype, b * l * h * d), alloc(dtype, b * s * h * d), alloc(dtype, b * s * h * d));
    let sfx = cuda::suffix(dtype);
    let function =
        |name: &str| expect_launch(dev.function(&SOURCE, &format!("attention_{name}_{sfx}_d{d}")), op);
    let ((pq, sq), (pk, sk), (pv, sv)) = (operand(q), operand(k), operand(v));
    let ((pd, sd), (po, so)) = (operand(dout), operand(out));
    let (pl, pn) = (operand_flat(lse), key_lens_ptr(lens));
    let (h32, l32, s32, scale32, causal32) = (h as i32, l as i32, s as i32, scale as f32, causal as i32);
    // delta = rowsum(dout * out), one warp per query row.
    let delta = alloc(DType::F32, b * h * l);
    let (pdelta, rows) = (delta.ptr(), (b * h * l) as i64);
    let f = function("delta");
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pd).arg(&sd).arg(&po).arg(&so).arg(&pdelta).arg(&h32).arg(&l32).arg(&rows);
    let cfg = LaunchConfig {
        grid_dim: ((b * h * l).div_ceil(8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: dout and out are [B, H, L, D] views with the strides passed; delta holds B*H*L.
    expect_launch(unsafe { bld.launch(cfg) }, op);
    let f = function("dq");
    let pdq = dq.ptr();
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq)
        .arg(&sq)
        .arg(&pk)
        .arg(&sk)
        .arg(&pv)
        .arg(&sv)
        .arg(&pd)
        .arg(&sd)
        .arg(&pl)
        .arg(&pdelta)
        .arg(&pdq);
    bld.arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: as in `forward`; lse and delta hold B*H*L f32, dq B*L*H*D.
    expect_launch(unsafe { bld.launch(grid(l, b * h, op)) }, op);
    let f = function("dkv");
    let (pdk, pdv) = (dk.ptr(), dv.ptr());
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq).arg(&sq).arg(&pk).arg(&sk).arg(&pv).arg(&sv).arg(&pd).arg(&sd).arg(&pl).arg(&pdelta);
    bld.arg(&pdk).arg(&pdv).arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: as above; dk and dv hold B*S*H*D each.
    expect_launch(unsafe { bld.launch(grid(s, b * h, op)) }, op);
    (dq, dk, dv)
}
