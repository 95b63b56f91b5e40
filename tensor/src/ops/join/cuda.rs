//! CUDA dispatch for `cat` (kernels in `join.cu`): one launch per part, each copying the part's
//! strided view into its columns of the output rows.

use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::Layout;
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("join", "src/ops/join/join.cu");

/// The parts (all of one dtype and device, shapes checked) joined along `dim`, contiguous.
pub(super) fn cat(parts: &[(&CudaStorage, &Layout)], dim: usize) -> CudaStorage {
    let op = "cat";
    let (first, first_layout) = parts[0];
    let outer: usize = first_layout.dims()[..dim].iter().product();
    let part_rows: Vec<usize> = parts.iter().map(|(_, l)| l.dims()[dim..].iter().product()).collect();
    let row_len: usize = part_rows.iter().sum();
    let dev = first.device();
    let out = expect_launch(CudaStorage::alloc(dev, first.dtype(), outer * row_len), op);
    if outer * row_len == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &format!("cat_b{}", first.dtype().size_in_bytes() * 8)), op);
    let stream = out.stream();
    let mut at = 0;
    for ((s, layout), &part_row) in parts.iter().zip(&part_rows) {
        let n = outer * part_row;
        if n > 0 {
            let (arg, src, dst) = (StridedArg::new(layout), s.ptr(), out.ptr());
            let (n64, pr, rl, at64) = (n as i64, part_row as i64, row_len as i64, at as i64);
            let mut b = stream.launch_builder(&f);
            b.arg(&arg).arg(&src).arg(&dst).arg(&n64).arg(&pr).arg(&rl).arg(&at64);
            // SAFETY: types match the kernel; the layout lies inside `s`; the part's columns
            // `at..at + part_row` of the `outer` rows lie inside `out`.
            expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
        }
        at += part_row;
    }
    out
}
