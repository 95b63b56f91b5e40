//! Tests of max pooling with window offsets (`offsets.rs`): the maxima and offsets against
//! the naive f64 loop of `tests.rs` (offsets worked out from its flat indices), the gradient
//! against the flat-index gradient bit for bit and against a naive scatter, on NCHW, strided
//! and channels-last inputs whose channels are and are not whole 16-byte vectors.

use super::tests::{as_tensor, channels_last, naive_max, random, Params};
use crate::testing::{assert_close, tolerance};
use crate::{device_test, DType, Tensor};

/// The offset inside window (r, c) of the element at flat index `at` of a `width`-wide plane.
fn expected_offset(at: i64, (r, c): (usize, usize), width: usize, p: &Params) -> u8 {
    let (h, w) = (at as usize / width, at as usize % width);
    let ki = (h as i64 - (r * p.stride[0]) as i64 + p.padding[0] as i64) / p.dilation[0] as i64;
    let kj = (w as i64 - (c * p.stride[1]) as i64 + p.padding[1] as i64) / p.dilation[1] as i64;
    assert!(ki >= 0 && kj >= 0, "flat index {at} lies before window ({r}, {c})");
    (ki * p.kernel[1] as i64 + kj) as u8
}

/// Pooling configurations: the ResNet stem's first, then ceil mode, dilation, odd strides.
fn configs() -> Vec<Params> {
    let raw = [
        ([3, 3], [2, 2], [1, 1], [1, 1], false),
        ([3, 3], [2, 2], [1, 1], [1, 1], true),
        ([2, 3], [3, 1], [1, 0], [2, 1], true),
        ([4, 2], [1, 3], [2, 1], [1, 3], false),
        ([5, 5], [2, 3], [2, 2], [2, 1], true),
        ([2, 2], [2, 2], [0, 0], [1, 1], false),
    ];
    raw.iter()
        .map(|&(kernel, stride, padding, dilation, ceil)| Params { kernel, stride, padding, dilation, ceil })
        .collect()
}

/// Runs `max_pool2d_with_offsets` and its backward on `x` (NCHW values `xs` in `dtype`) and
/// checks them against the loops and the flat-index ops.
fn check_offsets(x: &Tensor, p: &Params, dtype: DType, seed: u64, what: &str) {
    let dims = x.dims().to_vec();
    let planes: usize = dims[..dims.len() - 2].iter().product();
    let hw = [dims[dims.len() - 2], dims[dims.len() - 1]];
    let (k, s, pad, d) = (p.kernel, p.stride, p.padding, p.dilation);
    let (want_v, want_i, out) = naive_max(&x.to_f64_vec(), planes, hw, p);
    let (v, off) = x.max_pool2d_with_offsets(k, s, pad, d, p.ceil);
    assert_eq!(v.dtype(), dtype, "{what}: values dtype");
    assert_eq!(off.dtype(), DType::U8, "{what}: offsets dtype");
    assert_eq!(v.to_f64_vec(), want_v, "{what}: maxima");
    let want_off: Vec<u8> = want_i
        .iter()
        .enumerate()
        .map(|(i, &at)| expected_offset(at, (i / out[1] % out[0], i % out[1]), hw[1], p))
        .collect();
    assert_eq!(off.to_vec::<u8>(), want_off, "{what}: offsets");
    let nhwc = x.device().is_cuda() && x.rank() == 4 && x.layout().strides()[1] == 1;
    if nhwc {
        assert_eq!(v.layout().strides()[1], 1, "{what}: maxima stay channels-last");
        assert_eq!(off.layout().strides()[1], 1, "{what}: offsets channels-last");
    }
    // The gradient: the same sums as the flat-index gradient, and the definition's scatter.
    let g = as_tensor(random(v.elem_count(), seed), v.dims().to_vec(), x.device()).to_dtype(dtype);
    let g = if nhwc { channels_last(&g) } else { g };
    let got = g.max_pool2d_with_offsets_backward(&off, dims.clone(), k, s, pad, d, p.ceil);
    let (_, idx) = x.max_pool2d(k, s, pad, d, p.ceil);
    let by_index = g.max_pool2d_with_indices_backward(&idx, dims.clone(), k, s, pad, d, p.ceil);
    assert_eq!(got.to_f64_vec(), by_index.to_f64_vec(), "{what}: gradient against the flat-index one");
    let mut want_g = vec![0.0; planes * hw[0] * hw[1]];
    for (o, (&gv, &at)) in g.to_f64_vec().iter().zip(&want_i).enumerate() {
        want_g[o / (out[0] * out[1]) * hw[0] * hw[1] + at as usize] += gv;
    }
    let (rtol, atol) = tolerance(dtype);
    assert_close(&got, &as_tensor(want_g, dims, x.device()), rtol, atol, &format!("{what}: gradient"));
    if nhwc {
        assert_eq!(got.layout().strides()[1], 1, "{what}: the gradient stays channels-last");
    }
}

