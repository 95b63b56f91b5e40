//! Resampling with fast_image_resize's convolution resizer and its bilinear filter, the same
//! antialiased filter as PIL's `Image.resize(..., BILINEAR)` that torchvision uses.

use crate::decode::RgbImage;
use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use std::cell::RefCell;

thread_local! {
    // The resizer keeps scratch buffers; one per thread avoids reallocating them per image.
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Where a resize reads from, in source pixels (fractions allowed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SourceRegion {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    /// The filter reads only inside the region, as after torchvision's crop-then-resize
    /// (`resized_crop`); otherwise it may read neighbouring pixels of the whole image, as a
    /// resize of the whole image followed by a crop does (`Resize` then `CenterCrop`).
    pub clip_to_region: bool,
}

/// `region` of `src` resampled to `out` (width, height) pixels.
pub fn resize_region(src: &RgbImage, region: SourceRegion, out: (u32, u32)) -> RgbImage {
    let view = ImageRef::new(src.width, src.height, &src.data, PixelType::U8x3).unwrap_or_else(|e| {
        panic!("resize_region: {}x{} image with {} bytes: {e}", src.width, src.height, src.data.len())
    });
    let mut dst = Image::new(out.0, out.1, PixelType::U8x3);
    let alg = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    let result = RESIZER.with(|r| {
        let mut r = r.borrow_mut();
        if region.clip_to_region {
            // The smallest whole-pixel sub-image holding the region; the filter stops at its edges.
            let x0 = region.left.floor().max(0.0) as u32;
            let y0 = region.top.floor().max(0.0) as u32;
            let x1 = ((region.left + region.width).ceil() as u32).min(src.width).max(x0 + 1);
            let y1 = ((region.top + region.height).ceil() as u32).min(src.height).max(y0 + 1);
            let sub = CroppedImage::new(&view, x0, y0, x1 - x0, y1 - y0).expect("a region inside the image");
            let opts = alg.crop(region.left - x0 as f64, region.top - y0 as f64, region.width, region.height);
            r.resize(&sub, &mut dst, &opts)
        } else {
            r.resize(&view, &mut dst, &alg.crop(region.left, region.top, region.width, region.height))
        }
    });
    result.unwrap_or_else(|e| {
        panic!("resize_region: {region:?} of {}x{} to {out:?}: {e}", src.width, src.height)
    });
    RgbImage { width: out.0, height: out.1, data: dst.into_vec() }
}
