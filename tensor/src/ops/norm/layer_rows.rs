//! CUDA dispatch of the register-row layer-norm kernels (`layer_rows.cu`): one warp per row of
//! at most [`MAX_ROW`] elements, f32 statistics and arithmetic, inputs and outputs each in its
//! own dtype (f32, bf16 or f16), the residual add fused into the forward and the residual
//! gradient into the backward, and the parameter gradients summed per block in the same pass.
//! `OXTRAIN_DISABLE_FAST_LAYER_NORM=1` sends layer norm back to the f64 kernels of `norm.cu`.

use crate::cuda::{self, expect_launch, CudaStorage, KernelSource};
use crate::storage::Storage;
use crate::{DType, Tensor};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::sync::OnceLock;

/// `layer_rows.cu` with `LN_V` (values per lane) set, behind the shared header.
macro_rules! rows_source {
    ($v:literal) => {
        KernelSource {
            name: concat!("layer_rows_v", $v),
            code: concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/common.cuh")),
                "\n#define LN_V ",
                $v,
                "\n",
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/ops/norm/layer_rows.cu"))
            ),
        }
    };
}

/// One module per row-width class, (values per lane, source): rows of up to 32 V elements take
/// the first V that fits, and a model compiles only the modules its rows use.
pub(crate) const SOURCES: [(usize, KernelSource); 5] = [
    (4, rows_source!(4)),
    (8, rows_source!(8)),
    (16, rows_source!(16)),
    (24, rows_source!(24)),
    (32, rows_source!(32)),
];

/// The widest row the kernels hold in registers: 32 lanes of 32 values.
pub(super) const MAX_ROW: usize = 1024;
/// Warps (rows in flight) per block.
const WARPS: u32 = 4;
/// Most blocks of the backward: each writes one partial per column, so more blocks mean more
/// partials to add; this many keep an H200 (132 SMs, 4 blocks each) busy. A constant, so the
/// order of the sums, hence the result, depends on the shape only.
const MAX_GRAD_BLOCKS: usize = 528;
/// Most blocks of the forward (rows past it are taken in a grid-stride loop).
const MAX_FORWARD_BLOCKS: usize = 65535;

/// Whether the fast kernels are on: yes unless `OXTRAIN_DISABLE_FAST_LAYER_NORM` is set to
/// something other than `0` when the process first asks.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("OXTRAIN_DISABLE_FAST_LAYER_NORM").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

/// Whether the kernels take rows of `len` whose tensors have `dtypes`.
pub(super) fn takes(len: usize, dtypes: &[DType]) -> bool {
    enabled() && (1..=MAX_ROW).contains(&len) && dtypes.iter().all(|&d| code(d).is_some())
}

/// The kernels' dtype code (`LN_F32`, `LN_BF16`, `LN_F16`).
fn code(dtype: DType) -> Option<i32> {
    match dtype {
        DType::F32 => Some(0),
        DType::BF16 => Some(1),
        DType::F16 => Some(2),
        _ => None,
    }
}

fn code_of(dtype: DType) -> i32 {
    code(dtype).unwrap_or_else(|| unreachable!("layer_norm: {dtype} was checked by `takes`"))
}

/// The module for rows of `len`: the smallest values per lane V with 32 V >= len.
fn source_for(len: usize) -> &'static KernelSource {
    SOURCES.iter().find(|(v, _)| 32 * v >= len).map(|(_, s)| s).expect("len <= MAX_ROW was checked")
}

/// The device address of a contiguous CUDA tensor's first element (0 for none).
fn address(t: Option<&Tensor>) -> u64 {
    let Some(t) = t else { return 0 };
    debug_assert!(t.is_contiguous(), "layer_norm: kernels read contiguous rows");
    match &*t.storage() {
        Storage::Cuda(s) => s.ptr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("layer_norm: a CPU tensor reached the CUDA kernels"),
    }
}

fn device_of(t: &Tensor) -> std::sync::Arc<cuda::CudaDevice> {
    match &*t.storage() {
        Storage::Cuda(s) => s.device().clone(),
        Storage::Cpu(_) => unreachable!("layer_norm: a CPU tensor reached the CUDA kernels"),
    }
}

