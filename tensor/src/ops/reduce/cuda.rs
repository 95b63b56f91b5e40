//! CUDA dispatch for reductions and topk (kernels in `reduce.cu`).
//!
//! The layout is split as in the CPU [`super::cpu::Plan`]: the kept dims locate each output's
//! base offset, the reduced dims (in row-major order) the elements it folds. Then:
//! - many outputs whose kept innermost dim is the contiguous one (sum over dim 0 of `[N, C]`),
//!   or very short reductions: one thread per output, folding in order; neighbouring threads
//!   read neighbouring addresses.
//! - otherwise one block per output, and when there are too few outputs to fill the GPU, the
//!   reduced range is split over several blocks whose partial states a second kernel merges.

use super::ReduceOp;
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::{DType, Layout};
use cudarc::driver::{LaunchConfig, PushKernelArg};

pub(crate) const SOURCE: KernelSource = cuda::source!("reduce", "src/ops/reduce/reduce.cu");

/// `RED_THREADS` in `reduce.cu`.
const BLOCK: u32 = 256;
/// `COLS_WARPS * 32` in `reduce.cu`.
const COLS_THREADS: u32 = 256;
/// Blocks that keep every SM of a large GPU busy (a few per SM).
const TARGET_BLOCKS: usize = 132 * 8;
/// The fewest reduced elements one block of a split reduction folds.
const MIN_CHUNK: usize = 4096;
/// Reductions this short run one thread per output.
const SHORT: usize = 16;
/// Bytes per partial state in the workspace (the largest state, `Moments`, is 24).
const STATE_BYTES: usize = 32;

/// The kernel family in `reduce.cu` and its `flag` argument.
fn kernel(op: ReduceOp) -> (&'static str, i32, i64) {
    match op {
        ReduceOp::Sum => ("sum", 0, 0),
        ReduceOp::Mean => ("mean", 0, 0),
        ReduceOp::Max => ("ext", 1, 0),
        ReduceOp::Min => ("ext", 0, 0),
        ReduceOp::ArgMax => ("arg", 1, 0),
        ReduceOp::ArgMin => ("arg", 0, 0),
        ReduceOp::Var { correction } => ("var", 0, correction as i64),
        ReduceOp::Std { correction } => ("var", 1, correction as i64),
    }
}

/// Reduces `dims` of the strided input; the result holds the kept dims in row-major order.
pub(super) fn reduce(s: &CudaStorage, layout: &Layout, dims: &[usize], op: ReduceOp) -> CudaStorage {
    let name = op.name();
    let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
    for (i, (&d, &st)) in layout.dims().iter().zip(layout.strides()).enumerate() {
        if dims.contains(&i) {
            rd.push(d);
            rs.push(st);
        } else {
            kd.push(d);
            ks.push(st);
        }
    }
    let n_out: usize = kd.iter().product();
    let n_red: usize = rd.iter().product();
    if let Some(out) = reduce_columns(s, layout, (&kd, &ks), (&rd, &rs), op) {
        return out;
    }
    let outs = StridedArg::new(&Layout::new(kd, ks, layout.offset()));
    let red = StridedArg::new(&Layout::new(rd, rs, 0));
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, op.out_dtype(s.dtype()), n_out), name);
    if n_out == 0 {
        return out;
    }
    let innermost_stride = |a: &StridedArg| if a.rank == 0 { 0 } else { a.strides[a.rank as usize - 1] };
    let columns = innermost_stride(&outs) == 1 && innermost_stride(&red) != 1;
    let (family, flag, correction) = kernel(op);
    let sfx = cuda::suffix(s.dtype());
    let func =
        |kind: &str| expect_launch(dev.function(&SOURCE, &format!("reduce_{family}_{kind}_{sfx}")), name);
    let stream = out.stream();
    let (src, dst) = (s.ptr(), out.ptr());
    let (n_out64, n_red64) = (n_out as i64, n_red as i64);

    if n_red <= SHORT || (columns && n_out >= TARGET_BLOCKS * 4) {
        let f = func("threads");
        let (splits, chunk, partial) = (1i64, n_red64, 0u64);
        let mut b = stream.launch_builder(&f);
        b.arg(&outs).arg(&red).arg(&src).arg(&n_out64).arg(&n_red64).arg(&splits).arg(&chunk);
        b.arg(&partial).arg(&dst).arg(&flag).arg(&correction);
        // SAFETY: argument types match the kernel; the layouts lie inside `s`; `out` holds n_out.
        expect_launch(unsafe { b.launch(launch_cfg(n_out)) }, name);
        return out;
    }

    let splits = if n_out >= TARGET_BLOCKS {
        1
    } else {
        TARGET_BLOCKS.div_ceil(n_out).min(n_red.div_ceil(MIN_CHUNK)).max(1)
    };
    let chunk = n_red.div_ceil(splits);
    let splits = n_red.div_ceil(chunk);
    let workspace = (splits > 1)
        .then(|| expect_launch(CudaStorage::alloc(dev, DType::U8, n_out * splits * STATE_BYTES), name));
    let partial = workspace.as_ref().map_or(0u64, |w| w.ptr());
    let (splits64, chunk64) = (splits as i64, chunk as i64);
    let blocks = (n_out * splits).min(1 << 16) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let f = func("blocks");
    let mut b = stream.launch_builder(&f);
    b.arg(&outs).arg(&red).arg(&src).arg(&n_out64).arg(&n_red64).arg(&splits64).arg(&chunk64);
    b.arg(&partial).arg(&dst).arg(&flag).arg(&correction);
    // SAFETY: as above; the workspace holds n_out * splits states of at most STATE_BYTES.
    expect_launch(unsafe { b.launch(cfg) }, name);
    if splits > 1 {
        let f = func("merge");
        let mut b = stream.launch_builder(&f);
        b.arg(&outs).arg(&red).arg(&src).arg(&n_out64).arg(&n_red64).arg(&splits64).arg(&chunk64);
        b.arg(&partial).arg(&dst).arg(&flag).arg(&correction);
        // SAFETY: as above; the blocks kernel filled the workspace earlier on this stream.
        expect_launch(unsafe { b.launch(launch_cfg(n_out)) }, name);
    }
    out
}

