//! CUDA dispatch for the index ops (kernels in `index.cu`). Gathers and embedding's backward
//! read and check their indices on the device (a bad one is reported at the next wait for the
//! device, see `cuda::host_waits`), so they never make the host wait. scatter_add and
//! index_add get their contributions grouped by target on the host (from the indices read for
//! checking), so each output element is summed by one thread in index order: deterministic,
//! and equal to the CPU result.

use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::storage::CpuStorage;
use crate::{DType, Layout};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rayon::slice::ParallelSliceMut;

pub(crate) const SOURCE: KernelSource = cuda::source!("index", "src/ops/index/index.cu");

/// The index tensor's kernel-name suffix (its dtype was checked when its values were read).
fn index_suffix(ids: &CudaStorage) -> &'static str {
    match ids.dtype() {
        DType::I64 => "i64",
        DType::U32 => "u32",
        other => unreachable!("index dtype {other} passed the checks"),
    }
}

/// `out[i] = src[view(i) + ids[ids_view(i)] * dim_stride]` for every `i` of the output, whose
/// shape both views have; an id outside `0..bound` is reported at the next wait for the device.
pub(super) fn gather(
    (src, view, dim_stride): (&CudaStorage, &Layout, usize),
    (ids, ids_view, bound): (&CudaStorage, &Layout, usize),
    op: &'static str,
) -> CudaStorage {
    let n = view.elem_count();
    let dev = src.device();
    let out = expect_launch(CudaStorage::alloc(dev, src.dtype(), n), op);
    if n == 0 {
        return out;
    }
    let kernel = format!("gather_b{}_{}", src.dtype().size_in_bytes() * 8, index_suffix(ids));
    let f = expect_launch(dev.function(&SOURCE, &kernel), op);
    let (sv, iv) = (StridedArg::new(view), StridedArg::new(ids_view));
    let (ps, pi, po, stride, n64) = (src.ptr(), ids.ptr(), out.ptr(), dim_stride as i64, n as i64);
    let (bound, err) = (bound as i64, expect_launch(dev.error_record(op), op));
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&sv).arg(&ps).arg(&stride).arg(&iv).arg(&pi).arg(&po).arg(&n64).arg(&bound).arg(&err);
    // SAFETY: types match the kernel; ids outside 0..bound are not read through, so every read
    // lies inside `src`; the index view lies inside `ids`, and `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// The gradient of an embedding table of `num` rows from `grad` (`[n, dim]`, contiguous from
/// element `offset` of its storage) and
/// the `n` ids `ids` (seen through `ids_layout`): the ids sorted stably on the device, then each
/// id's rows summed in position order, as the CPU does. No host wait; an id outside `0..num`
/// is skipped and reported at the next wait for the device.
pub(super) fn embedding_backward(
    (grad, offset): (&CudaStorage, usize),
    (ids, ids_layout): (&CudaStorage, &Layout),
    (n, dim, num): (usize, usize, usize),
) -> CudaStorage {
    let op = "embedding_backward";
    let dev = grad.device().clone();
    let out = expect_launch(CudaStorage::zeros(&dev, grad.dtype(), num * dim), op);
    if n == 0 || dim == 0 {
        return out;
    }
    assert!(
        n < u32::MAX as usize && num < u32::MAX as usize,
        "{op}: {n} ids into {num} rows: the device sort takes fewer than 2^32 of each"
    );
    let (keys, pos) = sorted_ids((ids, ids_layout), n, num, &dev, op);
    let f = expect_launch(
        dev.function(&SOURCE, &format!("embedding_backward_{}", cuda::suffix(grad.dtype()))),
        op,
    );
    let (pk, pp, n64, num32, pg, dim64, po) =
        (keys.ptr(), pos.ptr(), n as i64, num as u32, grad.ptr(), dim as i64, out.ptr());
    let pg = pg + (offset * grad.dtype().size_in_bytes()) as u64;
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&pk).arg(&pp).arg(&n64).arg(&num32).arg(&pg).arg(&dim64).arg(&po);
    // SAFETY: types match the kernel; `keys` and `pos` hold n entries, positions < n index rows
    // of `grad` ([n, dim]); keys < num index rows of `out` ([num, dim]); larger keys are skipped.
    expect_launch(unsafe { b.launch(launch_cfg(n * dim)) }, op);
    out
}

