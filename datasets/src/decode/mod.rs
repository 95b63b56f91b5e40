//! Image files to RGB pixels: JPEG through zune-jpeg (full size) or jpeg-decoder (DCT-scaled to
//! 1/2, 1/4 or 1/8 when the crop still has enough pixels), everything else through `image`.
//! Every size is checked against [`DecodeLimits`] from the header before any pixel memory is
//! allocated, so a file that declares enormous dimensions fails fast instead of exhausting memory.

use crate::error::{Error, Result};
use std::io::Cursor;
use std::path::Path;

#[cfg(test)]
mod tests;

/// The largest image a decoder may produce; larger files are bad files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    pub max_width: u32,
    pub max_height: u32,
    /// Width times height.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    /// 16384 on a side and 100 megapixels: far above any ImageNet photo (the largest are about
    /// 5000x4000), far below what would exhaust a machine's memory (300 MB of RGB per image).
    fn default() -> Self {
        DecodeLimits { max_width: 16384, max_height: 16384, max_pixels: 100_000_000 }
    }
}

impl DecodeLimits {
    fn check(&self, path: &Path, width: u32, height: u32) -> Result<()> {
        if width == 0 || height == 0 {
            return Err(Error::bad_image(path, format!("declares an empty size {width}x{height}")));
        }
        if width > self.max_width
            || height > self.max_height
            || width as u64 * height as u64 > self.max_pixels
        {
            return Err(Error::bad_image(
                path,
                format!(
                    "declares {width}x{height} pixels, over the limits ({}x{}, {} pixels); raise \
                     DecodeLimits if such images are expected",
                    self.max_width, self.max_height, self.max_pixels
                ),
            ));
        }
        Ok(())
    }
}

/// An 8-bit RGB image, rows top to bottom, pixels as R, G, B bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Jpeg,
    Other,
}

fn sniff(bytes: &[u8]) -> Format {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Format::Jpeg
    } else {
        Format::Other
    }
}

fn zune_decoder<'a>(
    bytes: &'a [u8],
    limits: &DecodeLimits,
) -> zune_jpeg::JpegDecoder<zune_core::bytestream::ZCursor<&'a [u8]>> {
    let options = zune_core::options::DecoderOptions::default()
        .jpeg_set_out_colorspace(zune_core::colorspace::ColorSpace::RGB)
        .set_max_width(limits.max_width as usize)
        .set_max_height(limits.max_height as usize);
    zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(bytes), options)
}

fn image_reader<'a>(
    bytes: &'a [u8],
    path: &Path,
    limits: &DecodeLimits,
) -> Result<image::ImageReader<Cursor<&'a [u8]>>> {
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Error::bad_image(path, e.to_string()))?;
    if reader.format().is_none() {
        return Err(Error::bad_image(path, "not an image this loader can read (JPEG, PNG, BMP, PPM, PGM)"));
    }
    let mut l = image::Limits::default();
    l.max_image_width = Some(limits.max_width);
    l.max_image_height = Some(limits.max_height);
    l.max_alloc = Some(limits.max_pixels * 4 + (64 << 20));
    reader.limits(l);
    Ok(reader)
}

/// Width and height from the file's header, checked against `limits`; no pixels are decoded.
pub fn image_dimensions(bytes: &[u8], path: &Path, limits: &DecodeLimits) -> Result<(u32, u32)> {
    if bytes.is_empty() {
        return Err(Error::bad_image(path, "the file is empty"));
    }
    let (w, h) = match sniff(bytes) {
        Format::Jpeg => {
            // The header alone allocates nothing; our own check below gives the one message.
            let mut d = zune_decoder(
                bytes,
                &DecodeLimits { max_width: u32::MAX, max_height: u32::MAX, max_pixels: u64::MAX },
            );
            d.decode_headers().map_err(|e| Error::bad_image(path, format!("JPEG header: {e:?}")))?;
            let (w, h) = d.dimensions().ok_or_else(|| Error::bad_image(path, "JPEG without a size"))?;
            (w as u32, h as u32)
        }
        Format::Other => image_reader(bytes, path, limits)?
            .into_dimensions()
            .map_err(|e| Error::bad_image(path, e.to_string()))?,
    };
    limits.check(path, w, h)?;
    Ok((w, h))
}

/// Whether a JPEG's last scan is followed by an end-of-image marker. zune-jpeg (like libjpeg)
/// fills a truncated scan with grey and reports success; PIL refuses such files ("image file is
/// truncated"), and so does this loader. Inside entropy-coded data 0xFF is always followed by
/// 0x00 or a restart marker, so the bytes FF D9 and FF DA there are real markers; an EXIF
/// thumbnail's end marker sits before the main image's scans and does not count.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    // Searched from the end, so a complete file costs a few bytes of scanning.
    let Some(eoi) = bytes.windows(2).rposition(|w| w == [0xFF, 0xD9]) else { return false };
    !bytes[eoi..].windows(2).any(|w| w == [0xFF, 0xDA])
}

