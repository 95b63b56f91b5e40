//! Tests of pooling: PyTorch fixtures (`fixtures.py`), naive f64 loops written from the
//! definitions, strided inputs, and the panics.

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{device_test, DType, Device, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "pool/fixtures.json")
}

fn pair(f: &Fixtures, case: &str, name: &str) -> [usize; 2] {
    let v = f.ints(case, name);
    [v[0] as usize, v[1] as usize]
}

fn flag(f: &Fixtures, case: &str, name: &str) -> bool {
    f.ints(case, name)[0] != 0
}

/// The same values as a strided NCHW (or CHW) view of channels-last storage.
pub(super) fn channels_last(x: &Tensor) -> Tensor {
    let v = if x.rank() == 4 {
        x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
    } else {
        x.permute([1, 2, 0]).contiguous().permute([2, 0, 1])
    };
    assert_eq!(v.dims(), x.dims());
    // With one channel or a 1x1 plane, channels-last storage is the NCHW layout.
    let r = x.rank();
    assert!(x.dims()[r - 3] == 1 || x.dims()[r - 2] * x.dims()[r - 1] == 1 || !v.is_contiguous());
    v
}

/// The op family a fixture case exercises, run forward and backward with the case's parameters.
fn forward(f: &Fixtures, case: &str, x: &Tensor) -> (Tensor, Option<Tensor>) {
    let op = case.trim_start_matches("half_").split('_').next().unwrap();
    match op {
        "max" | "maxfwd" => {
            let (v, i) = x.max_pool2d(
                pair(f, case, "kernel"),
                pair(f, case, "stride"),
                pair(f, case, "padding"),
                pair(f, case, "dilation"),
                flag(f, case, "ceil_mode"),
            );
            (v, Some(i))
        }
        "avg" => {
            let divisor = f.ints(case, "divisor_override").first().map(|&d| d as usize);
            let v = x.avg_pool2d(
                pair(f, case, "kernel"),
                pair(f, case, "stride"),
                pair(f, case, "padding"),
                flag(f, case, "ceil_mode"),
                flag(f, case, "count_include_pad"),
                divisor,
            );
            (v, None)
        }
        "adaptavg" => (x.adaptive_avg_pool2d(pair(f, case, "output_size")), None),
        "adaptmax" => {
            let (v, i) = x.adaptive_max_pool2d(pair(f, case, "output_size"));
            (v, Some(i))
        }
        other => panic!("pool fixtures: unknown op prefix {other}"),
    }
}

fn backward(
    f: &Fixtures,
    case: &str,
    grad_out: &Tensor,
    indices: Option<&Tensor>,
    input: &[usize],
) -> Tensor {
    if let Some(indices) = indices {
        // The windowed gradients gather what the plain one scatters, in the same order: the
        // same bits, whatever the layout.
        let plain = grad_out.max_pool2d_backward(indices, input);
        let windowed = if case.contains("adaptmax") {
            grad_out.adaptive_max_pool2d_backward(indices, input)
        } else {
            grad_out.max_pool2d_with_indices_backward(
                indices,
                input,
                pair(f, case, "kernel"),
                pair(f, case, "stride"),
                pair(f, case, "padding"),
                pair(f, case, "dilation"),
                flag(f, case, "ceil_mode"),
            )
        };
        assert_eq!(windowed.dims(), plain.dims(), "{case}");
        assert_eq!(windowed.to_f64_vec(), plain.to_f64_vec(), "{case}: windowed vs plain backward");
        return windowed;
    }
    if case.contains("adaptavg") {
        return grad_out.adaptive_avg_pool2d_backward(input);
    }
    let divisor = f.ints(case, "divisor_override").first().map(|&d| d as usize);
    grad_out.avg_pool2d_backward(
        input,
        pair(f, case, "kernel"),
        pair(f, case, "stride"),
        pair(f, case, "padding"),
        flag(f, case, "ceil_mode"),
        flag(f, case, "count_include_pad"),
        divisor,
    )
}

