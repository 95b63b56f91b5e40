//! CUDA dispatch for normalisation (kernels in `norm.cu`). Statistics stay on the device as
//! f64 buffers; weights, biases and given statistics arrive as contiguous f64 tensors.

use super::channels_last::{TileMask, Tiles};
use super::cpu::Channels;
use super::relu::BatchNormFactors;
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::storage::Storage;
use crate::{DType, Layout, Tensor};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::sync::Arc;

pub(crate) const SOURCE: KernelSource = cuda::source!("norm", "src/ops/norm/norm.cu");

/// Threads per block of the reductions (a multiple of 32, see `norm_block_sum`).
const THREADS: u32 = 256;
/// Elements of one channel one block of `moments_partial` sums: enough blocks to fill the GPU
/// when there are few channels, few enough partials to sum them in one block after.
const MOMENT_CHUNK: usize = 1 << 14;
const MAX_SPLITS: usize = 4096;
/// Most blocks of `layer_norm`; rows past it are taken in a grid-stride loop.
const MAX_ROW_BLOCKS: usize = 65535;

fn blocks(x: usize, y: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (x as u32, y as u32, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The device address of a contiguous f64 tensor's first element (0 for none).
pub(super) fn f64_ptr(t: Option<&Tensor>) -> u64 {
    let Some(t) = t else { return 0 };
    debug_assert!(t.dtype() == DType::F64 && t.is_contiguous());
    match &*t.storage() {
        Storage::Cuda(s) => s.ptr() + 8 * t.layout().offset() as u64,
        Storage::Cpu(_) => unreachable!("a parameter on the CPU was checked against a CUDA input"),
    }
}

fn f64_tensor(s: CudaStorage, shape: &[usize]) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), shape)
}

/// Whether batch norm's input lies packed as rows of `channels` with the channel innermost
/// (channels-last NHWC, or a contiguous `[N, C]`): the kernels then read it as flat memory,
/// coalesced along the channels, and write their results in the same layout.
pub(crate) fn channels_last(layout: &Layout, channels: usize) -> bool {
    channels > 1 && layout.strides()[1] == 1 && layout.dense_order().is_some()
}

/// Blocks a channels-last reduction aims for: several per SM of an H200 (132 SMs).
const CL_TARGET_BLOCKS: usize = 1024;
/// Fewest rows one block of a channels-last reduction takes.
const CL_MIN_ROWS: usize = 64;