/// The whole image at full size.
pub fn decode_rgb(bytes: &[u8], path: &Path, limits: &DecodeLimits) -> Result<RgbImage> {
    let (width, height) = image_dimensions(bytes, path, limits)?;
    let data = match sniff(bytes) {
        Format::Jpeg => {
            if !jpeg_is_complete(bytes) {
                return Err(Error::bad_image(
                    path,
                    "the JPEG is truncated (no end-of-image marker after its last scan)",
                ));
            }
            let mut d = zune_decoder(bytes, limits);
            let data = d.decode().map_err(|e| Error::bad_image(path, format!("JPEG data: {e:?}")))?;
            let (w, h) = d.dimensions().ok_or_else(|| Error::bad_image(path, "JPEG without a size"))?;
            if (w as u32, h as u32) != (width, height) || data.len() != w * h * 3 {
                return Err(Error::bad_image(path, "JPEG decoded to an unexpected size"));
            }
            data
        }
        Format::Other => {
            let img = image_reader(bytes, path, limits)?
                .decode()
                .map_err(|e| Error::bad_image(path, e.to_string()))?;
            img.into_rgb8().into_raw()
        }
    };
    Ok(RgbImage { width, height, data })
}

/// How much larger than the output a DCT-reduced decode must stay: PIL's `reducing_gap = 2`
/// (what its `thumbnail` uses with JPEG draft mode). The reduced IDCT averages like a box
/// filter; keeping twice the output's pixels leaves most of the smoothing to the bilinear
/// antialias filter, so the result stays close to torchvision's full decode (see the tests).
pub const REDUCING_GAP: f64 = 2.0;

/// The largest DCT reduction (1, 2, 4 or 8) of a JPEG of `full` size that keeps a region of
/// `region` (width, height) source pixels at least [`REDUCING_GAP`] times `need` (width,
/// height) pixels large.
pub fn dct_reduction(full: (u32, u32), region: (f64, f64), need: (u32, u32)) -> u32 {
    let mut s = 1;
    for cand in [2u32, 4, 8] {
        // Scaled sizes round up (ceil(W * k / 8)), so a region shrinks by at most `cand`.
        let c = cand as f64;
        let fits =
            region.0 / c >= REDUCING_GAP * need.0 as f64 && region.1 / c >= REDUCING_GAP * need.1 as f64;
        if fits && full.0 / cand >= 1 && full.1 / cand >= 1 {
            s = cand;
        }
    }
    s
}

/// The image decoded at a reduced size `1/reduction` when it is a JPEG and `reduction > 1`
/// (jpeg-decoder's DCT scaling), else at full size. The result's size tells the real scale.
pub fn decode_rgb_reduced(
    bytes: &[u8],
    path: &Path,
    limits: &DecodeLimits,
    reduction: u32,
) -> Result<RgbImage> {
    if reduction <= 1 || sniff(bytes) != Format::Jpeg {
        return decode_rgb(bytes, path, limits);
    }
    let (width, height) = image_dimensions(bytes, path, limits)?;
    if !jpeg_is_complete(bytes) {
        return Err(Error::bad_image(
            path,
            "the JPEG is truncated (no end-of-image marker after its last scan)",
        ));
    }
    let mut d = jpeg_decoder::Decoder::new(Cursor::new(bytes));
    d.set_max_decoding_buffer_size(limits.max_pixels as usize * 4);
    d.read_info().map_err(|e| Error::bad_image(path, format!("JPEG header: {e}")))?;
    let want = (width.div_ceil(reduction), height.div_ceil(reduction));
    let (w, h) = d
        .scale(want.0.min(u16::MAX as u32) as u16, want.1.min(u16::MAX as u32) as u16)
        .map_err(|e| Error::bad_image(path, format!("JPEG scaling: {e}")))?;
    let raw = d.decode().map_err(|e| Error::bad_image(path, format!("JPEG data: {e}")))?;
    let info = d.info().ok_or_else(|| Error::bad_image(path, "JPEG without a header"))?;
    let (w, h) = (w as u32, h as u32);
    let n = w as usize * h as usize;
    use jpeg_decoder::PixelFormat as P;
    let data = match info.pixel_format {
        P::RGB24 if raw.len() == n * 3 => raw,
        P::L8 if raw.len() == n => raw.iter().flat_map(|&v| [v, v, v]).collect(),
        // Adobe CMYK JPEGs store inverted ink, so on the stored values R = C * K / 255.
        P::CMYK32 if raw.len() == n * 4 => raw
            .chunks_exact(4)
            .flat_map(|p| {
                let k = p[3] as u32;
                [(p[0] as u32 * k / 255) as u8, (p[1] as u32 * k / 255) as u8, (p[2] as u32 * k / 255) as u8]
            })
            .collect(),
        // 16-bit lossless JPEGs are rare; the full-size path handles them.
        _ => return decode_rgb(bytes, path, limits),
    };
    Ok(RgbImage { width: w, height: h, data })
}

/// Reads a file, with an error naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}
