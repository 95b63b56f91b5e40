//! Crop and resample on the device: the pixel work of `RandomResizedCrop` and of `Resize` +
//! `CenterCrop` for images decoded on the GPU, so that no decoded image comes back to the host.
//! The filter is PIL's antialiased bilinear one, which the CPU path's resizer also uses; the
//! arithmetic (f32, weights normalised once, one rounding at the end) is the kernel's, here in
//! Rust for the CPU device and for tests. It differs from PIL's two-pass fixed point by at most a
//! level or two on a few pixels.

use crate::storage::Storage;
use crate::{DType, Device, Tensor};

/// The part of an image that becomes one output image, in its pixels (fractions allowed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CropRegion {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    /// The filter reads only the region's pixels (torchvision's crop then resize); otherwise
    /// it may read the neighbours of its edges in the whole image (resize then center crop).
    pub clip_to_region: bool,
}

impl CropRegion {
    /// The whole of a `width` x `height` image.
    pub fn whole(width: usize, height: usize) -> CropRegion {
        CropRegion { left: 0.0, top: 0.0, width: width as f64, height: height as f64, clip_to_region: true }
    }
}

/// One image's arguments as the kernel takes them (`CropSource` in image.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct CropSource {
    pub pixels: u64,
    pub width: i32,
    pub height: i32,
    pub x0: i32,
    pub y0: i32,
    pub bound_w: i32,
    pub bound_h: i32,
    pub left: f32,
    pub top: f32,
    pub scale_x: f32,
    pub scale_y: f32,
}

/// The window the filter may read along one axis of `size` pixels: (first, count).
fn bounds(start: f64, extent: f64, size: usize, clip: bool) -> (i32, i32) {
    if !clip {
        return (0, size as i32);
    }
    let first = start.floor().max(0.0) as i32;
    let end = ((start + extent).ceil() as i32).min(size as i32).max(first + 1);
    (first, end - first)
}

impl CropSource {
    pub(crate) fn new(
        pixels: u64,
        (w, h): (usize, usize),
        r: CropRegion,
        (ow, oh): (usize, usize),
    ) -> CropSource {
        let (x0, bound_w) = bounds(r.left, r.width, w, r.clip_to_region);
        let (y0, bound_h) = bounds(r.top, r.height, h, r.clip_to_region);
        CropSource {
            pixels,
            width: w as i32,
            height: h as i32,
            x0,
            y0,
            bound_w,
            bound_h,
            left: (r.left - x0 as f64) as f32,
            top: (r.top - y0 as f64) as f32,
            scale_x: (r.width / ow as f64) as f32,
            scale_y: (r.height / oh as f64) as f32,
        }
    }
}

/// The taps of output coordinate `o` along one axis: (first, count, filter width, center - 0.5).
fn taps(origin: f32, scale: f32, bound: i32, o: usize) -> (i32, i32, f32, f32) {
    let fs = scale.max(1.0);
    let center = origin + (o as f32 + 0.5) * scale;
    let lo = ((center - fs + 0.5) as i32).max(0);
    let hi = ((center + fs + 0.5) as i32).min(bound);
    (lo, hi - lo, fs, center - 0.5)
}

fn weight(k: i32, center_minus_half: f32, fs: f32) -> f32 {
    (1.0 - ((k as f32 - center_minus_half) / fs).abs()).max(0.0)
}

/// One output image from `src` (`[h, w, 3]` bytes), written into `out` (`[oh, ow, 3]`).
pub(crate) fn resize_crop_cpu(src: &[u8], s: &CropSource, (ow, oh): (usize, usize), out: &mut [u8]) {
    for y in 0..oh {
        let (fy, ny, wy_fs, cy) = taps(s.top, s.scale_y, s.bound_h, y);
        for x in 0..ow {
            let (fx, nx, wx_fs, cx) = taps(s.left, s.scale_x, s.bound_w, x);
            let sum_x: f32 = (0..nx).map(|k| weight(fx + k, cx, wx_fs)).sum();
            let (mut acc, mut sum_y) = ([0f32; 3], 0f32);
            for ky in 0..ny {
                let wy = weight(fy + ky, cy, wy_fs);
                sum_y += wy;
                let row = ((s.y0 + fy + ky) as usize * s.width as usize + (s.x0 + fx) as usize) * 3;
                let mut racc = [0f32; 3];
                for kx in 0..nx as usize {
                    let wx = weight(fx + kx as i32, cx, wx_fs);
                    for (c, a) in racc.iter_mut().enumerate() {
                        *a += wx * src[row + kx * 3 + c] as f32;
                    }
                }
                for c in 0..3 {
                    acc[c] += wy * racc[c];
                }
            }
            let norm = 1.0 / (sum_x * sum_y);
            for c in 0..3 {
                out[(y * ow + x) * 3 + c] = (acc[c] * norm + 0.5).floor().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

impl Tensor {
    /// Each `[h_i, w_i, 3]` u8 image's region resampled to `out` (width, height) with the
    /// antialiased bilinear filter, stacked into one `[n, out_h, out_w, 3]` u8 tensor on the
    /// images' device (all on one). On a GPU one kernel does the whole batch on the current
    /// stream; the images may have been made on another (they are kept until it is done).
    pub fn resize_crops(images: &[(&Tensor, CropRegion)], out: (usize, usize)) -> Tensor {
        let op = "resize_crops";
        assert!(!images.is_empty(), "{op}: no images");
        assert!(out.0 > 0 && out.1 > 0, "{op}: output size {out:?} has no pixels");
        let device = images[0].0.device();
        let (ow, oh) = out;
        let mut sources = Vec::with_capacity(images.len());
        let mut inputs = Vec::with_capacity(images.len());
        for (i, (t, r)) in images.iter().enumerate() {
            assert!(
                t.dtype() == DType::U8 && t.rank() == 3 && t.dims()[2] == 3,
                "{op}: image {i} is {:?} {}, not [H, W, 3] u8",
                t.dims(),
                t.dtype()
            );
            assert_eq!(t.device(), device, "{op}: image {i} is on {}, image 0 on {device}", t.device());
            let (h, w) = (t.dims()[0], t.dims()[1]);
            assert!(
                r.width > 0.0
                    && r.height > 0.0
                    && r.left >= 0.0
                    && r.top >= 0.0
                    && r.left + r.width <= w as f64 + 1e-6
                    && r.top + r.height <= h as f64 + 1e-6,
                "{op}: region {r:?} is not inside image {i} of {w}x{h}"
            );
            let t = t.contiguous();
            let ptr = match &*t.storage() {
                Storage::Cuda(s) => s.ptr() + t.layout().offset() as u64,
                Storage::Cpu(_) => 0,
            };
            sources.push(CropSource::new(ptr, (w, h), *r, out));
            inputs.push(t);
        }
        match device {
            Device::Cpu => {
                let per = oh * ow * 3;
                let mut data = vec![0u8; images.len() * per];
                for ((t, s), dst) in inputs.iter().zip(&sources).zip(data.chunks_mut(per)) {
                    resize_crop_cpu(&t.to_vec::<u8>(), s, out, dst);
                }
                Tensor::from_vec(data, [images.len(), oh, ow, 3], Device::Cpu).expect("a CPU tensor")
            }
            Device::Cuda(_) => super::cuda::resize_crops(&inputs, &sources, out),
        }
    }
}