/// A new contiguous CUDA tensor of `dims` (uninitialised: the kernels write every element).
fn empty(like: &Tensor, dtype: DType, dims: &[usize], op: &str) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_storage(
        Storage::Cuda(expect_launch(CudaStorage::alloc(&device_of(like), dtype, n), op)),
        dims,
    )
}

fn rows_cfg(blocks: usize, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks.max(1) as u32, 1, 1), block_dim: (32 * WARPS, 1, 1), shared_mem_bytes }
}

/// What the forward reads: `x` (and `y`, added to it and stored as the sum) as contiguous rows of
/// `len`, weight and bias as contiguous f32 vectors of `len`.
pub(super) struct Forward<'a> {
    pub x: &'a Tensor,
    pub y: Option<&'a Tensor>,
    pub sum_dtype: DType,
    pub out_dtype: DType,
    pub weight: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
    pub eps: f64,
    pub len: usize,
}

/// `(sum, out, mean, rstd)`: the sum (when `y` is given) and output with `x`'s dims, mean and
/// rstd f32 of shape `stats_shape` (one per row).
pub(super) fn forward(f: &Forward, stats_shape: &[usize]) -> (Option<Tensor>, Tensor, Tensor, Tensor) {
    let op = "layer_norm";
    let (dims, len) = (f.x.dims(), f.len);
    let rows: usize = stats_shape.iter().product();
    let sum = f.y.map(|_| empty(f.x, f.sum_dtype, dims, op));
    let out = empty(f.x, f.out_dtype, dims, op);
    let (mean, rstd) = (empty(f.x, DType::F32, stats_shape, op), empty(f.x, DType::F32, stats_shape, op));
    if rows == 0 {
        return (sum, out, mean, rstd);
    }
    let func = expect_launch(device_of(f.x).function(source_for(len), "ln_rows_forward"), op);
    let (px, py, ps, po) = (address(Some(f.x)), address(f.y), address(sum.as_ref()), address(Some(&out)));
    let (pw, pb, pm, pr) = (address(f.weight), address(f.bias), address(Some(&mean)), address(Some(&rstd)));
    let (x_dt, out_dt) = (code_of(f.x.dtype()), code_of(f.out_dtype));
    let y_dt = f.y.map_or(0, |y| code_of(y.dtype()));
    let sum_dt = code_of(f.sum_dtype);
    let (rows64, len32, eps) = (rows as i64, len as i32, f.eps as f32);
    let stream = match &*out.storage() {
        Storage::Cuda(s) => s.stream(),
        Storage::Cpu(_) => unreachable!("made on the device"),
    };
    let mut b = stream.launch_builder(&func);
    b.arg(&px).arg(&x_dt).arg(&py).arg(&y_dt).arg(&ps).arg(&sum_dt).arg(&po).arg(&out_dt);
    b.arg(&pw).arg(&pb).arg(&pm).arg(&pr).arg(&rows64).arg(&len32).arg(&eps);
    let blocks = rows.div_ceil(WARPS as usize).min(MAX_FORWARD_BLOCKS);
    // SAFETY: the argument types match the kernel's; x, y, sum and out hold rows * len elements
    // of their dtypes (contiguous, checked by the caller), weight and bias (when given) `len`
    // f32 values, mean and rstd `rows` f32 values; 1 <= len <= 32 V of the module.
    expect_launch(unsafe { b.launch(rows_cfg(blocks, 0)) }, op);
    (sum, out, mean, rstd)
}

/// What the backward reads: `dy` and `x` as contiguous rows of `len` (their dims equal),
/// mean and rstd as contiguous f32 per row, weight as a contiguous f32 vector, and `residual`
/// (contiguous, `x`'s dims) added to dx.
pub(super) struct Backward<'a> {
    pub dy: &'a Tensor,
    pub x: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    pub residual: Option<&'a Tensor>,
    pub dx_dtype: DType,
    pub lowered: Option<DType>,
    pub param_grads: bool,
    pub len: usize,
}

