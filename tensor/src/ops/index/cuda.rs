//! CUDA dispatch for the index ops (kernels in `index.cu`). Indices were checked on the host;
//! gathers read the index tensor on the device. The accumulating ops get their contributions
//! grouped by target on the host (from the indices already read for checking), so each output
//! element is summed by one thread in index order: deterministic, and equal to the CPU result.

use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::storage::CpuStorage;
use crate::{DType, Layout};
use cudarc::driver::PushKernelArg;
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
/// shape both views have.
pub(super) fn gather(
    (src, view, dim_stride): (&CudaStorage, &Layout, usize),
    (ids, ids_view): (&CudaStorage, &Layout),
    op: &str,
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
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&sv).arg(&ps).arg(&stride).arg(&iv).arg(&pi).arg(&po).arg(&n64);
    // SAFETY: types match the kernel; the checked indices keep every read inside `src`, the
    // index view lies inside `ids`, and `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
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