/// The single stride of dims that walk memory as one (row-major, each stride the next one's
/// times its extent), size-1 dims ignored; `Some(0)` for no dims.
fn single_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let kept: Vec<(usize, usize)> =
        dims.iter().zip(strides).filter(|(&d, _)| d != 1).map(|(&d, &s)| (d, s)).collect();
    let Some(&(_, innermost)) = kept.last() else { return Some(0) };
    kept.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0).then_some(innermost)
}

/// Sum and mean over the rows of a `[rows, cols]` view whose columns are contiguous (sum over
/// dim 0 of `[N, C]`, a bias gradient), by `reduce_*_cols` with coalesced reads; `None` when
/// the layout is not of that form.
fn reduce_columns(
    s: &CudaStorage,
    layout: &Layout,
    (kd, ks): (&[usize], &[usize]),
    (rd, rs): (&[usize], &[usize]),
    op: ReduceOp,
) -> Option<CudaStorage> {
    let family = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        _ => return None,
    };
    let (cols, rows): (usize, usize) = (kd.iter().product(), rd.iter().product());
    if !s.dtype().is_float() || cols == 0 || rows <= SHORT || single_stride(kd, ks)? != 1 {
        return None;
    }
    let row_stride = single_stride(rd, rs)?;
    if row_stride < cols {
        return None;
    }
    let name = op.name();
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, op.out_dtype(s.dtype()), cols), name);
    let col_blocks = cols.div_ceil(32);
    let splits = (TARGET_BLOCKS / col_blocks).clamp(1, rows.div_ceil(256)).min(1 << 15);
    let rows_per_split = rows.div_ceil(splits);
    let splits = rows.div_ceil(rows_per_split);
    let workspace = (splits > 1)
        .then(|| expect_launch(CudaStorage::alloc(dev, DType::U8, cols * splits * STATE_BYTES), name));
    let partial = workspace.as_ref().map_or(0u64, |w| w.ptr());
    let sfx = cuda::suffix(s.dtype());
    let src = s.ptr() + (layout.offset() * s.dtype().size_in_bytes()) as u64;
    let (dst, stream) = (out.ptr(), out.stream());
    let (rows64, cols64, stride64, per64) =
        (rows as i64, cols as i64, row_stride as i64, rows_per_split as i64);
    let f = expect_launch(dev.function(&SOURCE, &format!("reduce_{family}_cols_{sfx}")), name);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks as u32, splits as u32, 1),
        block_dim: (COLS_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(&f);
    b.arg(&src).arg(&rows64).arg(&cols64).arg(&stride64).arg(&per64).arg(&partial).arg(&dst);
    // SAFETY: element (j, c) of the view is at src + j * row_stride + c, inside `s`, for
    // j < rows and c < cols; the workspace holds cols * splits states; `out` holds cols.
    expect_launch(unsafe { b.launch(cfg) }, name);
    if splits > 1 {
        // The generic merge folds partial[o * splits + sp] for each output o, in split order.
        let (flag, correction, splits64, empty) = (0i32, 0i64, splits as i64, 0u64);
        let outs = StridedArg::new(&Layout::new(vec![cols], vec![1], 0));
        let red = StridedArg::new(&Layout::new(vec![rows], vec![row_stride], 0));
        let f = expect_launch(dev.function(&SOURCE, &format!("reduce_{family}_merge_{sfx}")), name);
        let mut b = stream.launch_builder(&f);
        b.arg(&outs).arg(&red).arg(&empty).arg(&cols64).arg(&rows64).arg(&splits64).arg(&per64);
        b.arg(&partial).arg(&dst).arg(&flag).arg(&correction);
        // SAFETY: the merge reads only the workspace the cols kernel filled on this stream.
        expect_launch(unsafe { b.launch(launch_cfg(cols)) }, name);
    }
    Some(out)
}

