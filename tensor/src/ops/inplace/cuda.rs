//! CUDA dispatch of `copy_` (kernel in `inplace.cu`).

use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::Layout;
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("inplace", "src/ops/inplace/inplace.cu");

/// `dst[dst_layout(i)] = src[src_layout(i)]` on the current stream; same dtype on both sides.
pub(super) fn copy_into(dst: &mut CudaStorage, dst_layout: &Layout, src: &CudaStorage, src_layout: &Layout) {
    let n = dst_layout.elem_count();
    let size = dst.dtype().size_in_bytes();
    let stream = dst.stream();
    if dst_layout.is_contiguous() && src_layout.is_contiguous() {
        // Both gap-free: the copy engine does it at full bandwidth, no kernel needed.
        let to = dst.ptr() + (dst_layout.offset() * size) as u64;
        let from = src.ptr() + (src_layout.offset() * size) as u64;
        // SAFETY: both ranges of n elements lie inside their storages (the layouts say so).
        expect_launch(
            unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, n * size, stream.cu_stream()) },
            "copy_",
        );
        return;
    }
    let f = expect_launch(dst.device().function(&SOURCE, &format!("copy_into_b{}", size * 8)), "copy_");
    let (d, s) = (StridedArg::new(dst_layout), StridedArg::new(src_layout));
    let (inp, out, n64) = (src.ptr(), dst.ptr(), n as i64);
    let mut b = stream.launch_builder(&f);
    b.arg(&d).arg(&s).arg(&inp).arg(&out).arg(&n64);
    // SAFETY: argument types match the kernel; both layouts lie inside their storages.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, "copy_");
}