device_test! {
    fn max_pool_offsets_match_loops_and_flat_indices(dev: Device) {
        // (dims, channels-last): channels of whole 16-byte vectors for every dtype (16, 24),
        // for f32 only (12), for none (5); NCHW past the parallel threshold; unbatched.
        let shapes: [(&[usize], bool); 6] = [
            (&[2, 16, 17, 14], true),
            (&[3, 24, 9, 10], true),
            (&[2, 12, 11, 9], true),
            (&[2, 5, 7, 9], true),
            (&[2, 8, 45, 40], false),
            (&[3, 11, 13], false),
        ];
        for (i, &(dims, cl)) in shapes.iter().enumerate() {
            let xs = random(dims.iter().product(), 30 + i as u64);
            for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
                let x = as_tensor(xs.clone(), dims.to_vec(), dev).to_dtype(dtype);
                let x = if cl { channels_last(&x) } else { x };
                for (j, p) in configs().iter().enumerate() {
                    let what = format!("{dims:?} channels-last {cl} {dtype} config {j}");
                    check_offsets(&x, p, dtype, 60 + j as u64, &what);
                }
            }
        }
        // A strided view (narrowed in every dim) pools like its copy.
        let base = as_tensor(random(2 * 5 * 12 * 11, 4), vec![2, 5, 12, 11], dev).to_dtype(DType::F32);
        let view = base.narrow(0, 1, 1).narrow(1, 1, 3).narrow(2, 2, 9).slice(3, 1, 11, 2);
        assert!(!view.is_contiguous());
        check_offsets(&view, &configs()[0], DType::F32, 5, "strided view");
    }
}

device_test! {
    fn max_pool_offsets_keep_the_tie_and_nan_rules(dev: Device) {
        // Few distinct values: ties everywhere, NaNs (a later one wins), windows of -inf.
        let palette = [0.0, 1.0, -1.0, f64::NAN, f64::NEG_INFINITY, 1.0, f64::NEG_INFINITY, 0.5];
        for (dims, cl) in [(vec![2usize, 16, 6, 7], true), (vec![2, 3, 6, 7], false)] {
            let n: usize = dims.iter().product();
            let xs: Vec<f64> = (0..n).map(|i| palette[(i * 7 + i / 5) % palette.len()]).collect();
            for dtype in [DType::F32, DType::BF16] {
                let x = as_tensor(xs.clone(), dims.clone(), dev).to_dtype(dtype);
                let x = if cl { channels_last(&x) } else { x };
                for (j, p) in configs().iter().enumerate() {
                    let what = format!("ties and NaN {dims:?} {dtype} config {j}");
                    let (k, s, pad, d) = (p.kernel, p.stride, p.padding, p.dilation);
                    let (v, off) = x.max_pool2d_with_offsets(k, s, pad, d, p.ceil);
                    let (v_i, idx) = x.max_pool2d(k, s, pad, d, p.ceil);
                    let bits = |t: &Tensor| t.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&v), bits(&v_i), "{what}: maxima");
                    let out = [v.dims()[2], v.dims()[3]];
                    let want: Vec<u8> = idx
                        .to_vec::<i64>()
                        .iter()
                        .enumerate()
                        .map(|(i, &at)| expected_offset(at, (i / out[1] % out[0], i % out[1]), dims[3], p))
                        .collect();
                    assert_eq!(off.to_vec::<u8>(), want, "{what}: offsets name the flat indices' elements");
                    let g = as_tensor(random(v.elem_count(), 9), v.dims().to_vec(), dev).to_dtype(dtype);
                    let g = if cl { channels_last(&g) } else { g };
                    let got = g.max_pool2d_with_offsets_backward(&off, dims.clone(), k, s, pad, d, p.ceil);
                    let by_index = g.max_pool2d_with_indices_backward(&idx, dims.clone(), k, s, pad, d, p.ceil);
                    assert_eq!(bits(&got), bits(&by_index), "{what}: gradient");
                }
            }
        }
    }
}

device_test! {
    #[should_panic(expected = "max_pool2d_with_offsets: a 16x16 kernel has more taps than u8 offsets hold (255)")]
    fn max_pool_offsets_of_a_large_kernel_panic(dev: Device) {
        let x = Tensor::zeros([1, 2, 20, 20], DType::F32, dev).unwrap();
        x.max_pool2d_with_offsets([16, 16], [1, 1], [0, 0], [1, 1], false);
    }
}
