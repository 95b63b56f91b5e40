//! The image input pass against values worked out by hand and against a naive loop over the
//! definition, on every device.
use super::{CropRegion, ImageNorm};
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

/// A `[h, w, 3]` image with smooth gradients and a hard edge, different per channel.
fn picture(w: usize, h: usize, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let edge = if (x * 7 + y * 3 + seed as usize) % 29 < 13 { 60 } else { 0 };
            v.push(((x * 255 / w.max(1)) as u32 / 2 + edge) as u8);
            v.push(((y * 255 / h.max(1)) as u32 / 2 + edge / 2) as u8);
            v.push(((x + y + seed as usize) % 200) as u8);
        }
    }
    v
}

fn on(device: Device, data: Vec<u8>, w: usize, h: usize) -> Tensor {
    Tensor::from_vec(data, [h, w, 3], Device::Cpu).unwrap().to_device(device).unwrap()
}

device_test! {
    fn resizing_a_whole_image_to_its_own_size_copies_it(device: Device) {
        let data = picture(13, 9, 1);
        let t = on(device, data.clone(), 13, 9);
        let out = Tensor::resize_crops(&[(&t, CropRegion::whole(13, 9))], (13, 9));
        assert_eq!(out.dims(), &[1, 9, 13, 3]);
        assert_eq!(out.to_vec::<u8>(), data);
    }
}

device_test! {
    fn a_flat_image_stays_flat_at_every_scale(device: Device) {
        let t = on(device, [17u8, 130, 250].repeat(40 * 30), 40, 30);
        let regions = [
            CropRegion { left: 3.0, top: 2.0, width: 31.0, height: 17.0, clip_to_region: true },
            CropRegion { left: 0.5, top: 1.25, width: 7.5, height: 9.0, clip_to_region: false },
        ];
        for r in regions {
            for out in [(8, 8), (24, 5), (64, 48)] {
                let v = Tensor::resize_crops(&[(&t, r)], out).to_vec::<u8>();
                assert!(v.chunks(3).all(|p| p == [17, 130, 250]), "{r:?} to {out:?}");
            }
        }
    }
}

device_test! {
    fn a_downscale_by_two_averages_the_pixels_under_each_output_pixel(device: Device) {
        // Halving a width: output x covers source columns 2x and 2x + 1 fully and, with the
        // triangle of support 2, a quarter of each neighbour ((1/4, 3/4, 3/4, 1/4) / 2).
        let (w, h) = (8usize, 1usize);
        let data: Vec<u8> = (0..w).flat_map(|x| [(x * 20) as u8, 0, 0]).collect();
        let t = on(device, data.clone(), w, h);
        let v = Tensor::resize_crops(&[(&t, CropRegion::whole(w, h))], (4, 1)).to_vec::<u8>();
        let naive = |x: usize| -> u8 {
            let taps = [(2 * x as i64 - 1, 0.25), (2 * x as i64, 0.75), (2 * x as i64 + 1, 0.75), (2 * x as i64 + 2, 0.25)];
            let (mut acc, mut sum) = (0.0f64, 0.0f64);
            for (k, wt) in taps.into_iter().filter(|(k, _)| (0..w as i64).contains(k)) {
                acc += wt * data[k as usize * 3] as f64;
                sum += wt;
            }
            (acc / sum + 0.5).floor() as u8
        };
        let want: Vec<u8> = (0..4).map(naive).collect();
        assert_eq!(v.chunks(3).map(|p| p[0]).collect::<Vec<_>>(), want);
    }
}

device_test! {
    fn every_image_of_a_batch_keeps_its_own_region_and_the_gpu_agrees_with_the_cpu(device: Device) {
        let sizes = [(50usize, 37usize), (23, 41), (64, 64)];
        let images: Vec<(Vec<u8>, usize, usize)> =
            sizes.iter().enumerate().map(|(i, &(w, h))| (picture(w, h, i as u32), w, h)).collect();
        let regions = [
            CropRegion { left: 4.0, top: 3.0, width: 40.0, height: 30.0, clip_to_region: true },
            CropRegion { left: 0.0, top: 10.0, width: 23.0, height: 12.0, clip_to_region: true },
            CropRegion { left: 7.3, top: 7.3, width: 49.4, height: 49.4, clip_to_region: false },
        ];
        let tensors: Vec<Tensor> = images.iter().map(|(d, w, h)| on(device, d.clone(), *w, *h)).collect();
        let batch: Vec<(&Tensor, CropRegion)> = tensors.iter().zip(regions).collect();
        let out = Tensor::resize_crops(&batch, (16, 12));
        assert_eq!(out.dims(), &[3, 12, 16, 3]);
        let got = out.to_vec::<u8>();
        for (i, ((d, w, h), r)) in images.iter().zip(regions).enumerate() {
            let one = on(Device::Cpu, d.clone(), *w, *h);
            let want = Tensor::resize_crops(&[(&one, r)], (16, 12)).to_vec::<u8>();
            let part = &got[i * 16 * 12 * 3..(i + 1) * 16 * 12 * 3];
            let worst = part.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            assert!(worst <= 1, "image {i}: differs from the CPU's arithmetic by {worst} levels");
        }
    }
}