/// The (id, position) pairs of `ids` sorted by id, stably: as many 8-bit radix passes as
/// `num` (the key of a bad id) has digits, each a count, a scan and a scatter.
fn sorted_ids(
    (ids, ids_layout): (&CudaStorage, &Layout),
    n: usize,
    num: usize,
    dev: &std::sync::Arc<cuda::CudaDevice>,
    op: &'static str,
) -> (CudaStorage, CudaStorage) {
    const TILE: usize = 2048; // SORT_TILE in index.cu
    const RADIX: u32 = 256;
    let buffer = || expect_launch(CudaStorage::alloc(dev, DType::U32, n), op);
    let (mut keys, mut pos, mut keys_out, mut pos_out) = (buffer(), buffer(), buffer(), buffer());
    let stream = keys.stream();
    let f = expect_launch(dev.function(&SOURCE, &format!("embedding_keys_{}", index_suffix(ids))), op);
    let (iv, pi, n64, num64, pk, pp, err) = (
        StridedArg::new(ids_layout),
        ids.ptr(),
        n as i64,
        num as i64,
        keys.ptr(),
        pos.ptr(),
        expect_launch(dev.error_record(op), op),
    );
    let mut b = stream.launch_builder(&f);
    b.arg(&iv).arg(&pi).arg(&n64).arg(&num64).arg(&pk).arg(&pp).arg(&err);
    // SAFETY: types match the kernel; the layout lies in `ids`; `keys` and `pos` hold n entries.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    let tiles = n.div_ceil(TILE);
    let counts = expect_launch(CudaStorage::alloc(dev, DType::U32, tiles * RADIX as usize), op);
    let (count, scan, scatter) = (
        expect_launch(dev.function(&SOURCE, "radix_count"), op),
        expect_launch(dev.function(&SOURCE, "radix_scan"), op),
        expect_launch(dev.function(&SOURCE, "radix_scatter"), op),
    );
    let (n32, tiles32, len32, pc) = (n as u32, tiles as u32, tiles as u32 * RADIX, counts.ptr());
    let per_tile = LaunchConfig { grid_dim: (tiles32, 1, 1), block_dim: (RADIX, 1, 1), shared_mem_bytes: 0 };
    let one_block = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let bits = u32::BITS - (num as u32).leading_zeros();
    for shift in (0..bits.max(1)).step_by(8) {
        let shift = shift as i32;
        let (pk, pp, pko, ppo) = (keys.ptr(), pos.ptr(), keys_out.ptr(), pos_out.ptr());
        let mut b = stream.launch_builder(&count);
        b.arg(&pk).arg(&n32).arg(&shift).arg(&pc).arg(&tiles32);
        // SAFETY: `keys` holds n entries, `counts` RADIX * tiles.
        expect_launch(unsafe { b.launch(per_tile) }, op);
        let mut b = stream.launch_builder(&scan);
        b.arg(&pc).arg(&len32);
        // SAFETY: `counts` holds len entries.
        expect_launch(unsafe { b.launch(one_block) }, op);
        let mut b = stream.launch_builder(&scatter);
        b.arg(&pk).arg(&pp).arg(&n32).arg(&shift).arg(&pc).arg(&tiles32).arg(&pko).arg(&ppo);
        // SAFETY: the scanned counts place each of the n pairs once inside the n-entry outputs.
        expect_launch(unsafe { b.launch(per_tile) }, op);
        std::mem::swap(&mut keys, &mut keys_out);
        std::mem::swap(&mut pos, &mut pos_out);
    }
    (keys, pos)
}

fn upload_i64(dev: &std::sync::Arc<cuda::CudaDevice>, v: Vec<i64>, op: &str) -> CudaStorage {
    expect_launch(CudaStorage::from_cpu(&CpuStorage::I64(v), dev), op)
}

