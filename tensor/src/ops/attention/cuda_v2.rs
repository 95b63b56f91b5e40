//! Launches of the second attention kernels (`attention_v2.cu`, `attention_v2_backward.cu`):
//! one forward kernel; a dq kernel that also writes the row term delta, then a dk/dv kernel
//! that reads it. Block shapes and shared-memory sizes here match the kernels' layouts.

use super::cuda::{device_of, key_lens_ptr, operand, operand_flat, Dims};
use crate::cuda::{self, expect_launch, CudaDevice, CudaStorage, KernelSource};
use crate::{DType, Tensor};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use std::collections::HashSet;
use std::sync::Mutex;

pub(crate) const SOURCE: KernelSource = cuda::source!(
    "attention_v2",
    "src/ops/attention/attention_v2.cu",
    "src/ops/attention/attention_v2_backward.cu"
);

/// Threads of every block (`FA_THREADS`: 4 warps) and rows of the tiles walked (`FA_TILE`).
const THREADS: u32 = 128;
const TILE_ROWS: usize = 64;

/// Queries a forward block takes: 32 per warp where the registers hold them (D <= 64), else 16.
fn forward_rows(d: usize) -> usize {
    if d <= 64 {
        128
    } else {
        64
    }
}

/// Bytes of one shared tile: 64 rows of `d` 16-bit values padded by 16 bytes.
fn tile_bytes(d: usize) -> usize {
    TILE_ROWS * (d + 8) * 2
}

/// Dynamic shared memory of each kernel. Forward: the query block and two buffers each of K
/// and V. dq: Q, dO, two buffers each of K and V, 64 f32 deltas. dk/dv: K, V, two buffers
/// each of Q and dO, two buffers of 64 lse and 64 delta values.
fn forward_smem(d: usize) -> usize {
    (forward_rows(d) / TILE_ROWS + 4) * tile_bytes(d)
}
fn dq_smem(d: usize) -> usize {
    6 * tile_bytes(d) + TILE_ROWS * 4
}
fn dkv_smem(d: usize) -> usize {
    6 * tile_bytes(d) + 2 * 2 * TILE_ROWS * 4
}

/// Whether these kernels run for this device, head dim and scale: sm_80 or later (cp.async,
/// bf16 mma), enough shared memory per block for the largest of the three, and a positive,
/// finite scale in f32 (the kernels take maxima of raw scores and fold the scale into exp2).
pub(super) fn runs_on(dev: &CudaDevice, d: usize, scale: f64) -> bool {
    let c = scale as f32 * std::f32::consts::LOG2_E;
    let smem_optin = dev
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .unwrap_or(0);
    let needed = forward_smem(d).max(dq_smem(d)).max(dkv_smem(d));
    dev.arch() >= 80 && c > 0.0 && c.is_finite() && needed <= smem_optin.max(0) as usize
}

/// The kernel `name`, allowed `smem` bytes of dynamic shared memory (above the default 48 KiB
/// a kernel must opt in, once per device and kernel).
fn function(dev: &CudaDevice, name: &str, smem: usize, op: &str) -> CudaFunction {
    static OPTED_IN: Mutex<Option<HashSet<(usize, String)>>> = Mutex::new(None);
    let f = expect_launch(dev.function(&SOURCE, name), op);
    let mut opted = OPTED_IN.lock().unwrap_or_else(|e| e.into_inner());
    if opted.get_or_insert_with(HashSet::new).insert((dev.ordinal(), name.to_string())) {
        let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        expect_launch(f.set_attribute(attr, smem as i32), op);
    }
    f
}

fn config(rows: usize, block_rows: usize, bh: usize, smem: usize, op: &str) -> LaunchConfig {
    assert!(bh <= 65535, "{op}: batch * heads = {bh} is more than the 65535 one launch takes");
    LaunchConfig {
        grid_dim: (rows.div_ceil(block_rows) as u32, bh as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

/// `(out as [B, L, H, D], lse as [B, H, L] f32)`.
pub(super) fn forward(
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
    let smem = forward_smem(d);
    let name = format!("attention_v2_forward_{}_d{d}", cuda::suffix(q.dtype()));
    let f = function(&dev, &name, smem, op);
    let ((pq, sq), (pk, sk), (pv, sv)) = (operand(q), operand(k), operand(v));
    let (po, pl, pn) = (out.ptr(), lse.ptr(), key_lens_ptr(lens));
    let (h32, l32, s32, scale32, causal32) = (h as i32, l as i32, s as i32, scale as f32, causal as i32);
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq).arg(&sq).arg(&pk).arg(&sk).arg(&pv).arg(&sv).arg(&po).arg(&pl);
    bld.arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: q, k, v are [B, H, T, D] views inside their storages with the strides passed
    // (prepared: last dim contiguous, 16-byte rows, as cp.async needs); out holds B*L*H*D,
    // lse B*H*L; key_lens, when set, B i64 values; the shared memory is the kernel's layout.
    expect_launch(unsafe { bld.launch(config(l, forward_rows(d), b * h, smem, op)) }, op);
    (out, lse)
}

/// `(dq as [B, L, H, D], dk and dv as [B, S, H, D])`, for L and S above zero.
pub(super) fn backward(
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
    let delta = alloc(DType::F32, b * h * l);
    let sfx = cuda::suffix(dtype);
    let ((pq, sq), (pk, sk), (pv, sv)) = (operand(q), operand(k), operand(v));
    let ((pd, sd), (po, so)) = (operand(dout), operand(out));
    let (pl, pn, pdelta) = (operand_flat(lse), key_lens_ptr(lens), delta.ptr());
    let (h32, l32, s32, scale32, causal32) = (h as i32, l as i32, s as i32, scale as f32, causal as i32);

    let smem = dq_smem(d);
    let f = function(&dev, &format!("attention_v2_dq_{sfx}_d{d}"), smem, op);
    let pdq = dq.ptr();
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq).arg(&sq).arg(&pk).arg(&sk).arg(&pv).arg(&sv).arg(&pd).arg(&sd).arg(&po).arg(&so);
    bld.arg(&pl).arg(&pdelta).arg(&pdq);
    bld.arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: as in `forward`; dout and out are [B, H, L, D] views with the strides passed,
    // lse holds B*H*L f32 and delta room for as many, dq B*L*H*D.
    expect_launch(unsafe { bld.launch(config(l, TILE_ROWS, b * h, smem, op)) }, op);

    // Same stream, so this reads the deltas the dq kernel wrote.
    let smem = dkv_smem(d);
    let f = function(&dev, &format!("attention_v2_dkv_{sfx}_d{d}"), smem, op);
    let (pdk, pdv) = (dk.ptr(), dv.ptr());
    let mut bld = stream.launch_builder(&f);
    bld.arg(&pq).arg(&sq).arg(&pk).arg(&sk).arg(&pv).arg(&sv).arg(&pd).arg(&sd).arg(&pl).arg(&pdelta);
    bld.arg(&pdk).arg(&pdv).arg(&h32).arg(&l32).arg(&s32).arg(&pn).arg(&scale32).arg(&causal32);
    // SAFETY: as above; dk and dv hold B*S*H*D each.
    expect_launch(unsafe { bld.launch(config(s, TILE_ROWS, b * h, smem, op)) }, op);
    (dq, dk, dv)
}
