//! torchvision's image transforms for classification: `RandomResizedCrop` + `RandomHorizontalFlip`
//! for training, `Resize` + `CenterCrop` for evaluation, then `ToTensor` + `Normalize`, fused
//! into one pass per image.
//!
//! An [`ImageTransform`] first makes a [`CropPlan`] from the image's size alone (read from the
//! file header), so the decoder can use JPEG's DCT scaling when the crop has pixels to spare;
//! then [`ImageTransform::apply`] resamples the decoded image and writes the sample.
//!
//! Results match torchvision's PIL path up to the resampler's rounding: the tests compare with
//! fixtures from `fixtures.py` (mean absolute difference below 0.1 of a level, at most 1 level).

mod output;
mod random_resized_crop;
mod resize;
#[cfg(test)]
mod tests;

pub use output::{write_sample, ChannelLayout, Normalize, PixelOutput};
pub use random_resized_crop::{
    center_crop_offsets, random_resized_crop_params, resize_shorter_side, round_half_even, CropBox,
};
pub use resize::{resize_region, SourceRegion};

use crate::decode::{self, DecodeLimits, RgbImage};
use crate::error::Result;
use crate::rng::TransformRng;
use std::path::Path;

/// How the image is cropped and scaled to the output size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Crop {
    /// `RandomResizedCrop(size, scale, ratio)`: size is (width, height).
    RandomResized { size: (u32, u32), scale: (f64, f64), ratio: (f64, f64) },
    /// `Resize(resize)` (shorter side) then `CenterCrop(crop)`: crop is (width, height) and must
    /// fit in the resized image (torchvision would pad).
    ResizeCenterCrop { resize: u32, crop: (u32, u32) },
}

/// A whole per-image pipeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageTransform {
    pub crop: Crop,
    /// Probability of `RandomHorizontalFlip`.
    pub hflip: f64,
    pub pixels: PixelOutput,
    pub layout: ChannelLayout,
    /// Allow decoding JPEGs at 1/2, 1/4 or 1/8 size when the crop still has at least as many
    /// pixels as the output (faster; differs slightly from a full decode).
    pub dct_scaling: bool,
    /// Draw the flip but leave it to the device ([`ImageTransform::load_into`] says which
    /// samples to mirror): with `PixelOutput::U8` and `Hwc`, the GPU flips and normalises.
    pub flip_on_device: bool,
}

impl ImageTransform {
    /// torchvision's ImageNet training transform: `RandomResizedCrop(size)`,
    /// `RandomHorizontalFlip()`, `ToTensor()`, `Normalize(IMAGENET)`, as NCHW f32.
    pub fn imagenet_train(size: u32) -> ImageTransform {
        ImageTransform {
            crop: Crop::RandomResized {
                size: (size, size),
                scale: (0.08, 1.0),
                ratio: (3.0 / 4.0, 4.0 / 3.0),
            },
            hflip: 0.5,
            pixels: PixelOutput::F32 { normalize: Some(Normalize::IMAGENET) },
            layout: ChannelLayout::Chw,
            dct_scaling: true,
            flip_on_device: false,
        }
    }

    /// torchvision's ImageNet evaluation transform: `Resize(resize)`, `CenterCrop(crop)`,
    /// `ToTensor()`, `Normalize(IMAGENET)`, as NCHW f32.
    pub fn imagenet_eval(resize: u32, crop: u32) -> ImageTransform {
        assert!(crop <= resize, "imagenet_eval: crop {crop} larger than the resized shorter side {resize}");
        ImageTransform {
            crop: Crop::ResizeCenterCrop { resize, crop: (crop, crop) },
            hflip: 0.0,
            pixels: PixelOutput::F32 { normalize: Some(Normalize::IMAGENET) },
            layout: ChannelLayout::Chw,
            dct_scaling: true,
            flip_on_device: false,
        }
    }

    /// Raw bytes, channels last, flip drawn but not applied: what the GPU input pass
    /// (`Tensor::normalize_images`) takes.
    pub fn for_device_normalize(self) -> Self {
        ImageTransform { pixels: PixelOutput::U8, layout: ChannelLayout::Hwc, flip_on_device: true, ..self }
    }

    pub fn with_pixels(mut self, pixels: PixelOutput) -> Self {
        self.pixels = pixels;
        self
    }

    pub fn with_layout(mut self, layout: ChannelLayout) -> Self {
        self.layout = layout;
        self
    }

    pub fn with_dct_scaling(mut self, on: bool) -> Self {
        self.dct_scaling = on;
        self
    }

    /// Output (width, height).
    pub fn output_size(&self) -> (u32, u32) {
        match self.crop {
            Crop::RandomResized { size, .. } => size,
            Crop::ResizeCenterCrop { crop, .. } => crop,
        }
    }