/// Checks one case in `dtype` (None: the fixture's own), contiguous and channels-last.
fn check_case(f: &Fixtures, case: &str, dtype: Option<DType>, dev: Device) {
    let cast = |t: Tensor| dtype.map_or(t.clone(), |d| t.to_dtype(d));
    let x = cast(f.tensor(case, "x", dev));
    let (rtol, atol) = tolerance(x.dtype());
    for strided in [false, true] {
        let what = |part: &str| {
            format!("{case} {} {}{part}", x.dtype(), if strided { "channels-last " } else { "" })
        };
        let input = if strided { channels_last(&x) } else { x.clone() };
        let (values, indices) = forward(f, case, &input);
        assert_eq!(values.dtype(), x.dtype());
        assert_close(&values, &f.tensor(case, "values", dev), rtol, atol, &what("values"));
        if let Some(indices) = &indices {
            assert_eq!(
                indices.to_vec::<i64>(),
                f.tensor(case, "indices", dev).to_vec::<i64>(),
                "{}",
                what("indices")
            );
        }
        if case.starts_with("maxfwd") {
            continue;
        }
        let grad_out = cast(f.tensor(case, "grad_out", dev));
        let (grad_out, indices) = if strided {
            (channels_last(&grad_out), indices.as_ref().map(channels_last))
        } else {
            (grad_out, indices)
        };
        let grad_in = backward(f, case, &grad_out, indices.as_ref(), x.dims());
        assert_eq!(grad_in.dtype(), x.dtype());
        assert_close(&grad_in, &f.tensor(case, "grad_in", dev), rtol, atol, &what("grad_in"));
    }
}

fn check_cases(prefix: &str, dev: Device) {
    let f = fixtures();
    let cases: Vec<String> = f.case_names().filter(|c| c.starts_with(prefix)).map(String::from).collect();
    assert!(!cases.is_empty(), "no fixture cases start with {prefix}");
    for case in &cases {
        if prefix == "half_" {
            check_case(&f, case, None, dev);
        } else {
            check_case(&f, case, Some(DType::F32), dev);
            check_case(&f, case, Some(DType::F64), dev);
        }
    }
}

device_test! {
    fn max_pool2d_matches_torch(dev: Device) {
        check_cases("max_", dev);
        check_cases("maxfwd_", dev);
    }
}

device_test! {
    fn avg_pool2d_matches_torch(dev: Device) {
        check_cases("avg_", dev);
    }
}

device_test! {
    fn adaptive_avg_pool2d_matches_torch(dev: Device) {
        check_cases("adaptavg_", dev);
    }
}

device_test! {
    fn adaptive_max_pool2d_matches_torch(dev: Device) {
        check_cases("adaptmax_", dev);
    }
}

device_test! {
    fn bf16_and_f16_pools_match_torch(dev: Device) {
        check_cases("half_", dev);
    }
}

/// Deterministic pseudo-random values in [-1, 1) with few ties.
pub(super) fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Output length from the definition: count the window starts `o * stride - padding` whose
/// dilated window ends inside the padded input; in ceil mode, count those that start inside
/// the input or its left padding while the window before them ends short of the padded end.
fn naive_len(input: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let span = (d * (k - 1) + 1) as i64;
    (0..)
        .take_while(|&o: &i64| {
            let start = o * s as i64 - p as i64;
            if ceil {
                start < input as i64 && (o == 0 || start - s as i64 + span < (input + p) as i64)
            } else {
                start + span <= (input + p) as i64
            }
        })
        .count()
}

pub(super) struct Params {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil: bool,
}