/// Lanes longer than this take the host fallback in [`topk`]: the GPU ranking is O(n^2).
const TOPK_GPU_MAX: usize = 16384;

/// Top-k of every lane of `lanes` (the searched dim last): values and int64 indices,
/// lane-major with k per lane.
pub(super) fn topk(
    s: &CudaStorage,
    lanes: &Layout,
    k: usize,
    largest: bool,
    sorted: bool,
) -> (CudaStorage, CudaStorage) {
    let rank = lanes.rank();
    let (n, stride) = (lanes.dims()[rank - 1], lanes.strides()[rank - 1]);
    let n_lanes: usize = lanes.dims()[..rank - 1].iter().product();
    let dev = s.device();
    if n > TOPK_GPU_MAX && k > 0 && n_lanes > 0 {
        // TEMPORARY fallback: long lanes are ranked on the host with the CPU kernel (one copy
        // each way) until a radix-select kernel replaces the quadratic GPU ranking.
        let cpu = expect_launch(s.to_cpu(), "topk");
        let (v, i) = super::topk::topk_cpu(&cpu, lanes, k, largest, sorted);
        return (
            expect_launch(CudaStorage::from_cpu(&v, dev), "topk"),
            expect_launch(CudaStorage::from_cpu(&i, dev), "topk"),
        );
    }
    let values = expect_launch(CudaStorage::alloc(dev, s.dtype(), n_lanes * k), "topk");
    let indices = expect_launch(CudaStorage::alloc(dev, DType::I64, n_lanes * k), "topk");
    if k == 0 || n_lanes == 0 {
        return (values, indices);
    }
    let bases = StridedArg::new(&Layout::new(
        &lanes.dims()[..rank - 1],
        lanes.strides()[..rank - 1].to_vec(),
        lanes.offset(),
    ));
    let ranks = expect_launch(CudaStorage::alloc(dev, DType::U32, n_lanes * n), "topk");
    let sfx = cuda::suffix(s.dtype());
    let (stride64, lanes64, n64, k64) = (stride as i64, n_lanes as i64, n as i64, k as i64);
    let (largest, sorted) = (largest as i32, sorted as i32);
    let (src, rk, pv, pi) = (s.ptr(), ranks.ptr(), values.ptr(), indices.ptr());
    let stream = values.stream();
    let f = expect_launch(dev.function(&SOURCE, &format!("topk_rank_{sfx}")), "topk");
    let mut b = stream.launch_builder(&f);
    b.arg(&bases).arg(&stride64).arg(&src).arg(&lanes64).arg(&n64).arg(&largest).arg(&rk);
    // SAFETY: argument types match the kernel; the lanes lie inside `s`; `ranks` holds lanes * n.
    expect_launch(unsafe { b.launch(launch_cfg(n_lanes * n)) }, "topk");
    let f = expect_launch(dev.function(&SOURCE, &format!("topk_write_{sfx}")), "topk");
    let mut b = stream.launch_builder(&f);
    b.arg(&bases).arg(&stride64).arg(&src).arg(&lanes64).arg(&n64).arg(&k64).arg(&sorted);
    b.arg(&rk).arg(&pv).arg(&pi);
    // SAFETY: as above; `values` and `indices` hold lanes * k elements and ranks are a
    // permutation per lane, so each position is written once.
    expect_launch(unsafe { b.launch(launch_cfg(n_lanes * n)) }, "topk");
    (values, indices)
}
