//! The input pass of an image network: a batch of RGB u8 images as the loader hands them over
//! (`[N, H, W, 3]`, not yet flipped) into `[N, 3, H, W]` floats, torchvision's `ToTensor` and
//! `Normalize` with its order of operations in f32, each image mirrored left to right where
//! its flag says (`RandomHorizontalFlip`, decided on the host). On the GPU this moves the
//! conversion off the loader's CPU cores and uploads a quarter of the bytes.

pub(crate) mod cuda;
mod resize;
#[cfg(test)]
mod tests;

pub use resize::CropRegion;

use crate::storage::Storage;
use crate::{DType, Device, Tensor};

/// Per-channel statistics of `Normalize(mean, std)`, applied after scaling to [0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageNorm {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl ImageNorm {
    /// ImageNet's channel statistics, as in torchvision's reference training scripts.
    pub const IMAGENET: ImageNorm = ImageNorm { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };

    /// The value byte `v` of channel `c` becomes: `(v / 255 - mean) / std` in f32.
    pub fn apply(&self, c: usize, v: u8) -> f32 {
        (v as f32 / 255.0 - self.mean[c]) / self.std[c]
    }
}

impl Tensor {
    /// `[N, H, W, 3]` u8 images to `[N, 3, H, W]` of `dtype` (f32, bf16 or f16): each byte
    /// `v` of channel `c` becomes `(v / 255 - mean[c]) / std[c]` computed in f32 and rounded
    /// once to `dtype`, image `n` mirrored left to right when `flips[n]`. The result is
    /// channels-last in memory (a permuted `[N, H, W, 3]`) when `channels_last`, else
    /// contiguous. On the tensor's device.
    pub fn normalize_images(
        &self,
        flips: &[bool],
        norm: ImageNorm,
        dtype: DType,
        channels_last: bool,
    ) -> Tensor {
        let op = "normalize_images";
        assert!(
            self.dtype() == DType::U8 && self.rank() == 4 && self.dims()[3] == 3,
            "{op}: expected [N, H, W, 3] u8 images, got {:?} {}",
            self.dims(),
            self.dtype()
        );
        assert!(
            matches!(dtype, DType::F32 | DType::BF16 | DType::F16),
            "{op}: output dtype {dtype} is not a float type (f32, bf16, f16)"
        );
        let (n, h, w) = (self.dims()[0], self.dims()[1], self.dims()[2]);
        assert_eq!(flips.len(), n, "{op}: {} flip flags for {n} images", flips.len());
        let input = self.contiguous();
        let out_dims = if channels_last { [n, h, w, 3] } else { [n, 3, h, w] };
        let out = match &*input.storage() {
            Storage::Cpu(_) => {
                let values = normalize_cpu(&input.to_vec::<u8>(), flips, [n, h, w], norm, channels_last);
                Tensor::from_vec(values, out_dims, Device::Cpu).expect("a CPU tensor").to_dtype(dtype)
            }
            Storage::Cuda(s) => {
                let flags: Vec<u8> = flips.iter().map(|&f| f as u8).collect();
                // Staged through pinned memory: a plain upload would wait for the stream's
                // queued work (the previous step), leaving the GPU idle while the host catches up.
                let flags = Tensor::from_vec(flags, [n], Device::Cpu)
                    .expect("a CPU tensor")
                    .to_device_non_blocking(self.device())
                    .unwrap_or_else(|e| panic!("{op}: uploading the flip flags: {e}"));
                let storage = match &*flags.storage() {
                    Storage::Cuda(f) => cuda::normalize_images(
                        s,
                        input.layout().offset(),
                        f,
                        [n, h, w],
                        norm,
                        dtype,
                        channels_last,
                    ),
                    Storage::Cpu(_) => unreachable!("{op}: the flags were uploaded to the images' device"),
                };
                Tensor::from_storage(Storage::Cuda(storage), out_dims)
            }
        };
        if channels_last {
            out.permute([0, 3, 1, 2])
        } else {
            out
        }
    }
}

/// The CPU pass, in the output's memory order.
fn normalize_cpu(
    data: &[u8],
    flips: &[bool],
    [n, h, w]: [usize; 3],
    norm: ImageNorm,
    channels_last: bool,
) -> Vec<f32> {
    // The whole conversion is a lookup: one table per channel from byte value to output value.
    let tables: Vec<[f32; 256]> = (0..3).map(|c| std::array::from_fn(|v| norm.apply(c, v as u8))).collect();
    let mut out = vec![0f32; n * h * w * 3];
    for (img, &flip) in flips.iter().enumerate() {
        let src = &data[img * h * w * 3..(img + 1) * h * w * 3];
        let dst = &mut out[img * h * w * 3..(img + 1) * h * w * 3];
        for y in 0..h {
            for x in 0..w {
                let sx = if flip { w - 1 - x } else { x };
                for (c, table) in tables.iter().enumerate() {
                    let v = table[src[(y * w + sx) * 3 + c] as usize];
                    let at = if channels_last { (y * w + x) * 3 + c } else { (c * h + y) * w + x };
                    dst[at] = v;
                }
            }
        }
    }
    out
}