/// Max pooling from the definition over a contiguous `[planes, h, w]` f64 buffer.
pub(super) fn naive_max(
    x: &[f64],
    planes: usize,
    [h, w]: [usize; 2],
    p: &Params,
) -> (Vec<f64>, Vec<i64>, [usize; 2]) {
    let out: [usize; 2] = std::array::from_fn(|a| {
        naive_len([h, w][a], p.kernel[a], p.stride[a], p.padding[a], p.dilation[a], p.ceil)
    });
    let (mut values, mut indices) = (vec![], vec![]);
    for plane in 0..planes {
        for oh in 0..out[0] {
            for ow in 0..out[1] {
                let mut best = (f64::NEG_INFINITY, -1i64);
                for ki in 0..p.kernel[0] {
                    for kj in 0..p.kernel[1] {
                        let ih = (oh * p.stride[0] + ki * p.dilation[0]) as i64 - p.padding[0] as i64;
                        let iw = (ow * p.stride[1] + kj * p.dilation[1]) as i64 - p.padding[1] as i64;
                        if ih < 0 || iw < 0 || ih >= h as i64 || iw >= w as i64 {
                            continue;
                        }
                        let v = x[plane * h * w + ih as usize * w + iw as usize];
                        if best.1 < 0 || v > best.0 {
                            best = (v, ih * w as i64 + iw);
                        }
                    }
                }
                values.push(best.0);
                indices.push(best.1);
            }
        }
    }
    (values, indices, out)
}

/// Average pooling from the definition: zero padding, divisor per PyTorch's rules.
fn naive_avg(
    x: &[f64],
    planes: usize,
    [h, w]: [usize; 2],
    p: &Params,
    include_pad: bool,
    over: Option<usize>,
) -> Vec<f64> {
    let out: [usize; 2] =
        std::array::from_fn(|a| naive_len([h, w][a], p.kernel[a], p.stride[a], p.padding[a], 1, p.ceil));
    let mut values = vec![];
    for plane in 0..planes {
        for oh in 0..out[0] {
            for ow in 0..out[1] {
                let (mut sum, mut inside, mut padded) = (0.0, 0, 0);
                for ki in 0..p.kernel[0] {
                    for kj in 0..p.kernel[1] {
                        let ih = (oh * p.stride[0] + ki) as i64 - p.padding[0] as i64;
                        let iw = (ow * p.stride[1] + kj) as i64 - p.padding[1] as i64;
                        let in_padded = |i: i64, n: usize, pad: usize| i < (n + pad) as i64;
                        if in_padded(ih, h, p.padding[0]) && in_padded(iw, w, p.padding[1]) {
                            padded += 1;
                        }
                        if ih >= 0 && iw >= 0 && ih < h as i64 && iw < w as i64 {
                            sum += x[plane * h * w + ih as usize * w + iw as usize];
                            inside += 1;
                        }
                    }
                }
                let divisor = over.unwrap_or(if include_pad { padded } else { inside });
                values.push(if inside == 0 { 0.0 } else { sum / divisor as f64 });
            }
        }
    }
    values
}

pub(super) fn as_tensor(values: Vec<f64>, dims: Vec<usize>, dev: Device) -> Tensor {
    Tensor::from_vec(values, dims, dev).unwrap()
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| x * y).sum()
}