/// `(dx, dx in the lowered dtype, (dweight, dbias))`, the parameter gradients f32 `[len]`.
pub(super) fn backward(bw: &Backward) -> (Tensor, Option<Tensor>, Option<(Tensor, Tensor)>) {
    let op = "layer_norm_backward";
    let (dims, len) = (bw.x.dims(), bw.len);
    let rows = bw.x.elem_count() / len;
    let dx = empty(bw.x, bw.dx_dtype, dims, op);
    let low = bw.lowered.map(|d| empty(bw.x, d, dims, op));
    let blocks = rows.div_ceil(WARPS as usize).clamp(1, MAX_GRAD_BLOCKS);
    let parts = bw
        .param_grads
        .then(|| (empty(bw.x, DType::F32, &[blocks, len], op), empty(bw.x, DType::F32, &[blocks, len], op)));
    let grads =
        bw.param_grads.then(|| (empty(bw.x, DType::F32, &[len], op), empty(bw.x, DType::F32, &[len], op)));
    let dev = device_of(bw.x);
    let stream = match &*dx.storage() {
        Storage::Cuda(s) => s.stream(),
        Storage::Cpu(_) => unreachable!("made on the device"),
    };
    let (part_w, part_b) = (address(parts.as_ref().map(|p| &p.0)), address(parts.as_ref().map(|p| &p.1)));
    if rows > 0 {
        let func = expect_launch(dev.function(source_for(len), "ln_rows_backward"), op);
        let (pg, px, pm, pr) =
            (address(Some(bw.dy)), address(Some(bw.x)), address(Some(bw.mean)), address(Some(bw.rstd)));
        let (pw, pres, pdx, plow) =
            (address(bw.weight), address(bw.residual), address(Some(&dx)), address(low.as_ref()));
        let (dy_dt, x_dt, dx_dt) = (code_of(bw.dy.dtype()), code_of(bw.x.dtype()), code_of(bw.dx_dtype));
        let res_dt = bw.residual.map_or(0, |r| code_of(r.dtype()));
        let low_dt = bw.lowered.map_or(0, code_of);
        let (rows64, len32) = (rows as i64, len as i32);
        let mut b = stream.launch_builder(&func);
        b.arg(&pg).arg(&dy_dt).arg(&px).arg(&x_dt).arg(&pm).arg(&pr).arg(&pw).arg(&pres).arg(&res_dt);
        b.arg(&pdx).arg(&dx_dt).arg(&plow).arg(&low_dt).arg(&part_w).arg(&part_b).arg(&rows64).arg(&len32);
        // Each warp's column sums of dy * x_hat and of dy, when the parameters want them.
        let shared = if bw.param_grads { 2 * WARPS * len as u32 * 4 } else { 0 };
        // SAFETY: the argument types match the kernel's; dy, x, residual, dx and the lowered dx
        // hold rows * len elements of their dtypes (contiguous), mean and rstd `rows` f32
        // values, weight `len`; the partials hold blocks * len f32 values each and the shared
        // memory 2 * WARPS * len floats (at most 32 KiB, under the 48 KiB default limit).
        expect_launch(unsafe { b.launch(rows_cfg(blocks, shared)) }, op);
    }
    if let (Some((dw, db)), Some((pw, pb))) = (&grads, &parts) {
        let func = expect_launch(dev.function(source_for(len), "ln_param_finish"), op);
        let (ppw, ppb, pdw, pdb) =
            (address(Some(pw)), address(Some(pb)), address(Some(dw)), address(Some(db)));
        // No rows: the partials of the one block would be unwritten; sum none of them.
        let (parts64, len32) = (if rows > 0 { blocks as i64 } else { 0 }, len as i32);
        let mut b = stream.launch_builder(&func);
        b.arg(&ppw).arg(&ppb).arg(&parts64).arg(&len32).arg(&pdw).arg(&pdb);
        let cfg = LaunchConfig {
            grid_dim: (len.div_ceil(32) as u32, 1, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the partials hold parts * len f32 values, dw and db `len`.
        expect_launch(unsafe { b.launch(cfg) }, op);
    }
    (dx, low, grads)
}
