//! The last step of every image pipeline: an RGB u8 image into its slot of a batch, flipped or
//! not, as u8 or as f32 (`ToTensor`, optionally followed by `Normalize`), channels first (NCHW,
//! PyTorch's default) or last (NHWC, what channels-last convolutions read).

/// Channel order of a sample in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelLayout {
    /// `[3, H, W]` per sample, `[N, 3, H, W]` per batch.
    Chw,
    /// `[H, W, 3]` per sample, `[N, H, W, 3]` per batch.
    Hwc,
}

/// `transforms.Normalize(mean, std)` after `ToTensor` (values first scaled to [0, 1]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet's channel statistics, as in torchvision's reference training scripts.
    pub const IMAGENET: Normalize = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };
}

/// Element type of the samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PixelOutput {
    /// Raw 0..=255 bytes (normalize on the GPU, a quarter of the upload).
    U8,
    /// `ToTensor` values in [0, 1], then `normalize` if given.
    F32 { normalize: Option<Normalize> },
}

impl PixelOutput {
    pub fn elem_size(&self) -> usize {
        match self {
            PixelOutput::U8 => 1,
            PixelOutput::F32 { .. } => 4,
        }
    }

    /// One table per channel from byte value to output value: the whole conversion is a lookup.
    fn f32_tables(normalize: Option<Normalize>) -> [[f32; 256]; 3] {
        let mut t = [[0f32; 256]; 3];
        for (c, table) in t.iter_mut().enumerate() {
            for (v, out) in table.iter_mut().enumerate() {
                // Same operation order as torch: v / 255, then (x - mean) / std, in f32.
                let x = v as f32 / 255.0;
                *out = match normalize {
                    Some(n) => (x - n.mean[c]) / n.std[c],
                    None => x,
                };
            }
        }
        t
    }
}

/// Writes a `width` x `height` RGB image (`rgb`, row-major HWC) into `out`, which holds exactly
/// one sample of `elem_size() * width * height * 3` bytes (native-endian f32 for F32).
pub fn write_sample(
    rgb: &[u8],
    width: usize,
    height: usize,
    flip: bool,
    pixels: PixelOutput,
    layout: ChannelLayout,
    out: &mut [u8],
) {
    let n = width * height * 3;
    assert_eq!(rgb.len(), n, "write_sample: {width}x{height}x3 image with {} bytes", rgb.len());
    assert_eq!(
        out.len(),
        n * pixels.elem_size(),
        "write_sample: output slot of {} bytes for {width}x{height}x3 {pixels:?}",
        out.len()
    );
    // Source pixel for output pixel x of a row.
    let src_x = |x: usize| if flip { width - 1 - x } else { x };
    match pixels {
        PixelOutput::U8 => match layout {
            ChannelLayout::Hwc => {
                for y in 0..height {
                    let row = &rgb[y * width * 3..(y + 1) * width * 3];
                    let dst = &mut out[y * width * 3..(y + 1) * width * 3];
                    if flip {
                        for x in 0..width {
                            dst[x * 3..x * 3 + 3].copy_from_slice(&row[src_x(x) * 3..src_x(x) * 3 + 3]);
                        }
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
            }
            ChannelLayout::Chw => {
                let plane = width * height;
                for y in 0..height {
                    let row = &rgb[y * width * 3..(y + 1) * width * 3];
                    for x in 0..width {
                        let s = src_x(x) * 3;
                        for c in 0..3 {
                            out[c * plane + y * width + x] = row[s + c];
                        }
                    }
                }
            }
        },
        PixelOutput::F32 { normalize } => {
            let tables = PixelOutput::f32_tables(normalize);
            let out: &mut [f32] = bytemuck::cast_slice_mut(out);
            match layout {
                ChannelLayout::Hwc => {
                    for y in 0..height {
                        let row = &rgb[y * width * 3..(y + 1) * width * 3];
                        let dst = &mut out[y * width * 3..(y + 1) * width * 3];
                        for x in 0..width {
                            let s = src_x(x) * 3;
                            for c in 0..3 {
                                dst[x * 3 + c] = tables[c][row[s + c] as usize];
                            }
                        }
                    }
                }
                ChannelLayout::Chw => {
                    let plane = width * height;
                    let (r, rest) = out.split_at_mut(plane);
                    let (g, b) = rest.split_at_mut(plane);
                    for y in 0..height {
                        let row = &rgb[y * width * 3..(y + 1) * width * 3];
                        let (r, g, b) = (
                            &mut r[y * width..][..width],
                            &mut g[y * width..][..width],
                            &mut b[y * width..][..width],
                        );
                        for x in 0..width {
                            let s = src_x(x) * 3;
                            r[x] = tables[0][row[s] as usize];
                            g[x] = tables[1][row[s + 1] as usize];
                            b[x] = tables[2][row[s + 2] as usize];
                        }
                    }
                }
            }
        }
    }
}
