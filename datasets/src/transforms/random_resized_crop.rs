//! torchvision's `RandomResizedCrop.get_params`, step for step: up to 10 attempts of a random
//! area fraction and log-uniform aspect ratio, then the center-crop fallback.

use crate::rng::TransformRng;

/// A crop box in source pixels: `(top, left, height, width)`, torchvision's `(i, j, h, w)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    pub top: u32,
    pub left: u32,
    pub height: u32,
    pub width: u32,
}

/// Python's `round` (half to even), which torchvision's integer sizes go through.
pub fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// The crop `RandomResizedCrop(scale, ratio)` takes from a `width` x `height` image.
pub fn random_resized_crop_params(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut impl TransformRng,
) -> CropBox {
    let area = width as f64 * height as f64;
    let log_ratio = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect_ratio = rng.uniform(log_ratio.0, log_ratio.1).exp();
        let w = round_half_even((target_area * aspect_ratio).sqrt()) as i64;
        let h = round_half_even((target_area / aspect_ratio).sqrt()) as i64;
        if 0 < w && w <= width as i64 && 0 < h && h <= height as i64 {
            let i = rng.randint(0, height as i64 - h + 1);
            let j = rng.randint(0, width as i64 - w + 1);
            return CropBox { top: i as u32, left: j as u32, height: h as u32, width: w as u32 };
        }
    }
    // Fallback: the largest central crop whose ratio lies within the bounds.
    let in_ratio = width as f64 / height as f64;
    let min_ratio = ratio.0.min(ratio.1);
    let max_ratio = ratio.0.max(ratio.1);
    let (w, h) = if in_ratio < min_ratio {
        (width, round_half_even(width as f64 / min_ratio) as u32)
    } else if in_ratio > max_ratio {
        (round_half_even(height as f64 * max_ratio) as u32, height)
    } else {
        (width, height)
    };
    CropBox { top: (height - h) / 2, left: (width - w) / 2, height: h, width: w }
}

/// torchvision's `Resize(size)` output for an int `size`: the shorter side becomes `size`, the
/// longer one `int(size * long / short)`. Returns (width, height).
pub fn resize_shorter_side(width: u32, height: u32, size: u32) -> (u32, u32) {
    let (short, long) = if width <= height { (width, height) } else { (height, width) };
    let new_long = (size as f64 * long as f64 / short as f64) as u32;
    if width <= height {
        (size, new_long)
    } else {
        (new_long, size)
    }
}

/// torchvision's `CenterCrop` offsets (top, left) of a `crop` (width, height) in an image of
/// `size` (width, height); Python's rounding of half the margin.
pub fn center_crop_offsets(size: (u32, u32), crop: (u32, u32)) -> (i64, i64) {
    let top = round_half_even((size.1 as f64 - crop.1 as f64) / 2.0) as i64;
    let left = round_half_even((size.0 as f64 - crop.0 as f64) / 2.0) as i64;
    (top, left)
}