/// Grid and rows per split of a channels-last reduction over `rows` x `channels`.
fn cl_grid(channels: usize, rows: usize) -> (LaunchConfig, usize, usize) {
    let xblocks = channels.div_ceil(32);
    let want = CL_TARGET_BLOCKS.div_ceil(xblocks).min(rows.div_ceil(CL_MIN_ROWS)).clamp(1, MAX_SPLITS);
    let chunk = rows.div_ceil(want).max(1);
    let splits = rows.div_ceil(chunk).max(1);
    let cfg = LaunchConfig {
        grid_dim: (xblocks as u32, splits as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    (cfg, splits, chunk)
}

/// The address of a layout's first element.
fn first_element(s: &CudaStorage, layout: &Layout) -> u64 {
    s.ptr() + (layout.offset() * s.dtype().size_in_bytes()) as u64
}

/// Per-channel mean and biased variance as f64 tensors of shape `[C]`.
pub(super) fn channel_moments(s: &CudaStorage, layout: &Layout, ch: Channels, op: &str) -> (Tensor, Tensor) {
    let dev = s.device();
    let channels = ch.channels;
    let count = layout.elem_count().checked_div(channels).unwrap_or(0);
    let mean = expect_launch(CudaStorage::alloc(dev, DType::F64, channels), op);
    let var = expect_launch(CudaStorage::alloc(dev, DType::F64, channels), op);
    if channels > 0 && count > 0 && channels_last(layout, channels) {
        // One pass of shifted sums (see channels_last.cu), then mean and var.
        let x = first_element(s, layout);
        let tiles = Tiles::new(s.dtype(), channels, count, &[x]);
        let splits = tiles.splits();
        let alloc = |n: usize| expect_launch(CudaStorage::alloc(dev, DType::F64, n), op);
        let (p1, p2) = (alloc(channels * splits), alloc(channels * splits));
        tiles.stats(s, x, (p1.ptr(), p2.ptr()), op);
        let finish = expect_launch(
            dev.function(&SOURCE, &format!("moments_shifted_finish_{}", cuda::suffix(s.dtype()))),
            op,
        );
        let (pp1, pp2, pm, pv) = (p1.ptr(), p2.ptr(), mean.ptr(), var.ptr());
        let (splits64, countf) = (splits as i64, count as f64);
        let stream = mean.stream();
        let mut b = stream.launch_builder(&finish);
        b.arg(&x).arg(&pp1).arg(&pp2).arg(&splits64).arg(&countf).arg(&pm).arg(&pv);
        // SAFETY: `x` is the packed input's first element; the partials hold channels * splits
        // values, `mean` and `var` `channels`.
        expect_launch(unsafe { b.launch(blocks(channels, 1)) }, op);
    } else if channels > 0 {
        let splits = count.div_ceil(MOMENT_CHUNK).clamp(1, MAX_SPLITS);
        let chunk = count.div_ceil(splits).max(1);
        let partial = expect_launch(CudaStorage::alloc(dev, DType::F64, channels * splits), op);
        let part =
            expect_launch(dev.function(&SOURCE, &format!("moments_partial_{}", cuda::suffix(s.dtype()))), op);
        let finish = expect_launch(dev.function(&SOURCE, "moments_finish"), op);
        let (sx, x, pp) = (StridedArg::new(layout), s.ptr(), partial.ptr());
        let (c64, sp64, n64, chunk64, splits64) =
            (channels as i64, ch.spatial as i64, count as i64, chunk as i64, splits as i64);
        let countf = count as f64;
        let stream = mean.stream();
        // Pass 1 sums x into the mean; pass 2 sums the squared deviations from it.
        for (center, dst) in [(0u64, mean.ptr()), (mean.ptr(), var.ptr())] {
            let mut b = stream.launch_builder(&part);
            b.arg(&sx).arg(&x).arg(&center).arg(&pp).arg(&c64).arg(&sp64).arg(&n64).arg(&chunk64);
            // SAFETY: types match the kernel; the layout lies inside `s`; `partial` holds
            // channels * splits values and `center` (when set) `channels`.
            expect_launch(unsafe { b.launch(blocks(channels, splits)) }, op);
            let mut b = stream.launch_builder(&finish);
            b.arg(&pp).arg(&splits64).arg(&countf).arg(&dst);
            // SAFETY: as above; `dst` holds `channels` values.
            expect_launch(unsafe { b.launch(blocks(channels, 1)) }, op);
        }
    }
    (f64_tensor(mean, &[channels]), f64_tensor(var, &[channels]))
}

/// Batch norm's per-channel factors of the output: `scale = weight / sqrt(var + eps)` and
/// `shift = bias`, as `[C]` f64 tensors. `var`, `weight` and `bias` are contiguous f64
/// tensors on `dev`.
pub(super) fn affine_factors(
    dev: &Arc<cuda::CudaDevice>,
    channels: usize,
    (var, weight, bias): (&Tensor, Option<&Tensor>, Option<&Tensor>),
    eps: f64,
    op: &str,
) -> (Tensor, Tensor) {
    let scale = expect_launch(CudaStorage::alloc(dev, DType::F64, channels), op);
    let shift = expect_launch(CudaStorage::alloc(dev, DType::F64, channels), op);
    if channels > 0 {
        let prepare = expect_launch(dev.function(&SOURCE, "bn_prepare"), op);
        let (c64, pv, pw, pb, ps, pz) =
            (channels as i64, f64_ptr(Some(var)), f64_ptr(weight), f64_ptr(bias), scale.ptr(), shift.ptr());
        let stream = scale.stream();
        let mut b = stream.launch_builder(&prepare);
        b.arg(&c64).arg(&pv).arg(&pw).arg(&pb).arg(&eps).arg(&ps).arg(&pz);
        // SAFETY: types match; every per-channel buffer holds `channels` f64 values (checked shapes).
        expect_launch(unsafe { b.launch(launch_cfg(channels)) }, op);
    }
    (f64_tensor(scale, &[channels]), f64_tensor(shift, &[channels]))
}

/// `(x - mean[c]) * scale[c] + shift[c]` in the input's dtype (then ReLU with `relu`), the
/// factors of [`affine_factors`]: packed like the input when that is channels-last (see
/// [`channels_last`]), else contiguous. `mean`, `scale` and `shift` are contiguous f64 tensors
/// on the input's device.
pub(super) fn channel_affine(
    s: &CudaStorage,
    layout: &Layout,
    ch: Channels,
    (mean, scale, shift): (&Tensor, &Tensor, &Tensor),
    (relu, residual): (bool, Option<(&CudaStorage, &Layout)>),
    op: &str,
) -> CudaStorage {
    let relu = relu as i32;
    let dev = s.device();
    let n = layout.elem_count();
    let out = expect_launch(CudaStorage::alloc(dev, s.dtype(), n), op);
    if n == 0 {
        return out;
    }
    let channels = ch.channels;
    let stream = out.stream();
    let (c64, sp64, n64) = (channels as i64, ch.spatial as i64, n as i64);
    let (pm, ps, pz) = (f64_ptr(Some(mean)), f64_ptr(Some(scale)), f64_ptr(Some(shift)));
    // A residual comes packed like the input, which is then channels-last (the caller's rule).
    let res = residual.map(|(r, l)| first_element(r, l));
    if channels_last(layout, channels) {
        let x = first_element(s, layout);
        let mut ptrs = vec![x, out.ptr()];
        ptrs.extend(res);
        let tiles = Tiles::new(s.dtype(), channels, n / channels, &ptrs);
        tiles.affine(s, (x, res.unwrap_or(0), out.ptr()), (pm, ps, pz), relu != 0, op);
        return out;
    }
    assert!(res.is_none(), "{op}: a fused residual needs a channels-last input");
    let affine = expect_launch(dev.function(&SOURCE, &format!("bn_affine_{}", cuda::suffix(s.dtype()))), op);
    let (sx, x, po) = (StridedArg::new(layout), s.ptr(), out.ptr());
    let mut b = stream.launch_builder(&affine);
    b.arg(&sx).arg(&x).arg(&po).arg(&n64).arg(&c64).arg(&sp64).arg(&pm).arg(&ps).arg(&pz).arg(&relu);
    // SAFETY: types match; `out` holds n elements and the layout lies inside `s`; the factors
    // hold `channels` f64 values each.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// Layer norm of the contiguous `s` over rows of `row_len`: the output and each row's mean and
/// rstd as f64 tensors of shape `stats_shape`.
pub(super) fn layer_norm(
    s: &CudaStorage,
    row_len: usize,
    (weight, bias): (Option<&Tensor>, Option<&Tensor>),
    eps: f64,
    stats_shape: &[usize],
) -> (CudaStorage, Tensor, Tensor) {
    let op = "layer_norm";
    let dev = s.device();
    let rows: usize = stats_shape.iter().product();
    let out = expect_launch(CudaStorage::alloc(dev, s.dtype(), rows * row_len), op);
    let mean = expect_launch(CudaStorage::alloc(dev, DType::F64, rows), op);
    let rstd = expect_launch(CudaStorage::alloc(dev, DType::F64, rows), op);
    if rows > 0 {
        let f = expect_launch(dev.function(&SOURCE, &format!("layer_norm_{}", cuda::suffix(s.dtype()))), op);
        let (x, po, pw, pb, pm, pr) =
            (s.ptr(), out.ptr(), f64_ptr(weight), f64_ptr(bias), mean.ptr(), rstd.ptr());
        let (rows64, len64) = (rows as i64, row_len as i64);
        let stream = out.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&x).arg(&po).arg(&rows64).arg(&len64).arg(&pw).arg(&pb).arg(&eps).arg(&pm).arg(&pr);
        // SAFETY: types match; `s` and `out` hold rows * row_len elements, weight and bias
        // (when given) row_len, mean and rstd `rows`.
        expect_launch(unsafe { b.launch(blocks(rows.min(MAX_ROW_BLOCKS), 1)) }, op);
    }
    (out, f64_tensor(mean, stats_shape), f64_tensor(rstd, stats_shape))
}

/// How batch norm's backward on the device masks dy with the ReLU that followed it (only for
/// channels-last inputs, which the tile kernels take).
#[derive(Clone, Copy)]
pub(super) enum DeviceMask<'a> {
    None,
    /// By the ReLU's output, packed like x; the masked dy is returned too. The addend (packed
    /// like x), when given, is a second part of dy, added as the first pass reads it.
    Output(&'a CudaStorage, &'a Layout, Option<(&'a CudaStorage, &'a Layout)>),
    /// Recomputed from x with the forward's factors.
    Recompute(&'a BatchNormFactors),
}

/// Batch norm's training-mode gradients on the device: `(dx, dweight, dbias, masked)`, dx in
/// the input's dtype, packed like the input when that is channels-last, else contiguous (None
/// unless `input_grad`), dweight and dbias `[C]` f64 tensors, and with [`DeviceMask::Output`]
/// the masked dy (packed like the input). `mean`, `var` and `weight` are contiguous f64
/// tensors. Two passes over dy and x, as on the CPU.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_norm_backward(
    (g, g_layout): (&CudaStorage, &Layout),
    (s, layout): (&CudaStorage, &Layout),
    ch: Channels,
    (mean, var, weight): (&Tensor, &Tensor, Option<&Tensor>),
    eps: f64,
    (input_grad, mask): (bool, DeviceMask<'_>),
    op: &str,
) -> (Option<CudaStorage>, Tensor, Tensor, Option<CudaStorage>) {
    let dev = s.device();
    let channels = ch.channels;
    let n = layout.elem_count();
    let count = n.checked_div(channels).unwrap_or(0);
    let alloc = |len: usize| expect_launch(CudaStorage::alloc(dev, DType::F64, len), op);
    let (sum_dy, sum_dyx, dweight) = (alloc(channels), alloc(channels), alloc(channels));
    let (scale, shift, k) = (alloc(channels), alloc(channels), alloc(channels));
    let dx = input_grad.then(|| expect_launch(CudaStorage::alloc(dev, s.dtype(), n), op));
    let masked = matches!(mask, DeviceMask::Output(..))
        .then(|| expect_launch(CudaStorage::alloc(dev, s.dtype(), n), op));
    // Both packed alike as channels-last rows (the caller copies dy into x's order).
    let cl = channels_last(layout, channels) && g_layout.dense_order() == layout.dense_order();
    let (relu_out, addend) = match mask {
        DeviceMask::Output(y, y_layout, addend) => {
            (Some(first_element(y, y_layout)), addend.map(|(a, a_layout)| first_element(a, a_layout)))
        }
        _ => (None, None),
    };
    assert!(
        cl || matches!(mask, DeviceMask::None),
        "{op}: a fused ReLU mask needs dy, x and the ReLU's output packed alike channels-last"
    );
    if channels == 0 || count == 0 {
        // No element: every sum is zero, and so is the (empty) masked gradient.
        let zeros =
            || f64_tensor(expect_launch(CudaStorage::zeros(dev, DType::F64, channels), op), &[channels]);
        return (dx, zeros(), zeros(), masked);
    }
    let suffix = cuda::suffix(s.dtype());
    let stream = sum_dy.stream();
    let (sdy, sx) = (StridedArg::new(g_layout), StridedArg::new(layout));
    let (pg, px, pm) = (g.ptr(), s.ptr(), f64_ptr(Some(mean)));
    let c64 = channels as i64;
    let (fg, fx) = (first_element(g, g_layout), first_element(s, layout));
    let tiles = cl.then(|| {
        let mut ptrs = vec![fg, fx];
        ptrs.extend(dx.as_ref().map(CudaStorage::ptr));
        ptrs.extend(masked.as_ref().map(CudaStorage::ptr));
        ptrs.extend(relu_out);
        ptrs.extend(addend);
        Tiles::new(s.dtype(), channels, count, &ptrs)
    });
    let tile_mask = match mask {
        DeviceMask::None => TileMask::None,
        DeviceMask::Output(..) => TileMask::Output {
            relu_out: relu_out.unwrap_or(0),
            masked: masked.as_ref().map_or(0, CudaStorage::ptr),
            addend: addend.unwrap_or(0),
        },
        DeviceMask::Recompute(f) => TileMask::Recompute {
            mean: f64_ptr(Some(&f.mean)),
            scale: f64_ptr(Some(&f.scale)),
            shift: f64_ptr(Some(&f.shift)),
        },
    };
    let (part_dy, part_dyx, splits) = if let Some(tiles) = &tiles {
        let splits = tiles.splits();
        let (part_dy, part_dyx) = (alloc(channels * splits), alloc(channels * splits));
        tiles.grad_sums(s, (fg, fx, pm), tile_mask, (part_dy.ptr(), part_dyx.ptr()), op);
        (part_dy, part_dyx, splits)
    } else {
        let splits = count.div_ceil(MOMENT_CHUNK).clamp(1, MAX_SPLITS);
        let chunk = count.div_ceil(splits).max(1);
        let (part_dy, part_dyx) = (alloc(channels * splits), alloc(channels * splits));
        let (sp64, cnt64, chunk64) = (ch.spatial as i64, count as i64, chunk as i64);
        let partial = expect_launch(dev.function(&SOURCE, &format!("bn_grad_partial_{suffix}")), op);
        let (ppd, ppx) = (part_dy.ptr(), part_dyx.ptr());
        let mut b = stream.launch_builder(&partial);
        b.arg(&sdy)
            .arg(&pg)
            .arg(&sx)
            .arg(&px)
            .arg(&pm)
            .arg(&ppd)
            .arg(&ppx)
            .arg(&c64)
            .arg(&sp64)
            .arg(&cnt64)
            .arg(&chunk64);
        // SAFETY: types match the kernel; both layouts lie inside their storages and have the
        // same dims; the partial buffers hold channels * splits values, `mean` `channels`.
        expect_launch(unsafe { b.launch(blocks(channels, splits)) }, op);
        (part_dy, part_dyx, splits)
    };
    let (ppd, ppx, splits64) = (part_dy.ptr(), part_dyx.ptr(), splits as i64);
    let finish = expect_launch(dev.function(&SOURCE, "moments_finish"), op);
    let one = 1.0f64;
    for (src, dst) in [(ppd, sum_dy.ptr()), (ppx, sum_dyx.ptr())] {
        let mut b = stream.launch_builder(&finish);
        b.arg(&src).arg(&splits64).arg(&one).arg(&dst);
        // SAFETY: `src` holds channels * splits values, `dst` `channels`.
        expect_launch(unsafe { b.launch(blocks(channels, 1)) }, op);
    }
    let prepare = expect_launch(dev.function(&SOURCE, "bn_grad_prepare"), op);
    let (pv, pw, countf) = (f64_ptr(Some(var)), f64_ptr(weight), count as f64);
    let (psd, psx, ps, pz, pk, pdw) =
        (sum_dy.ptr(), sum_dyx.ptr(), scale.ptr(), shift.ptr(), k.ptr(), dweight.ptr());
    let mut b = stream.launch_builder(&prepare);
    b.arg(&c64)
        .arg(&pv)
        .arg(&pw)
        .arg(&eps)
        .arg(&countf)
        .arg(&psd)
        .arg(&psx)
        .arg(&ps)
        .arg(&pz)
        .arg(&pk)
        .arg(&pdw);
    // SAFETY: every per-channel buffer holds `channels` f64 values (checked shapes).
    expect_launch(unsafe { b.launch(launch_cfg(channels)) }, op);
    match (&dx, &tiles) {
        (Some(out), Some(tiles)) => tiles.input_grad(s, (fg, fx, out.ptr()), tile_mask, (pm, ps, pz, pk), op),
        (Some(out), None) => {
            let (po, n64, sp64) = (out.ptr(), n as i64, ch.spatial as i64);
            let f = expect_launch(dev.function(&SOURCE, &format!("bn_input_grad_{suffix}")), op);
            let mut b = stream.launch_builder(&f);
            b.arg(&sdy)
                .arg(&pg)
                .arg(&sx)
                .arg(&px)
                .arg(&po)
                .arg(&n64)
                .arg(&c64)
                .arg(&sp64)
                .arg(&pm)
                .arg(&ps)
                .arg(&pz)
                .arg(&pk);
            // SAFETY: types match the kernel; both layouts lie inside their storages and have
            // the same dims; `out` holds n elements, the per-channel buffers `channels`.
            expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
        }
        (None, _) => {}
    }
    (dx, f64_tensor(dweight, &[channels]), f64_tensor(sum_dy, &[channels]), masked)
}

/// Layer norm's gradients on the device for contiguous `dy` and `x` of `rows` x `len`:
/// `(dx, dweight, dbias)`, dx in their dtype, dweight and dbias `[len]` f64 tensors. `mean`
/// and `rstd` (per row) and `weight` are contiguous f64 tensors.
pub(super) fn layer_norm_backward(
    dy: &CudaStorage,
    x: &CudaStorage,
    (rows, len): (usize, usize),
    (mean, rstd, weight): (&Tensor, &Tensor, Option<&Tensor>),
) -> (CudaStorage, Tensor, Tensor) {
    let op = "layer_norm_backward";
    let dev = x.device();
    let suffix = cuda::suffix(x.dtype());
    let dx = expect_launch(CudaStorage::alloc(dev, x.dtype(), rows * len), op);
    let alloc = |n: usize| expect_launch(CudaStorage::alloc(dev, DType::F64, n), op);
    let (dw, db) = (alloc(len), alloc(len));
    if rows == 0 || len == 0 {
        let zeros = || f64_tensor(expect_launch(CudaStorage::zeros(dev, DType::F64, len), op), &[len]);
        return (dx, zeros(), zeros());
    }
    let stream = dx.stream();
    let (pg, px, pm, pr, pw, po) =
        (dy.ptr(), x.ptr(), f64_ptr(Some(mean)), f64_ptr(Some(rstd)), f64_ptr(weight), dx.ptr());
    let (rows64, len64) = (rows as i64, len as i64);
    let f = expect_launch(dev.function(&SOURCE, &format!("layer_norm_input_grad_{suffix}")), op);
    let mut b = stream.launch_builder(&f);
    b.arg(&pg).arg(&px).arg(&pm).arg(&pr).arg(&pw).arg(&po).arg(&rows64).arg(&len64);
    let warps_per_block = THREADS as usize / 32;
    // SAFETY: types match; dy, x and dx hold rows * len elements, mean and rstd `rows`, the
    // weight (when given) `len`.
    expect_launch(unsafe { b.launch(blocks(rows.div_ceil(warps_per_block).min(MAX_ROW_BLOCKS), 1)) }, op);

    let (cfg, splits, chunk) = cl_grid(len, rows);
    let (part_w, part_b) = (alloc(len * splits), alloc(len * splits));
    let f = expect_launch(dev.function(&SOURCE, &format!("layer_norm_param_partial_{suffix}")), op);
    let (ppw, ppb, chunk64, splits64) = (part_w.ptr(), part_b.ptr(), chunk as i64, splits as i64);
    let mut b = stream.launch_builder(&f);
    b.arg(&pg).arg(&px).arg(&pm).arg(&pr).arg(&ppw).arg(&ppb).arg(&len64).arg(&rows64).arg(&chunk64);
    // SAFETY: as above; the partial buffers hold len * splits values.
    expect_launch(unsafe { b.launch(cfg) }, op);
    let finish = expect_launch(dev.function(&SOURCE, "moments_finish"), op);
    let one = 1.0f64;
    for (src, dst) in [(ppw, dw.ptr()), (ppb, db.ptr())] {
        let mut b = stream.launch_builder(&finish);
        b.arg(&src).arg(&splits64).arg(&one).arg(&dst);
        // SAFETY: `src` holds len * splits values, `dst` `len`.
        expect_launch(unsafe { b.launch(blocks(len, 1)) }, op);
    }
    (dx, f64_tensor(dw, &[len]), f64_tensor(db, &[len]))
}
