//! CUDA dispatch for softmax and log_softmax (kernels in `softmax.cu`).

use super::SoftmaxOp;
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource};
use crate::DType;
use cudarc::driver::{LaunchConfig, PushKernelArg};

pub(crate) const SOURCE: KernelSource = cuda::source!("softmax", "src/ops/softmax/softmax.cu");

/// Rows up to this long take a warp each, longer ones a block (`softmax_w*` / `softmax_b*`).
const WARP_ROW_MAX: usize = 32 * 32;
/// Rows up to this long are held in registers by one block of 1024 threads.
const BLOCK_ROW_MAX: usize = 1024 * 16;
/// Threads per block of the warp-per-row kernels (their `__launch_bounds__`).
const WARP_BLOCK: u32 = 128;

/// Elements per vector access in `softmax.cu` (16 bytes, 8 for 16-bit types).
fn vec_len(dtype: DType) -> usize {
    if dtype == DType::F64 {
        2
    } else {
        4
    }
}

/// Softmax over the middle dim of the contiguous block `[outer, n, inner]` starting at element
/// `offset` of `s`; the result is a new contiguous storage of the block.
pub(super) fn softmax(
    s: &CudaStorage,
    offset: usize,
    outer: usize,
    n: usize,
    inner: usize,
    op: SoftmaxOp,
) -> CudaStorage {
    let name = op.name();
    let dtype = s.dtype();
    let total = outer * n * inner;
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, total), name);
    if total == 0 {
        return out;
    }
    let sfx = cuda::suffix(dtype);
    let log = (op == SoftmaxOp::LogSoftmax) as i32;
    let src = s.ptr() + (offset * dtype.size_in_bytes()) as u64;
    let dst = out.ptr();
    let stream = out.stream();
    let (outer64, n64, inner64) = (outer as i64, n as i64, inner as i64);
    if inner > 1 {
        let f = expect_launch(dev.function(&SOURCE, &format!("softmax_cols_{sfx}")), name);
        let mut b = stream.launch_builder(&f);
        b.arg(&src).arg(&dst).arg(&outer64).arg(&n64).arg(&inner64).arg(&log);
        // SAFETY: argument types match the kernel; both buffers hold the block.
        expect_launch(unsafe { b.launch(launch_cfg(outer * inner)) }, name);
        return out;
    }
    let rows = outer;
    let vec = vec_len(dtype);
    // Vector access needs every row to start on a vector boundary (the allocator aligns blocks
    // to far more than 16 bytes).
    let aligned = n.is_multiple_of(vec) && src.is_multiple_of((vec * dtype.size_in_bytes()) as u64);
    let (kernel, cfg) = if n <= WARP_ROW_MAX {
        let vpt = n.div_ceil(32).next_power_of_two();
        let access = if aligned && vpt >= 4 { "v" } else { "s" };
        let rows_per_block = (WARP_BLOCK / 32) as usize;
        let blocks = rows.div_ceil(rows_per_block);
        let cfg = LaunchConfig {
            grid_dim: (grid(blocks, name), 1, 1),
            block_dim: (WARP_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        (format!("softmax_w{vpt}_{access}_{sfx}"), cfg)
    } else if n <= BLOCK_ROW_MAX {
        let threads = n.div_ceil(8).next_power_of_two().clamp(128, 1024);
        let vpt = n.div_ceil(threads).next_power_of_two().max(8);
        let access = if aligned { "v" } else { "s" };
        let cfg = LaunchConfig {
            grid_dim: (grid(rows, name), 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        (format!("softmax_b{vpt}_{access}_{sfx}"), cfg)
    } else {
        let cfg = LaunchConfig {
            grid_dim: (rows.min(1 << 16) as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        (format!("softmax_long_{sfx}"), cfg)
    };
    let f = expect_launch(dev.function(&SOURCE, &kernel), name);
    let mut b = stream.launch_builder(&f);
    b.arg(&src).arg(&dst).arg(&outer64).arg(&n64).arg(&log);
    // SAFETY: as above; the grid covers `rows` rows of `n`, and vector kernels get aligned rows.
    expect_launch(unsafe { b.launch(cfg) }, name);
    out
}

/// A grid size for one block per unit of work, within CUDA's limit on `gridDim.x`.
fn grid(blocks: usize, op: &str) -> u32 {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .unwrap_or_else(|| panic!("{op}: too many rows for one launch ({blocks} blocks)"))
}

/// The gradient of softmax or log_softmax over contiguous rows of `n` (`g` and `y` from the
/// given element offsets), one warp per row: a new contiguous storage.
pub(super) fn softmax_backward(
    (g, offset_g): (&CudaStorage, usize),
    (y, offset_y): (&CudaStorage, usize),
    rows: usize,
    n: usize,
    op: SoftmaxOp,
) -> CudaStorage {
    let name = "softmax_backward";
    let dtype = y.dtype();
    let dev = y.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, rows * n), name);
    if rows * n == 0 {
        return out;
    }
    let size = dtype.size_in_bytes() as u64;
    let (pg, py, po) = (g.ptr() + offset_g as u64 * size, y.ptr() + offset_y as u64 * size, out.ptr());
    let (rows64, n64, log) = (rows as i64, n as i64, (op == SoftmaxOp::LogSoftmax) as i32);
    let f = expect_launch(dev.function(&SOURCE, &format!("softmax_backward_{}", cuda::suffix(dtype))), name);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&pg).arg(&py).arg(&po).arg(&rows64).arg(&n64).arg(&log);
    // Eight rows (warps) a block; a grid-stride loop past 65535 blocks.
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(8).min(65535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: types match the kernel; g and y hold rows * n elements from their offsets, `out`
    // rows * n.
    expect_launch(unsafe { b.launch(cfg) }, name);
    out
}

/// Threads per row of the cross-entropy kernels: about 8 elements each, 32 to 512.
fn cross_entropy_threads(classes: usize) -> u32 {
    classes.div_ceil(8).next_power_of_two().clamp(32, 512) as u32
}

/// The fused cross-entropy forward over `[rows, classes]` logits (from element `ox` of `x`,
/// rows `ld` apart) and int64 targets (from element `ot` of `t`): `(loss, lse)`, `[rows]`
/// each in `compute`.
pub(super) fn cross_entropy_forward(
    (x, ox): (&CudaStorage, usize),
    (t, ot): (&CudaStorage, usize),
    (rows, classes, ld): (usize, usize, usize),
    ignore_index: i64,
    smoothing: f64,
    compute: DType,
) -> (CudaStorage, CudaStorage) {
    let name = "cross_entropy";
    let dev = x.device();
    let loss = expect_launch(CudaStorage::alloc(dev, compute, rows), name);
    let lse = expect_launch(CudaStorage::alloc(dev, compute, rows), name);
    if rows == 0 {
        return (loss, lse);
    }
    let px = x.ptr() + (ox * x.dtype().size_in_bytes()) as u64;
    let pt = t.ptr() + (ot * 8) as u64;
    let (pl, pe) = (loss.ptr(), lse.ptr());
    let (rows64, n64, ld64) = (rows as i64, classes as i64, ld as i64);
    let f =
        expect_launch(dev.function(&SOURCE, &format!("cross_entropy_fwd_{}", cuda::suffix(x.dtype()))), name);
    let stream = loss.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&px).arg(&pt).arg(&pl).arg(&pe).arg(&rows64).arg(&n64).arg(&ld64).arg(&ignore_index);
    let (keep, spread) = (1.0 - smoothing, smoothing / classes as f64);
    let (keep32, spread32) = (keep as f32, spread as f32);
    if compute == DType::F64 {
        b.arg(&keep).arg(&spread);
    } else {
        b.arg(&keep32).arg(&spread32);
    }
    let cfg = LaunchConfig {
        grid_dim: (grid(rows.min(1 << 20), name), 1, 1),
        block_dim: (cross_entropy_threads(classes), 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds rows * classes elements from px, t rows int64 from pt; loss and lse are
    // fresh [rows] buffers of the compute type the kernel's suffix implies.
    expect_launch(unsafe { b.launch(cfg) }, name);
    (loss, lse)
}

/// The fused cross-entropy backward: `(softmax(x) - q) * w` per row (x's rows `ld` apart), a
/// new storage in x's dtype of `rows` rows `out_ld` apart (`rows * out_ld` elements, those past
/// `classes` in each row left unwritten).
pub(super) fn cross_entropy_backward(
    (x, ox, ld): (&CudaStorage, usize, usize),
    (t, ot): (&CudaStorage, usize),
    (lse, ol): (&CudaStorage, usize),
    (w, ow): (&CudaStorage, usize),
    (rows, classes, out_ld): (usize, usize, usize),
    ignore_index: i64,
    smoothing: f64,
) -> CudaStorage {
    let name = "cross_entropy_backward";
    let dev = x.device();
    let dtype = x.dtype();
    let len = rows * out_ld;
    let out = expect_launch(CudaStorage::alloc(dev, dtype, len), name);
    if rows * classes == 0 {
        return out;
    }
    let csize = lse.dtype().size_in_bytes();
    let px = x.ptr() + (ox * dtype.size_in_bytes()) as u64;
    let pt = t.ptr() + (ot * 8) as u64;
    let (pl, pw, po) = (lse.ptr() + (ol * csize) as u64, w.ptr() + (ow * csize) as u64, out.ptr());
    // Vector access needs every row of x at the 16-byte phase of the same row of the output:
    // equal phases at row 0, and row strides that keep them equal.
    let size = dtype.size_in_bytes() as u64;
    let same_phase = px % 16 == po % 16 && (ld as u64 * size) % 16 == (out_ld as u64 * size) % 16;
    let vec = same_phase as i32;
    let (rows64, n64, ld64, out_ld64) = (rows as i64, classes as i64, ld as i64, out_ld as i64);
    let f = expect_launch(dev.function(&SOURCE, &format!("cross_entropy_bwd_{}", cuda::suffix(dtype))), name);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&px).arg(&pt).arg(&pl).arg(&pw).arg(&po).arg(&rows64).arg(&n64).arg(&ld64).arg(&out_ld64);
    b.arg(&ignore_index);
    let (keep, spread) = (1.0 - smoothing, smoothing / classes as f64);
    let (keep32, spread32) = (keep as f32, spread as f32);
    if lse.dtype() == DType::F64 {
        b.arg(&keep).arg(&spread);
    } else {
        b.arg(&keep32).arg(&spread32);
    }
    b.arg(&vec);
    let cfg = LaunchConfig {
        grid_dim: (grid(rows.min(1 << 20), name), 1, 1),
        block_dim: (cross_entropy_threads(classes), 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds rows * classes elements from px, t/lse/w rows each; `out` is fresh.
    expect_launch(unsafe { b.launch(cfg) }, name);
    out
}