/// A copy of `dst` with the `src_view` elements at row-major index positions `idx`'s order
/// added to `targets[p]` (contiguous output offsets), as the CPU's scatter_add.
pub(super) fn scatter_add(
    (dst, dst_layout): (&CudaStorage, &Layout),
    (src, src_view): (&CudaStorage, &Layout),
    targets: &[usize],
) -> CudaStorage {
    let op = "scatter_add";
    let out = crate::ops::convert::cuda::copy(dst, dst_layout);
    if targets.is_empty() {
        return out;
    }
    // Positions sorted by target, ties in index order (what the CPU's sequential loop adds).
    let mut perm: Vec<i64> = (0..targets.len() as i64).collect();
    perm.par_sort_by_key(|&p| targets[p as usize]);
    let (mut starts, mut group_targets) = (vec![0i64], vec![]);
    for (k, &p) in perm.iter().enumerate() {
        let t = targets[p as usize] as i64;
        if group_targets.last() != Some(&t) {
            if k > 0 {
                starts.push(k as i64);
            }
            group_targets.push(t);
        }
    }
    starts.push(perm.len() as i64);
    let groups = group_targets.len();
    let dev = out.device().clone();
    let (perm, starts, group_targets) =
        (upload_i64(&dev, perm, op), upload_i64(&dev, starts, op), upload_i64(&dev, group_targets, op));
    let f = expect_launch(dev.function(&SOURCE, &format!("scatter_add_{}", cuda::suffix(dst.dtype()))), op);
    let sv = StridedArg::new(src_view);
    let (ps, pp, pst, pt, g64, po) =
        (src.ptr(), perm.ptr(), starts.ptr(), group_targets.ptr(), groups as i64, out.ptr());
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&sv).arg(&ps).arg(&pp).arg(&pst).arg(&pt).arg(&g64).arg(&po);
    // SAFETY: types match the kernel; positions lie in the view, targets in `out`; the uploaded
    // arrays are freed only in stream order, after the kernel.
    expect_launch(unsafe { b.launch(launch_cfg(groups)) }, op);
    out
}

/// A copy of `dst` (contiguous result of shape `dst_layout`'s) with `alpha * source` rows added
/// along `dim` at rows `idx`, as the CPU's index_add. `src_view` has the result's shape with
/// stride 0 along `dim`; `src_dim_stride` steps through source rows.
pub(super) fn index_add(
    (dst, dst_layout): (&CudaStorage, &Layout),
    (src, src_view, src_dim_stride): (&CudaStorage, &Layout, usize),
    dim: usize,
    idx: &[usize],
    alpha: f64,
) -> CudaStorage {
    let op = "index_add";
    let n = dst_layout.elem_count();
    let dev = dst.device().clone();
    let dtype = dst.dtype();
    let out = expect_launch(CudaStorage::alloc(&dev, dtype, n), op);
    if n == 0 {
        return out;
    }
    let dim_size = dst_layout.dims()[dim];
    let inner: usize = dst_layout.dims()[dim + 1..].iter().product();
    // Source rows grouped by target row, in index order (a stable counting sort).
    let mut starts = vec![0i64; dim_size + 1];
    idx.iter().for_each(|&j| starts[j + 1] += 1);
    (0..dim_size).for_each(|j| starts[j + 1] += starts[j]);
    let mut next = starts.clone();
    let mut perm = vec![0i64; idx.len().max(1)];
    for (i, &j) in idx.iter().enumerate() {
        perm[next[j] as usize] = i as i64;
        next[j] += 1;
    }
    let (perm, starts) = (upload_i64(&dev, perm, op), upload_i64(&dev, starts, op));
    let f = expect_launch(dev.function(&SOURCE, &format!("index_add_{}", cuda::suffix(dtype))), op);
    let (dv, sv) = (StridedArg::new(dst_layout), StridedArg::new(src_view));
    let (pd, ps, pp, pst, po) = (dst.ptr(), src.ptr(), perm.ptr(), starts.ptr(), out.ptr());
    let (stride, ds, inn, n64) = (src_dim_stride as i64, dim_size as i64, inner as i64, n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&dv).arg(&pd).arg(&sv).arg(&ps).arg(&stride).arg(&pp).arg(&pst).arg(&ds).arg(&inn);
    // The alpha argument has the kernel's compute type (`A` in `index.cu`).
    let (a32, a64, ai) = (alpha as f32, alpha, alpha as i64);
    match dtype {
        DType::F64 => b.arg(&a64),
        DType::F32 | DType::F16 | DType::BF16 => b.arg(&a32),
        _ => b.arg(&ai),
    };
    b.arg(&po).arg(&n64);
    // SAFETY: types match the kernel; every read lies in the views and checked rows; `out`
    // holds n elements; the uploaded arrays are freed only in stream order.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// `ids` (any shape, seen through `ids_layout`) as int64 one-hot rows of `classes` entries.
pub(super) fn one_hot(ids: &CudaStorage, ids_layout: &Layout, classes: usize) -> CudaStorage {
    let op = "one_hot";
    let n = ids_layout.elem_count() * classes;
    let dev = ids.device();
    let out = expect_launch(CudaStorage::alloc(dev, DType::I64, n), op);
    if n == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &format!("one_hot_{}", index_suffix(ids))), op);
    let (iv, pi, c64, po, n64) =
        (StridedArg::new(ids_layout), ids.ptr(), classes as i64, out.ptr(), n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&iv).arg(&pi).arg(&c64).arg(&po).arg(&n64);
    // SAFETY: types match the kernel; the layout lies in `ids`; `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}
