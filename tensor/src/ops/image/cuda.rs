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

// SAFETY: integers and floats laid out as the kernel's `CropSource`.
unsafe impl DeviceRepr for super::resize::CropSource {}

/// The kernel `resize_crops` over `inputs` (contiguous `[h, w, 3]` u8 device images, described
/// by `sources`) into a new `[n, oh, ow, 3]` u8 tensor, on the current stream.
pub(super) fn resize_crops(
    inputs: &[crate::Tensor],
    sources: &[super::resize::CropSource],
    (ow, oh): (usize, usize),
) -> crate::Tensor {
    use crate::storage::Storage;
    let op = "resize_crops";
    let n = sources.len();
    let device = inputs[0].device();
    let bytes: Vec<u8> = sources.iter().flat_map(|s| bytemuck_bytes(s).to_vec()).collect();
    let table = crate::Tensor::from_vec(bytes, [std::mem::size_of_val(sources)], crate::Device::Cpu)
        .expect("a CPU tensor")
        .to_device_non_blocking(device)
        .unwrap_or_else(|e| panic!("{op}: uploading the crop table: {e}"));
    let (table_ptr, dev) = match &*table.storage() {
        Storage::Cuda(t) => (t.ptr(), t.device().clone()),
        Storage::Cpu(_) => unreachable!("{op}: the table was uploaded to {device}"),
    };
    let total = n * oh * ow * 3;
    let out = expect_launch(CudaStorage::alloc(&dev, DType::U8, total), op);
    let f = expect_launch(dev.function(&SOURCE, "resize_crops"), op);
    let (src, dst) = (table_ptr, out.ptr());
    let (n64, oh64, ow64) = (n as i64, oh as i64, ow as i64);
    let stream = out.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&src).arg(&dst).arg(&n64).arg(&oh64).arg(&ow64);
    // SAFETY: the table holds n `CropSource`s whose pointers address live images of the sizes
    // they state; `out` holds n * oh * ow * 3 bytes.
    expect_launch(unsafe { b.launch(launch_cfg(n * oh * ow)) }, op);
    // The images (and the table) may come from other streams: keep them until the kernel is done.
    if let crate::Device::Cuda(ordinal) = device {
        if let Ok(current) = cuda::Stream::current(ordinal) {
            for t in inputs.iter().chain(std::iter::once(&table)) {
                t.record_stream(&current);
            }
        }
    }
    crate::Tensor::from_storage(Storage::Cuda(out), [n, oh, ow, 3])
}

/// The bytes of a plain `repr(C)` value.
fn bytemuck_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: `T` is a plain repr(C) struct of integers and floats without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}