    /// Shape of one sample: `[3, H, W]` or `[H, W, 3]`.
    pub fn sample_shape(&self) -> Vec<usize> {
        let (w, h) = self.output_size();
        match self.layout {
            ChannelLayout::Chw => vec![3, h as usize, w as usize],
            ChannelLayout::Hwc => vec![h as usize, w as usize, 3],
        }
    }

    /// Bytes of one sample.
    pub fn sample_bytes(&self) -> usize {
        let (w, h) = self.output_size();
        w as usize * h as usize * 3 * self.pixels.elem_size()
    }

    /// The random choices for an image of `width` x `height`, in torchvision's order of draws
    /// (crop first, then flip).
    pub fn plan(&self, width: u32, height: u32, rng: &mut impl TransformRng) -> CropPlan {
        let (region, out) = match self.crop {
            Crop::RandomResized { size, scale, ratio } => {
                let b = random_resized_crop_params(width, height, scale, ratio, rng);
                let region = SourceRegion {
                    left: b.left as f64,
                    top: b.top as f64,
                    width: b.width as f64,
                    height: b.height as f64,
                    clip_to_region: true,
                };
                (region, size)
            }
            Crop::ResizeCenterCrop { resize, crop } => {
                let (rw, rh) = resize_shorter_side(width, height, resize);
                let (top, left) = center_crop_offsets((rw, rh), crop);
                assert!(
                    top >= 0 && left >= 0,
                    "ResizeCenterCrop: crop {crop:?} larger than the resized {rw}x{rh}"
                );
                // Resizing the whole image then cropping equals resampling the crop's preimage
                // with the whole image's scale, the filter free to read past the crop.
                let (sx, sy) = (width as f64 / rw as f64, height as f64 / rh as f64);
                let region = SourceRegion {
                    left: left as f64 * sx,
                    top: top as f64 * sy,
                    width: crop.0 as f64 * sx,
                    height: crop.1 as f64 * sy,
                    clip_to_region: false,
                };
                (region, crop)
            }
        };
        // torchvision's RandomHorizontalFlip: `torch.rand(1) < p`.
        let flip = self.hflip > 0.0 && rng.uniform(0.0, 1.0) < self.hflip;
        CropPlan { source: (width, height), region, out, flip }
    }

    /// The sample of the image in `bytes` (an encoded file) written into `out`; true when the
    /// device is to mirror it (`flip_on_device` and the flip was drawn).
    pub fn load_into(
        &self,
        bytes: &[u8],
        path: &Path,
        limits: &DecodeLimits,
        rng: &mut impl TransformRng,
        out: &mut [u8],
    ) -> Result<bool> {
        let (w, h) = decode::image_dimensions(bytes, path, limits)?;
        let plan = self.plan(w, h, rng);
        let reduction = if self.dct_scaling { plan.dct_reduction() } else { 1 };
        let img = decode::decode_rgb_reduced(bytes, path, limits, reduction)?;
        self.apply(&img, &plan, out);
        Ok(plan.flip && self.flip_on_device)
    }

    /// Resamples `img` (the planned source, possibly decoded at a reduced size) and writes the
    /// sample into `out`.
    pub fn apply(&self, img: &RgbImage, plan: &CropPlan, out: &mut [u8]) {
        let resized = resize_region(img, plan.region_in(img), plan.out);
        write_sample(
            &resized.data,
            plan.out.0 as usize,
            plan.out.1 as usize,
            plan.flip && !self.flip_on_device,
            self.pixels,
            self.layout,
            out,
        );
    }
}

/// One image's random choices, in the full-size image's pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CropPlan {
    /// The full image's (width, height).
    pub source: (u32, u32),
    pub region: SourceRegion,
    /// Output (width, height).
    pub out: (u32, u32),
    pub flip: bool,
}

impl CropPlan {
    /// How much the JPEG may be reduced while the region keeps at least the output's pixels.
    pub fn dct_reduction(&self) -> u32 {
        decode::dct_reduction(self.source, (self.region.width, self.region.height), self.out)
    }

    /// The region in the pixels of `img`, which is the source decoded at full or reduced size.
    pub fn region_in(&self, img: &RgbImage) -> SourceRegion {
        if (img.width, img.height) == self.source {
            return self.region;
        }
        let sx = img.width as f64 / self.source.0 as f64;
        let sy = img.height as f64 / self.source.1 as f64;
        let r = self.region;
        SourceRegion {
            left: r.left * sx,
            top: r.top * sy,
            width: (r.width * sx).min(img.width as f64 - r.left * sx),
            height: (r.height * sy).min(img.height as f64 - r.top * sy),
            clip_to_region: r.clip_to_region,
        }
    }
}