device_test! {
    fn sliding_pools_match_naive_loops(dev: Device) {
        let configs = [
            ([3, 3], [2, 2], [1, 1], [1, 1], false),
            ([3, 3], [2, 2], [1, 1], [1, 1], true),
            ([2, 3], [3, 1], [1, 0], [2, 1], true),
            ([4, 2], [1, 3], [2, 1], [1, 3], false),
            ([5, 5], [2, 3], [2, 2], [2, 1], true),
        ];
        // [2, 8, 45, 40] is past the parallel threshold; [3, 11, 13] is unbatched and odd.
        for dims in [vec![2usize, 8, 45, 40], vec![3, 11, 13]] {
            let planes = dims[..dims.len() - 2].iter().product();
            let hw = [dims[dims.len() - 2], dims[dims.len() - 1]];
            let xs = random(dims.iter().product(), 7);
            let x = as_tensor(xs.clone(), dims.clone(), dev);
            for (kernel, stride, padding, dilation, ceil) in configs {
                let p = Params { kernel, stride, padding, dilation, ceil };
                let what = format!("{dims:?} {kernel:?} {stride:?} {padding:?} {dilation:?} ceil {ceil}");
                let (want_v, want_i, out) = naive_max(&xs, planes, hw, &p);
                let out_dims = [&dims[..dims.len() - 2], &out[..]].concat();
                let (v, i) = x.max_pool2d(kernel, stride, padding, dilation, ceil);
                assert_eq!(v.dims(), out_dims.as_slice(), "max {what}");
                assert_eq!(v.to_f64_vec(), want_v, "max values {what}");
                assert_eq!(i.to_vec::<i64>(), want_i, "max indices {what}");
                // The backward scatters: grad_in[plane][index] sums grad_out over the windows.
                let g = as_tensor(random(v.elem_count(), 3), out_dims.clone(), dev);
                let mut want_g = vec![0.0; xs.len()];
                for (o, (&gv, &at)) in g.to_f64_vec().iter().zip(&want_i).enumerate() {
                    want_g[o / (out[0] * out[1]) * hw[0] * hw[1] + at as usize] += gv;
                }
                let got = g.max_pool2d_backward(&i, dims.clone());
                assert_close(&got, &as_tensor(want_g, dims.clone(), dev), 1e-12, 1e-12, &format!("max grad {what}"));
                for strided in [false, true] {
                    let (g, i) = if strided { (channels_last(&g), channels_last(&i)) } else { (g.clone(), i.clone()) };
                    let w = g.max_pool2d_with_indices_backward(&i, dims.clone(), kernel, stride, padding, dilation, ceil);
                    assert_eq!(w.to_f64_vec(), got.to_f64_vec(), "windowed max grad {what} channels-last {strided}");
                }

                for (include_pad, over) in [(true, None), (false, None), (true, Some(7))] {
                    let p = Params { dilation: [1, 1], ..p };
                    let want = naive_avg(&xs, planes, hw, &p, include_pad, over);
                    let a = x.avg_pool2d(kernel, stride, padding, ceil, include_pad, over);
                    let what = format!("avg {what} include_pad {include_pad} override {over:?}");
                    assert_close(&a, &as_tensor(want, a.dims().to_vec(), dev), 1e-12, 1e-12, &what);
                    // Average pooling is linear, so its backward is its adjoint:
                    // <avg(x), g> == <avg_backward(g), x> for every x and g.
                    let g = as_tensor(random(a.elem_count(), 5), a.dims().to_vec(), dev);
                    let back = g.avg_pool2d_backward(dims.clone(), kernel, stride, padding, ceil, include_pad, over);
                    let (lhs, rhs) = (dot(&a, &g), dot(&back, &x));
                    assert!((lhs - rhs).abs() < 1e-9 * lhs.abs().max(1.0), "adjoint {what}: {lhs} vs {rhs}");
                }
            }
        }
    }
}

device_test! {
    fn adaptive_pools_match_naive_loops(dev: Device) {
        let (planes, hw) = (6, [13, 10]);
        let xs = random(planes * hw[0] * hw[1], 11);
        let x = as_tensor(xs.clone(), vec![2, 3, hw[0], hw[1]], dev);
        for out in [[1, 1], [5, 3], [13, 10], [4, 7], [20, 17]] {
            let bounds = |o: usize, n: usize, i: usize| {
                ((o * i) as f64 / n as f64).floor() as usize..(((o + 1) * i) as f64 / n as f64).ceil() as usize
            };
            let (mut means, mut maxes, mut argmaxes) = (vec![], vec![], vec![]);
            for plane in 0..planes {
                for oh in 0..out[0] {
                    for ow in 0..out[1] {
                        let cells: Vec<(usize, f64)> = bounds(oh, out[0], hw[0])
                            .flat_map(|ih| bounds(ow, out[1], hw[1]).map(move |iw| ih * hw[1] + iw))
                            .map(|at| (at, xs[plane * hw[0] * hw[1] + at]))
                            .collect();
                        means.push(cells.iter().map(|c| c.1).sum::<f64>() / cells.len() as f64);
                        let best = cells.iter().fold(cells[0], |b, &c| if c.1 > b.1 { c } else { b });
                        maxes.push(best.1);
                        argmaxes.push(best.0 as i64);
                    }
                }
            }
            let dims = vec![2, 3, out[0], out[1]];
            let avg = x.adaptive_avg_pool2d(out);
            assert_close(&avg, &as_tensor(means, dims.clone(), dev), 1e-12, 1e-12, &format!("adaptive avg {out:?}"));
            let (m, i) = x.adaptive_max_pool2d(out);
            assert_eq!(m.to_f64_vec(), maxes, "adaptive max {out:?}");
            assert_eq!(i.to_vec::<i64>(), argmaxes, "adaptive argmax {out:?}");
            let g = as_tensor(random(avg.elem_count(), 2), dims, dev);
            let back = g.adaptive_avg_pool2d_backward(x.dims());
            let (lhs, rhs) = (dot(&avg, &g), dot(&back, &x));
            assert!((lhs - rhs).abs() < 1e-9 * lhs.abs().max(1.0), "adaptive adjoint {out:?}: {lhs} vs {rhs}");
        }
    }
}

