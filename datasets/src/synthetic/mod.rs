//! A synthetic image folder of drawn shapes, for the built-in example and the tests: real JPEG
//! and PNG files in torchvision's `ImageFolder` layout, with a random position, size and colour
//! for each shape on a noisy background, so a small network has something to learn.

pub mod strokes;

use crate::error::{Error, Result};
use crate::rng::SampleRng;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};
use std::path::{Path, PathBuf};

/// The shape classes, in the order `classes` counts them.
pub const SHAPES: [&str; 6] = ["circle", "square", "triangle", "cross", "ring", "diamond"];

/// Whether pixel (x, y) lies in `shape` centred at (cx, cy) with radius r.
fn inside(shape: &str, x: f64, y: f64, cx: f64, cy: f64, r: f64) -> bool {
    let (dx, dy) = (x - cx, y - cy);
    match shape {
        "circle" => dx * dx + dy * dy <= r * r,
        "square" => dx.abs() <= r * 0.8 && dy.abs() <= r * 0.8,
        // Apex up, base at cy + r/2.
        "triangle" => dy <= r * 0.5 && dy >= -r && dx.abs() <= (dy + r) * 0.58,
        "cross" => (dx.abs() <= r * 0.25 && dy.abs() <= r) || (dy.abs() <= r * 0.25 && dx.abs() <= r),
        "ring" => {
            let d2 = dx * dx + dy * dy;
            d2 <= r * r && d2 >= (r * 0.6) * (r * 0.6)
        }
        "diamond" => dx.abs() + dy.abs() <= r,
        other => panic!("synthetic: unknown shape {other}"),
    }
}

/// One `size` x `size` RGB picture of `shape`.
pub fn draw_shape(shape: &str, size: u32, rng: &mut SampleRng) -> Vec<u8> {
    let s = size as f64;
    // Shapes fill a good part of the picture, so a small network tells them apart in a few
    // epochs even at 32 pixels (the built-in example's size).
    let r = s * (0.26 + 0.14 * rng.next_f64());
    let cx = r + (s - 2.0 * r) * rng.next_f64();
    let cy = r + (s - 2.0 * r) * rng.next_f64();
    let bg: [f64; 3] = [rng.next_f64() * 255.0, rng.next_f64() * 255.0, rng.next_f64() * 255.0];
    // A shape colour far enough from the background to be seen.
    let fg: [f64; 3] = std::array::from_fn(|c| (bg[c] + 96.0 + rng.next_f64() * 64.0) % 256.0);
    let mut data = Vec::with_capacity((size * size * 3) as usize);
    for y in 0..size {
        for x in 0..size {
            let on = inside(shape, x as f64 + 0.5, y as f64 + 0.5, cx, cy, r);
            for c in 0..3 {
                let noise = (rng.next_f64() - 0.5) * 40.0;
                let base = if on { fg[c] } else { bg[c] };
                data.push((base + noise).clamp(0.0, 255.0) as u8);
            }
        }
    }
    data
}

/// Writes `per_class` pictures of each of the first `classes` shapes ([`SHAPES`]) into
/// `root/<shape>/<n>.jpg` (every fourth one `.png`), `size` pixels square, drawn from `seed`.
/// Returns the class names (sorted, as `ImageFolder` will index them).
pub fn write_shapes_image_folder(
    root: impl AsRef<Path>,
    classes: usize,
    per_class: usize,
    size: u32,
    seed: u64,
) -> Result<Vec<String>> {
    let root = root.as_ref();
    assert!(
        (1..=SHAPES.len()).contains(&classes),
        "write_shapes_image_folder: 1 to {} classes, not {classes}",
        SHAPES.len()
    );
    assert!(size >= 8, "write_shapes_image_folder: size {size} is too small to draw on");
    let mut names: Vec<String> = SHAPES[..classes].iter().map(|s| s.to_string()).collect();
    for (k, shape) in SHAPES[..classes].iter().enumerate() {
        let dir = root.join(shape);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        for n in 0..per_class {
            let mut rng = SampleRng::new(seed, k as u64, n as u64);
            let data = draw_shape(shape, size, &mut rng);
            let png = n % 4 == 3;
            let path: PathBuf = dir.join(format!("{n:05}.{}", if png { "png" } else { "jpg" }));
            let mut bytes = Vec::new();
            let encoded = if png {
                PngEncoder::new(&mut bytes).write_image(&data, size, size, ExtendedColorType::Rgb8)
            } else {
                JpegEncoder::new_with_quality(&mut bytes, 90).write_image(
                    &data,
                    size,
                    size,
                    ExtendedColorType::Rgb8,
                )
            };
            encoded.map_err(|e| Error::bad_image(&path, format!("encoding: {e}")))?;
            std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
        }
    }
    names.sort();
    Ok(names)
}
