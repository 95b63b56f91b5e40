//! The image input pass against values worked out by hand and against a naive loop over the
//! definition, on every device.
use super::ImageNorm;
use crate::*;

/// Two 2x3 images whose bytes say where they came from: `10 * (y * 3 + x) + c`, plus 100 for
/// the second image.
fn images(device: Device) -> Tensor {
    let data: Vec<u8> = (0..2u8)
        .flat_map(|n| {
            (0..2u8).flat_map(move |y| {
                (0..3u8).flat_map(move |x| (0..3u8).map(move |c| 100 * n + 10 * (y * 3 + x) + c))
            })
        })
        .collect();
    Tensor::from_vec(data, [2, 2, 3, 3], Device::Cpu).unwrap().to_device(device).unwrap()
}

device_test! {
    fn bytes_land_where_layout_and_flip_say(device: Device) {
        let plain = ImageNorm { mean: [0.0; 3], std: [1.0; 3] };
        let t = images(device).normalize_images(&[false, true], plain, DType::F32, false);
        assert_eq!(t.dims(), &[2, 3, 2, 3]);
        let v = t.to_vec::<f32>();
        let at = |n: usize, c: usize, y: usize, x: usize| (v[((n * 3 + c) * 2 + y) * 3 + x] * 255.0).round() as u32;
        // Image 0 as it is: channel 1 of pixel (y 1, x 2) is byte 10 * 5 + 1.
        assert_eq!(at(0, 1, 1, 2), 51);
        assert_eq!(at(0, 2, 0, 0), 2);
        // Image 1 mirrored: output column 0 is source column 2.
        assert_eq!(at(1, 0, 0, 0), 100 + 20);
        assert_eq!(at(1, 2, 1, 2), 100 + 30 + 2);
        let cl = images(device).normalize_images(&[false, true], plain, DType::F32, true);
        assert_eq!(cl.dims(), &[2, 3, 2, 3]);
        assert_eq!(cl.strides(), &[18, 1, 9, 3], "channels-last in memory");
        assert_eq!(cl.contiguous().to_vec::<f32>(), v);
    }
}

device_test! {
    fn values_are_the_f32_definition_rounded_once(device: Device) {
        let norm = ImageNorm::IMAGENET;
        // 256 pixels of one row: channel c of pixel x is x + c (mod 256), every byte value.
        let row: Vec<u8> = (0..256usize).flat_map(|x| (0..3).map(move |c| ((x + c) % 256) as u8)).collect();
        let t = Tensor::from_vec(row.clone(), [1, 1, 256, 3], Device::Cpu).unwrap().to_device(device).unwrap();
        let want: Vec<f32> = (0..3)
            .flat_map(|c| (0..256).map(move |x| c * 256 + x))
            .map(|i| {
                let (c, x) = (i / 256, i % 256);
                (row[x * 3 + c] as f32 / 255.0 - norm.mean[c]) / norm.std[c]
            })
            .collect();
        let f32_out = t.normalize_images(&[false], norm, DType::F32, false);
        assert_eq!(f32_out.to_vec::<f32>(), want, "bit for bit");
        for dtype in [DType::BF16, DType::F16] {
            let got = t.normalize_images(&[false], norm, dtype, false).to_dtype(DType::F32).to_vec::<f32>();
            let rounded = Tensor::from_vec(want.clone(), [want.len()], Device::Cpu).unwrap().to_dtype(dtype);
            assert_eq!(got, rounded.to_dtype(DType::F32).to_vec::<f32>(), "{dtype}: one rounding of the f32 value");
        }
    }
}

#[test]
#[should_panic(expected = "normalize_images: 1 flip flags for 2 images")]
fn a_flag_per_image() {
    images(Device::Cpu).normalize_images(&[true], ImageNorm::IMAGENET, DType::F32, false);
}