device_test! {
    fn strided_views_pool_like_their_copies(dev: Device) {
        let base = as_tensor(random(2 * 5 * 12 * 11, 4), vec![2, 5, 12, 11], dev).to_dtype(DType::F32);
        // Narrowed in every dim, then a stepped slice of W.
        let view = base.narrow(0, 1, 1).narrow(1, 1, 3).narrow(2, 2, 9).slice(3, 1, 11, 2);
        assert!(!view.is_contiguous());
        let copy = view.contiguous();
        let (v1, i1) = view.max_pool2d([2, 2], [1, 2], [1, 0], [1, 1], true);
        let (v2, i2) = copy.max_pool2d([2, 2], [1, 2], [1, 0], [1, 1], true);
        assert_eq!((v1.to_vec::<f32>(), i1.to_vec::<i64>()), (v2.to_vec::<f32>(), i2.to_vec::<i64>()));
        let a1 = view.avg_pool2d([3, 2], [2, 1], [1, 1], false, false, None);
        assert_eq!(a1.to_vec::<f32>(), copy.avg_pool2d([3, 2], [2, 1], [1, 1], false, false, None).to_vec::<f32>());
        assert_eq!(view.adaptive_avg_pool2d([4, 3]).to_vec::<f32>(), copy.adaptive_avg_pool2d([4, 3]).to_vec::<f32>());
        // A broadcast (stride-0) gradient, as the backward of a mean hands it over.
        let g = Tensor::full([1, 3, 1, 1], 0.5, DType::F32, dev).unwrap().expand([1, 3, 4, 3]);
        let want = g.contiguous().adaptive_avg_pool2d_backward(view.dims());
        assert_eq!(g.adaptive_avg_pool2d_backward(view.dims()).to_vec::<f32>(), want.to_vec::<f32>());
    }
}

device_test! {
    fn empty_batch_gives_empty_outputs(dev: Device) {
        let x = Tensor::zeros([0, 3, 8, 8], DType::F32, dev).unwrap();
        let (v, i) = x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
        assert_eq!((v.dims(), i.dims()), (&[0usize, 3, 4, 4][..], &[0usize, 3, 4, 4][..]));
        assert_eq!(x.adaptive_avg_pool2d([1, 1]).dims(), &[0, 3, 1, 1]);
        assert_eq!(v.max_pool2d_backward(&i, x.dims()).dims(), x.dims());
    }
}

fn x4(dev: Device) -> Tensor {
    Tensor::zeros([1, 2, 5, 5], DType::F32, dev).unwrap()
}

device_test! {
    #[should_panic(expected = "max_pool2d: padding [2, 0] must be at most half the kernel [3, 3]")]
    fn max_pool_padding_over_half_kernel_panics(dev: Device) {
        x4(dev).max_pool2d([3, 3], [1, 1], [2, 0], [1, 1], false);
    }
}

