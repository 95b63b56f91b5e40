use super::*;
use image::codecs::jpeg::JpegEncoder;
use image::ExtendedColorType;

/// A textured test picture: gradients plus a deterministic pattern.
pub(crate) fn picture(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let t = ((x * 7 + y * 13) % 17) as u8 * 4;
            v.extend_from_slice(&[
                (x * 255 / w) as u8 ^ t,
                (y * 255 / h) as u8,
                ((x + y) % 256) as u8 / 2 + t,
            ]);
        }
    }
    v
}

pub(crate) fn jpeg(w: u32, h: u32, quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, quality)
        .encode(&picture(w, h), w, h, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn png(w: u32, h: u32, color: ExtendedColorType, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    image::ImageEncoder::write_image(image::codecs::png::PngEncoder::new(&mut out), data, w, h, color)
        .unwrap();
    out
}

fn p() -> &'static Path {
    Path::new("test.img")
}

#[test]
fn png_decodes_exactly_and_drops_alpha() {
    let rgb = picture(31, 17);
    let got = decode_rgb(&png(31, 17, ExtendedColorType::Rgb8, &rgb), p(), &DecodeLimits::default()).unwrap();
    assert_eq!((got.width, got.height), (31, 17));
    assert_eq!(got.data, rgb);
    let rgba: Vec<u8> = rgb.chunks(3).flat_map(|c| [c[0], c[1], c[2], 77]).collect();
    let got =
        decode_rgb(&png(31, 17, ExtendedColorType::Rgba8, &rgba), p(), &DecodeLimits::default()).unwrap();
    assert_eq!(got.data, rgb);
}

#[test]
fn jpeg_decodes_close_to_its_source() {
    let bytes = jpeg(64, 48, 95);
    assert_eq!(image_dimensions(&bytes, p(), &DecodeLimits::default()).unwrap(), (64, 48));
    let got = decode_rgb(&bytes, p(), &DecodeLimits::default()).unwrap();
    let src = picture(64, 48);
    let mean = got.data.iter().zip(&src).map(|(&a, &b)| (a as i32 - b as i32).abs()).sum::<i32>() as f64
        / src.len() as f64;
    assert!(mean < 8.0, "mean difference {mean} after a quality-95 round trip");
}

#[test]
fn grayscale_jpeg_becomes_rgb() {
    let gray: Vec<u8> = (0..40 * 30).map(|i| (i % 251) as u8).collect();
    let mut bytes = Vec::new();
    JpegEncoder::new_with_quality(&mut bytes, 95).encode(&gray, 40, 30, ExtendedColorType::L8).unwrap();
    for reduction in [1, 2] {
        let got = decode_rgb_reduced(&bytes, p(), &DecodeLimits::default(), reduction).unwrap();
        assert_eq!(got.data.len(), (got.width * got.height * 3) as usize);
        assert!(got.data.chunks(3).all(|c| c[0] == c[1] && c[1] == c[2]));
    }
}

#[test]
fn dct_reduction_keeps_enough_pixels() {
    assert_eq!(dct_reduction((500, 375), (300.0, 250.0), (224, 224)), 1);
    assert_eq!(dct_reduction((500, 375), (460.0, 375.0), (112, 112)), 1);
    assert_eq!(dct_reduction((2000, 1500), (1800.0, 2000.0), (224, 224)), 4);
    assert_eq!(dct_reduction((4000, 3000), (3600.0, 3600.0), (224, 224)), 8);
    assert_eq!(dct_reduction((4000, 3000), (900.0, 3000.0), (224, 224)), 2);
    let bytes = jpeg(400, 240, 90);
    for (reduction, size) in [(2, (200, 120)), (4, (100, 60)), (8, (50, 30))] {
        let got = decode_rgb_reduced(&bytes, p(), &DecodeLimits::default(), reduction).unwrap();
        assert_eq!((got.width, got.height), size, "reduction {reduction}");
    }
}

#[test]
fn limits_reject_large_images_before_decoding() {
    let bytes = jpeg(64, 48, 90);
    let small = DecodeLimits { max_width: 63, ..Default::default() };
    let err = decode_rgb(&bytes, p(), &small).unwrap_err().to_string();
    assert!(err.contains("64x48") && err.contains("limits"), "{err}");
    let few = DecodeLimits { max_pixels: 1000, ..Default::default() };
    assert!(decode_rgb_reduced(&bytes, p(), &few, 2).is_err());
}

/// Every extension an image folder lists decodes: a file it lists but cannot read would be a
/// bad file in every epoch. (TIFF and WebP were listed without their decoders.)
#[test]
fn every_listed_extension_decodes() {
    use crate::image_folder::IMG_EXTENSIONS;
    let (w, h) = (9, 5);
    let rgb = picture(w, h);
    let gray: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
    let encode = |format: image::ImageFormat, data: &[u8], color: ExtendedColorType| {
        let mut out = std::io::Cursor::new(Vec::new());
        image::write_buffer_with_format(&mut out, data, w, h, color, format).unwrap();
        out.into_inner()
    };
    for ext in IMG_EXTENSIONS {
        let (bytes, want) = match ext {
            ".jpg" | ".jpeg" => (jpeg(w, h, 95), None),
            ".png" => (png(w, h, ExtendedColorType::Rgb8, &rgb), Some(rgb.clone())),
            ".bmp" => (encode(image::ImageFormat::Bmp, &rgb, ExtendedColorType::Rgb8), Some(rgb.clone())),
            ".ppm" => (encode(image::ImageFormat::Pnm, &rgb, ExtendedColorType::Rgb8), Some(rgb.clone())),
            ".pgm" => {
                let grey_rgb = gray.iter().flat_map(|&g| [g, g, g]).collect();
                (encode(image::ImageFormat::Pnm, &gray, ExtendedColorType::L8), Some(grey_rgb))
            }
            other => panic!("{other} is listed but this test has no encoder for it"),
        };
        let path = std::path::PathBuf::from(format!("test{ext}"));
        let img = decode_rgb(&bytes, &path, &DecodeLimits::default())
            .unwrap_or_else(|e| panic!("{ext} is listed in IMG_EXTENSIONS but does not decode: {e}"));
        assert_eq!((img.width, img.height), (w, h), "{ext}");
        if let Some(want) = want {
            assert_eq!(img.data, want, "{ext}: lossless formats decode to the same pixels");
        }
    }
}
