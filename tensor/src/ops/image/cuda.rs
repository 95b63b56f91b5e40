//! CUDA dispatch for the image input pass (kernels in `image.cu`).

use super::ImageNorm;
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource};
use crate::DType;
use cudarc::driver::{DeviceRepr, PushKernelArg};

pub(crate) const SOURCE: KernelSource = cuda::source!("image", "src/ops/image/image.cu");

/// `ImageNorm` as the kernel's by-value struct of six floats.
#[repr(C)]
#[derive(Clone, Copy)]
struct NormArg {
    mean: [f32; 3],
    std: [f32; 3],
}

// SAFETY: plain floats, laid out as the kernel's `ImageNorm`.
unsafe impl DeviceRepr for NormArg {}

/// `[n, h, w, 3]` u8 images from element `offset` of `s` (contiguous), flipped where the u8
/// flags in `flips` say, normalised into a new storage of `dtype`.
pub(super) fn normalize_images(
    s: &CudaStorage,
    offset: usize,
    flips: &CudaStorage,
    [n, h, w]: [usize; 3],
    norm: ImageNorm,
    dtype: DType,
    channels_last: bool,
) -> CudaStorage {
    let op = "normalize_images";
    let total = n * h * w * 3;
    let dev = s.device();
    let out = expect_launch(CudaStorage::alloc(dev, dtype, total), op);
    if total == 0 {
        return out;
    }
    let f = expect_launch(dev.function(&SOURCE, &format!("normalize_images_{}", cuda::suffix(dtype))), op);
    let (src, fl, dst) = (s.ptr() + offset as u64, flips.ptr(), out.ptr());
    let (n64, h64, w64, cl) = (n as i64, h as i64, w as i64, channels_last as i32);
    let arg = NormArg { mean: norm.mean, std: norm.std };
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&src).arg(&fl).arg(&dst).arg(&n64).arg(&h64).arg(&w64).arg(&cl).arg(&arg);
    // SAFETY: types match the kernel; `s` holds `total` bytes from `offset`, `flips` n flags,
    // `out` total elements.
    expect_launch(unsafe { b.launch(launch_cfg(total)) }, op);
    out
}