device_test! {
    #[should_panic(expected = "avg_pool2d: input of shape [1, 2, 5, 5] is too small for kernel [6, 2]")]
    fn avg_pool_kernel_larger_than_input_panics(dev: Device) {
        x4(dev).avg_pool2d([6, 2], [1, 1], [0, 0], false, true, None);
    }
}

device_test! {
    #[should_panic(expected = "max_pool2d: kernel [2, 2], stride [0, 1] and dilation [1, 1] must all be positive")]
    fn zero_stride_panics(dev: Device) {
        x4(dev).max_pool2d([2, 2], [0, 1], [0, 0], [1, 1], false);
    }
}

device_test! {
    #[should_panic(expected = "avg_pool2d: divisor_override must not be zero")]
    fn zero_divisor_override_panics(dev: Device) {
        x4(dev).avg_pool2d([2, 2], [2, 2], [0, 0], false, true, Some(0));
    }
}

device_test! {
    #[should_panic(expected = "adaptive_avg_pool2d: expected an [N, C, H, W] or [C, H, W] input with non-zero C, H and W, got shape [5, 5]")]
    fn rank_two_input_panics(dev: Device) {
        Tensor::zeros([5, 5], DType::F32, dev).unwrap().adaptive_avg_pool2d([1, 1]);
    }
}

device_test! {
    #[should_panic(expected = "max_pool2d: expected a floating-point tensor, got dtype int64")]
    fn integer_input_panics(dev: Device) {
        x4(dev).to_dtype(DType::I64).max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
    }
}

device_test! {
    #[should_panic(expected = "max_pool2d_backward: index 25 is out of range for an input plane of 5x5")]
    fn max_backward_index_out_of_range_panics(dev: Device) {
        let g = Tensor::zeros([1, 2, 2, 2], DType::F32, dev).unwrap();
        let i = Tensor::full([1, 2, 2, 2], 25.0, DType::I64, dev).unwrap();
        g.max_pool2d_backward(&i, [1, 2, 5, 5]);
    }
}

device_test! {
    #[should_panic(expected = "max_pool2d_backward: indices must be int64 with grad_out's shape [1, 2, 2, 2], got float32")]
    fn max_backward_float_indices_panic(dev: Device) {
        let g = Tensor::zeros([1, 2, 2, 2], DType::F32, dev).unwrap();
        g.max_pool2d_backward(&g, [1, 2, 5, 5]);
    }
}

device_test! {
    #[should_panic(expected = "avg_pool2d_backward: grad_out has shape [1, 2, 3, 3], but the forward's output for input [1, 2, 5, 5] has shape [1, 2, 2, 2]")]
    fn avg_backward_wrong_grad_shape_panics(dev: Device) {
        let g = Tensor::zeros([1, 2, 3, 3], DType::F32, dev).unwrap();
        g.avg_pool2d_backward([1, 2, 5, 5], [2, 2], [2, 2], [0, 0], false, true, None);
    }
}

device_test! {
    fn channels_last_max_grad_matches_the_planar_one_bit_for_bit(dev: Device) {
        // 16 channels are whole 16-byte vectors for every float dtype: on CUDA the
        // channels-last gradient takes the vector kernel, which must add the same terms in the
        // same order as the planar (NCHW) gather.
        for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
            let dims = vec![2usize, 16, 17, 14];
            let x = as_tensor(random(dims.iter().product(), 21), dims.clone(), dev).to_dtype(dtype);
            let (k, s, p, d) = ([3, 3], [2, 2], [1, 1], [1, 1]);
            let (v, i) = x.max_pool2d(k, s, p, d, false);
            let g = as_tensor(random(v.elem_count(), 22), v.dims().to_vec(), dev).to_dtype(dtype);
            let planar = g.max_pool2d_with_indices_backward(&i, dims.clone(), k, s, p, d, false);
            let cl = channels_last(&g).max_pool2d_with_indices_backward(&channels_last(&i), dims.clone(), k, s, p, d, false);
            assert_eq!(cl.to_f64_vec(), planar.to_f64_vec(), "{dtype}");
        }
    }
}
