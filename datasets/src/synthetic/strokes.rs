//! Small grayscale images of four drawn strokes, made in memory from a seed as tensors, for
//! tests that need learnable images without files (the image-folder shapes are in the parent
//! module).
//!
//! Classes: 0 a horizontal bar, 1 a vertical bar, 2 a diagonal line, 3 a hollow square; each at
//! a random place and size, with a random brightness, on a noisy background.

use oxtrain_tensor::{Device, Result, Tensor};

pub const CLASSES: usize = 4;
pub const CLASS_NAMES: [&str; CLASSES] = ["horizontal bar", "vertical bar", "diagonal", "square"];

/// A batch of images `[n, 1, size, size]` (f32, roughly zero mean) and labels `[n]` (i64).
pub struct Shapes {
    pub images: Tensor,
    pub labels: Tensor,
}

/// SplitMix64: tiny, fast and good enough to draw shapes; fixed by the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in lo..hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo) as u64) as usize
    }
}

/// Draws one image of `class` into `px` (`size * size`, row-major).
fn draw(class: usize, size: usize, rng: &mut Rng, px: &mut [f32]) {
    for p in px.iter_mut() {
        *p = 0.3 * rng.unit();
    }
    let ink = 0.6 + 0.4 * rng.unit();
    let mut set = |y: usize, x: usize| px[y * size + x] = ink;
    let len = rng.range(size / 2, size - 1);
    match class {
        0 | 1 => {
            let (along, across) = (rng.range(0, size - len), rng.range(1, size - 2));
            for i in along..along + len {
                for t in across..across + 2 {
                    if class == 0 {
                        set(t, i)
                    } else {
                        set(i, t)
                    }
                }
            }
        }
        2 => {
            let (y0, x0) = (rng.range(0, size - len), rng.range(0, size - len));
            let rising = rng.next() & 1 == 1;
            for i in 0..len {
                let y = if rising { y0 + len - 1 - i } else { y0 + i };
                set(y, x0 + i);
                if x0 + i + 1 < size {
                    set(y, x0 + i + 1);
                }
            }
        }
        _ => {
            let side = rng.range(5, size - 2);
            let (y0, x0) = (rng.range(0, size - side), rng.range(0, size - side));
            for i in 0..side {
                set(y0, x0 + i);
                set(y0 + side - 1, x0 + i);
                set(y0 + i, x0);
                set(y0 + i, x0 + side - 1);
            }
        }
    }
}

/// `n` images of `size x size` with balanced classes, the same for the same seed, on `device`.
pub fn make(n: usize, size: usize, seed: u64, device: Device) -> Result<Shapes> {
    assert!(size >= 8, "shapes: images must be at least 8 pixels wide, got {size}");
    let mut rng = Rng(seed);
    let mut pixels = vec![0f32; n * size * size];
    let mut labels = Vec::with_capacity(n);
    for (i, px) in pixels.chunks_mut(size * size).enumerate() {
        let class = i % CLASSES;
        draw(class, size, &mut rng, px);
        labels.push(class as i64);
    }
    // Centre the pixels: inputs near zero mean train faster.
    pixels.iter_mut().for_each(|p| *p -= 0.3);
    Ok(Shapes {
        images: Tensor::from_vec(pixels, [n, 1, size, size], device)?,
        labels: Tensor::from_vec(labels, [n], device)?,
    })
}
