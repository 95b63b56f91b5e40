//! CUDA dispatch for dtype conversion and strided copies (kernels in `convert.cu`).

use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource, StridedArg};
use crate::{DType, Layout};
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("convert", "src/ops/convert/convert.cu");

fn launch_unary_kernel(
    kernel: &str,
    s: &CudaStorage,
    layout: &Layout,
    out_dtype: DType,
    op: &str,
) -> CudaStorage {
    let n = layout.elem_count();
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, out_dtype, n), op);
    if n == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, kernel), op);
    let (arg, src, dst, n64) = (StridedArg::new(layout), s.ptr(), out.ptr(), n as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&arg).arg(&src).arg(&dst).arg(&n64);
    // SAFETY: types match the kernel; the layout lies inside `s`; `out` holds n elements.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
    out
}

/// The view's elements as `dtype`, contiguous.
pub(crate) fn convert(s: &CudaStorage, layout: &Layout, dtype: DType) -> CudaStorage {
    let size = s.dtype().size_in_bytes() as u64;
    let first = s.ptr() + layout.offset() as u64 * size;
    if s.dtype().is_float() && dtype.is_float() && layout.is_contiguous() && first.is_multiple_of(4 * size) {
        let n = layout.elem_count();
        let out = expect_launch(CudaStorage::alloc(s.device(), dtype, n), "to_dtype");
        if n == 0 {
            return out;
        }
        let kernel = format!("convert_vec_{}_{}", cuda::suffix(s.dtype()), cuda::suffix(dtype));
        let f = expect_launch(s.device().function(&SOURCE, &kernel), "to_dtype");
        let (dst, n64) = (out.ptr(), n as i64);
        let stream = out.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&first).arg(&dst).arg(&n64);
        // SAFETY: n contiguous elements from `first`, aligned to four of them; `out` (a fresh
        // 512-byte-aligned block) holds n.
        expect_launch(unsafe { b.launch(launch_cfg(n.div_ceil(4))) }, "to_dtype");
        return out;
    }
    let kernel = format!("convert_{}_{}", cuda::suffix(s.dtype()), cuda::suffix(dtype));
    launch_unary_kernel(&kernel, s, layout, dtype, "to_dtype")
}

/// The view's elements gathered into a new contiguous storage of the same dtype.
pub(crate) fn copy(s: &CudaStorage, layout: &Layout) -> CudaStorage {
    if layout.is_contiguous() {
        // A plain device-to-device copy: the copy engine's rate, no kernel needed.
        let size = s.dtype().size_in_bytes();
        let out = expect_launch(CudaStorage::alloc(s.device(), s.dtype(), layout.elem_count()), "copy");
        let stream = out.stream();
        let src = s.ptr() + (layout.offset() * size) as u64;
        // SAFETY: the source range lies inside `s`; `out` holds the same number of bytes.
        expect_launch(
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(out.ptr(), src, out.bytes(), stream.cu_stream())
            },
            "copy",
        );
        return out;
    }
    let kernel = format!("copy_b{}", s.dtype().size_in_bytes() * 8);
    launch_unary_kernel(&kernel, s, layout, s.dtype(), "copy")
}
