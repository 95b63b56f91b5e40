use crate::ops::matmul::tests::rand;
use crate::testing::{assert_close, Fixtures};
use crate::*;

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "conv/fixtures.json")
}

struct Params {
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

fn pair(v: Vec<i64>) -> [usize; 2] {
    [v[0] as usize, v[1] as usize]
}

fn params(f: &Fixtures, case: &str) -> Params {
    Params {
        stride: pair(f.ints(case, "stride")),
        padding: pair(f.ints(case, "padding")),
        dilation: pair(f.ints(case, "dilation")),
        groups: f.ints(case, "groups")[0] as usize,
    }
}

fn dims4(t: &Tensor) -> [usize; 4] {
    t.dims().try_into().expect("a 4-D tensor")
}

fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-10, 1e-10),
        DType::F32 => (1e-4, 1e-4),
        // Inputs rounded to 8 mantissa bits, sums of up to 36 products of N(0,1) values.
        DType::BF16 => (1e-2, 1e-1),
        _ => (5e-3, 2e-2),
    }
}

device_test! {
    fn conv2d_and_its_gradients_match_torch(dev: Device) {
        let f = fixtures();
        for case in f.case_names() {
            let p = params(&f, case);
            for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
                let t = |name: &str| f.tensor(case, name, dev).to_dtype(dtype);
                let (x, w, gy) = (t("x"), t("w"), t("grad_y"));
                let b = (f.ints(case, "has_bias")[0] == 1).then(|| t("b"));
                let (rtol, atol) = tolerance(dtype);
                let what = |s: &str| format!("{case} {dtype} {s}");
                let y = x.conv2d(&w, b.as_ref(), p.stride, p.padding, p.dilation, p.groups);
                assert_eq!(y.dtype(), dtype);
                assert_close(&y, &f.tensor(case, "y", dev), rtol, atol, &what("forward"));
                let gx = Tensor::conv2d_backward_input(&gy, &w, dims4(&x), p.stride, p.padding, p.dilation, p.groups);
                assert_close(&gx, &f.tensor(case, "grad_x", dev), rtol, atol, &what("grad input"));
                let gw = Tensor::conv2d_backward_weight(&gy, &x, dims4(&w), p.stride, p.padding, p.dilation, p.groups);
                // The weight gradient sums over the batch and every output pixel: more terms.
                assert_close(&gw, &f.tensor(case, "grad_w", dev), rtol, 4.0 * atol, &what("grad weight"));
            }
        }
    }
}

/// Direct convolution by its definition, with the two gradients from the same loop nest:
/// y[n,o,oy,ox] = b[o] + sum_{c,ki,kj} x[n, g*Cg + c, oy*s - p + ki*d, ox*s - p + kj*d] * w[o,c,ki,kj].
struct Direct {
    y: Vec<f64>,
    grad_x: Vec<f64>,
    grad_w: Vec<f64>,
}

fn direct(x: &Tensor, w: &Tensor, gy: &Tensor, p: &Params) -> Direct {
    let ([n, c, h, wd], [o, cg, kh, kw], [_, _, oh, ow]) = (dims4(x), dims4(w), dims4(gy));
    let (xv, wv, gyv) = (x.to_f64_vec(), w.to_f64_vec(), gy.to_f64_vec());
    let og = o / p.groups;
    let mut out =
        Direct { y: vec![0.0; gyv.len()], grad_x: vec![0.0; xv.len()], grad_w: vec![0.0; wv.len()] };
    for ni in 0..n {
        for oi in 0..o {
            let grp = oi / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let yi = ((ni * o + oi) * oh + oy) * ow + ox;
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy =
                                    (oy * p.stride[0] + ki * p.dilation[0]) as isize - p.padding[0] as isize;
                                let ix =
                                    (ox * p.stride[1] + kj * p.dilation[1]) as isize - p.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let chan = grp * cg + ci;
                                let xi = ((ni * c + chan) * h + iy as usize) * wd + ix as usize;
                                let wi = ((oi * cg + ci) * kh + ki) * kw + kj;
                                out.y[yi] += xv[xi] * wv[wi];
                                out.grad_x[xi] += gyv[yi] * wv[wi];
                                out.grad_w[wi] += gyv[yi] * xv[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn check_direct(x: &Tensor, w: &Tensor, p: &Params, what: &str) {
    let y = x.conv2d(w, None, p.stride, p.padding, p.dilation, p.groups);
    let gy = rand(y.dims(), 99, x.dtype(), x.device());
    let want = direct(x, w, &gy, p);
    let (rtol, atol) = tolerance(x.dtype());
    let close = |got: &Tensor, want: Vec<f64>, s: &str| {
        let want = Tensor::from_vec(want, got.dims(), Device::Cpu).unwrap();
        assert_close(got, &want, rtol, atol, &format!("{what}: {s}"));
    };
    close(&y, want.y, "forward");
    let gx = Tensor::conv2d_backward_input(&gy, w, dims4(x), p.stride, p.padding, p.dilation, p.groups);
    close(&gx, want.grad_x, "grad input");
    let gw = Tensor::conv2d_backward_weight(&gy, x, dims4(w), p.stride, p.padding, p.dilation, p.groups);
    if x.device().is_cuda() && x.dtype() == DType::F32 {
        // Each weight-gradient element sums N*H*W products (5120 here) in f32; cuDNN's
        // backward-filter algorithms order that sum differently from the CPU, which moves
        // elements near cancellation by a few 1e-4 absolute.
        let want = Tensor::from_vec(want.grad_w, gw.dims(), Device::Cpu).unwrap();
        assert_close(&gw, &want, rtol, 1e-3, &format!("{what}: grad weight"));
        return;
    }
    close(&gw, want.grad_w, "grad weight");
}

device_test! {
    fn conv2d_matches_the_direct_loop(dev: Device) {
        for dtype in [DType::F64, DType::F32] {
            // Enough samples for one rayon task each, and several bands of output rows.
            let p = Params { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
            let x = rand(&[4, 16, 40, 32], 1, dtype, dev);
            check_direct(&x, &rand(&[8, 16, 3, 3], 2, dtype, dev), &p, "bands, parallel samples");
            // One sample: GEMM gets the threads.
            let p = Params { stride: [2, 1], padding: [2, 0], dilation: [1, 3], groups: 2 };
            let x = rand(&[1, 6, 33, 29], 3, dtype, dev);
            check_direct(&x, &rand(&[4, 3, 3, 2], 4, dtype, dev), &p, "single sample");
        }
    }
}

device_test! {
    fn small_planes_side_by_side_match_the_direct_loop(dev: Device) {
        // Output planes of 16 pixels: several samples share one GEMM; 5 samples on two threads
        // leave a shorter last unit, one thread puts the whole batch in one tile.
        let same = Params { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 2 };
        let pointwise = Params { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 };
        let strided = Params { stride: [2, 2], padding: [0, 0], dilation: [1, 1], groups: 1 };
        let check = |dtype: DType| {
            check_direct(&rand(&[5, 6, 4, 4], 1, dtype, dev), &rand(&[4, 3, 3, 3], 2, dtype, dev), &same, "3x3 groups");
            let x = rand(&[5, 6, 4, 4], 3, dtype, dev);
            check_direct(&x, &rand(&[8, 6, 1, 1], 4, dtype, dev), &pointwise, "pointwise");
            let x = rand(&[5, 6, 8, 8], 5, dtype, dev);
            check_direct(&x, &rand(&[8, 6, 1, 1], 6, dtype, dev), &strided, "strided 1x1");
        };
        for dtype in [DType::F64, DType::F32] {
            for threads in [1, 2] {
                rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| check(dtype));
            }
        }
    }
}

device_test! {
    fn strided_operands_are_handled(dev: Device) {
        let p = Params { stride: [1, 2], padding: [1, 1], dilation: [1, 1], groups: 1 };
        // A narrowed input (rows of the storage skipped) and a weight stored [KH, KW, C, O].
        let x = rand(&[2, 3, 9, 12], 1, DType::F32, dev).narrow(3, 2, 8).narrow(1, 1, 2);
        let w = rand(&[3, 3, 2, 5], 2, DType::F32, dev).permute([3, 2, 0, 1]);
        assert!(!x.is_contiguous() && !w.is_contiguous());
        check_direct(&x, &w, &p, "strided");
        // Pointwise with a transposed-spatial input.
        let p = Params { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 };
        let x = rand(&[2, 4, 5, 7], 3, DType::F64, dev).transpose(2, 3);
        check_direct(&x, &rand(&[3, 4, 1, 1], 4, DType::F64, dev), &p, "pointwise transposed");
    }
}

device_test! {
    #[should_panic(expected = "conv2d: input [1, 3, 5, 5] has 3 channels but weight [4, 2, 3, 3] with groups = 1 expects 2")]
    fn channel_mismatch_panics(dev: Device) {
        let x = rand(&[1, 3, 5, 5], 1, DType::F32, dev);
        x.conv2d(&rand(&[4, 2, 3, 3], 2, DType::F32, dev), None, [1, 1], [0, 0], [1, 1], 1);
    }
}

device_test! {
    #[should_panic(expected = "conv2d: weight [3, 2, 3, 3] has 3 output channels, not divisible by groups = 2")]
    fn groups_must_divide_outputs(dev: Device) {
        let x = rand(&[1, 4, 5, 5], 1, DType::F32, dev);
        x.conv2d(&rand(&[3, 2, 3, 3], 2, DType::F32, dev), None, [1, 1], [0, 0], [1, 1], 2);
    }
}

device_test! {
    #[should_panic(expected = "conv2d: bias has shape [3], expected [4]")]
    fn bias_must_match_outputs(dev: Device) {
        let x = rand(&[1, 2, 5, 5], 1, DType::F32, dev);
        let b = rand(&[3], 3, DType::F32, dev);
        x.conv2d(&rand(&[4, 2, 3, 3], 2, DType::F32, dev), Some(&b), [1, 1], [0, 0], [1, 1], 1);
    }
}

device_test! {
    #[should_panic(expected = "conv2d_backward_input: grad_output has shape [1, 4, 5, 5], but the convolution of input [1, 2, 5, 5] gives [1, 4, 3, 3]")]
    fn backward_checks_the_gradient_shape(dev: Device) {
        let gy = rand(&[1, 4, 5, 5], 1, DType::F32, dev);
        let w = rand(&[4, 2, 3, 3], 2, DType::F32, dev);
        Tensor::conv2d_backward_input(&gy, &w, [1, 2, 5, 5], [1, 1], [0, 0], [1, 1], 1);
    }
}

device_test! {
    #[should_panic(expected = "conv2d: input [1, 2, 2, 2] padded by [0, 0] is smaller than the kernel")]
    fn kernel_larger_than_input_panics(dev: Device) {
        let x = rand(&[1, 2, 2, 2], 1, DType::F32, dev);
        x.conv2d(&rand(&[1, 2, 3, 3], 2, DType::F32, dev), None, [1, 1], [0, 0], [1, 1], 1);
    }
}

/// Builds an operand on a device, with the same values and the same strides on each.
type Make<'a> = &'a dyn Fn(Device) -> Tensor;

/// conv2d, its input gradient and its weight gradient on the GPU, through cuDNN (`cudnn`) or the
/// im2col + cuBLAS fallback, against the CPU.
fn check_gpu(x: Make, w: Make, bias: Option<Make>, p: &Params, cudnn: bool, what: &str) {
    let (cpu, gpu) = (Device::Cpu, Device::Cuda(0));
    let (xc, wc, bc) = (x(cpu), w(cpu), bias.map(|b| b(cpu)));
    let y = xc.conv2d(&wc, bc.as_ref(), p.stride, p.padding, p.dilation, p.groups);
    let gyc = rand(y.dims(), 77, xc.dtype(), cpu);
    let gx = Tensor::conv2d_backward_input(&gyc, &wc, dims4(&xc), p.stride, p.padding, p.dilation, p.groups);
    let gw = Tensor::conv2d_backward_weight(&gyc, &xc, dims4(&wc), p.stride, p.padding, p.dilation, p.groups);
    let (xd, wd, bd) = (x(gpu), w(gpu), bias.map(|b| b(gpu)));
    assert_eq!(xd.strides(), xc.strides(), "{what}: the GPU operand has the CPU one's layout");
    let gyd = rand(y.dims(), 77, xc.dtype(), gpu);
    let (yd, gxd, gwd) = super::cuda::with_cudnn(cudnn, || {
        (
            xd.conv2d(&wd, bd.as_ref(), p.stride, p.padding, p.dilation, p.groups),
            Tensor::conv2d_backward_input(&gyd, &wd, dims4(&xc), p.stride, p.padding, p.dilation, p.groups),
            Tensor::conv2d_backward_weight(&gyd, &xd, dims4(&wc), p.stride, p.padding, p.dilation, p.groups),
        )
    });
    // TF32 is off by default: f32 is full precision. The weight gradient sums over the batch and
    // every output pixel, so it gets a larger absolute tolerance.
    let (rtol, atol, atol_w) = match xc.dtype() {
        DType::F64 => (1e-10, 1e-10, 1e-10),
        DType::F32 => (1e-5, 1e-5, 1e-4),
        DType::F16 => (5e-3, 1e-2, 5e-2),
        _ => (1e-2, 1e-2, 5e-2),
    };
    let path = if cudnn { "cudnn" } else { "im2col" };
    let close = |got: &Tensor, want: &Tensor, atol, s: &str| {
        assert_eq!(got.device(), gpu, "{what} {path} {s}: device");
        assert_eq!(got.dtype(), want.dtype(), "{what} {path} {s}: dtype");
        let got = got.to_device(cpu).unwrap();
        assert_close(&got, want, rtol, atol, &format!("{what} ({}, {path}): {s}", xc.dtype()));
    };
    close(&yd, &y, atol, "forward");
    close(&gxd, &gx, atol, "grad input");
    close(&gwd, &gw, atol_w, "grad weight");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_conv2d_matches_the_cpu_on_both_paths() {
    let gpu = crate::cuda::device(0).unwrap();
    eprintln!("cuDNN available: {}", super::cuda::cudnn_available(&gpu));
    let prm = |stride, padding, dilation, groups| Params { stride, padding, dilation, groups };
    for cudnn in [true, false] {
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let r = |shape: &'static [usize], seed| move |d: Device| rand(shape, seed, dtype, d);
            let bias = r(&[9], 3);
            let (x, w) = (r(&[2, 6, 17, 13], 1), r(&[9, 2, 3, 2], 2));
            let p = prm([2, 1], [1, 2], [2, 1], 3);
            check_gpu(&x, &w, Some(&bias), &p, cudnn, "stride, padding, dilation, groups, bias");
            // Channels-last input and weight: stored NHWC, used in place by cuDNN.
            let x_cl = |d: Device| rand(&[2, 17, 13, 6], 4, dtype, d).permute([0, 3, 1, 2]);
            let w_cl = |d: Device| rand(&[9, 3, 2, 2], 5, dtype, d).permute([0, 3, 1, 2]);
            check_gpu(&x_cl, &w_cl, None, &p, cudnn, "channels-last");
            let p1 = prm([1, 1], [1, 1], [1, 1], 3);
            check_gpu(&x_cl, &w, Some(&bias), &p1, cudnn, "channels-last input only");
            // A narrowed input (neither layout): packed first (cuDNN) or read with strides (im2col).
            let x_n = |d: Device| rand(&[3, 8, 12, 12], 6, dtype, d).narrow(1, 1, 6).narrow(3, 2, 9);
            check_gpu(&x_n, &w, None, &prm([1, 2], [0, 1], [1, 1], 3), cudnn, "narrowed");
            // Depthwise and pointwise.
            let p = prm([1, 1], [1, 1], [1, 1], 4);
            check_gpu(&r(&[2, 4, 9, 9], 7), &r(&[4, 1, 3, 3], 8), None, &p, cudnn, "depthwise");
            let p = prm([1, 1], [0, 0], [1, 1], 1);
            check_gpu(&r(&[2, 5, 6, 7], 9), &r(&[3, 5, 1, 1], 10), None, &p, cudnn, "pointwise");
            // A bigger single-group case: many output pixels per sample.
            let p = prm([1, 1], [1, 1], [1, 1], 1);
            check_gpu(&r(&[4, 16, 32, 30], 11), &r(&[8, 16, 3, 3], 12), None, &p, cudnn, "16 -> 8 channels");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_conv2d_of_an_empty_batch_is_empty() {
    let gpu = Device::Cuda(0);
    let x = Tensor::zeros([0, 2, 5, 5], DType::F32, gpu).unwrap();
    let w = rand(&[3, 2, 3, 3], 1, DType::F32, gpu);
    let y = x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1);
    assert_eq!(y.dims(), [0, 3, 3, 3]);
    let gw = Tensor::conv2d_backward_weight(&y, &x, [3, 2, 3, 3], [1, 1], [0, 0], [1, 1], 1);
    assert_eq!(gw.to_f64_vec(), vec![0.0; 54]);
}

/// Relative L2 distance of `got` from `want`.
fn relative_error(got: &Tensor, want: &[f64]) -> f64 {
    let got = got.to_f64_vec();
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    (diff / want.iter().map(|b| b * b).sum::<f64>()).sqrt()
}

#[test]
fn long_f32_reductions_stay_as_close_to_f64_as_short_ones() {
    // 256 channels of 3x3 (2304 terms per output) and 512 output channels (512 terms per input
    // gradient), as in ResNet's last stages. Summed in one f32 run these were 3.4e-7 and 4.0e-7
    // from f64; PyTorch's convolution is 2.0e-7 and 2.2e-7; a 64-term product is 1.5e-7.
    let p = Params { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
    let x = rand(&[2, 256, 4, 4], 1, DType::F32, Device::Cpu);
    let w = rand(&[512, 256, 3, 3], 2, DType::F32, Device::Cpu);
    let gy = rand(&[2, 512, 4, 4], 3, DType::F32, Device::Cpu);
    // The reference is exact for the f32 inputs: the same values in f64.
    let want = direct(&x, &w, &gy, &p);
    let y = x.conv2d(&w, None, p.stride, p.padding, p.dilation, p.groups);
    let gx = Tensor::conv2d_backward_input(&gy, &w, dims4(&x), p.stride, p.padding, p.dilation, p.groups);
    let gw = Tensor::conv2d_backward_weight(&gy, &x, dims4(&w), p.stride, p.padding, p.dilation, p.groups);
    for (name, got, want) in
        [("forward", &y, &want.y), ("grad input", &gx, &want.grad_x), ("grad weight", &gw, &want.grad_w)]
    {
        let err = relative_error(got, want);
        assert!(err < 2.5e-7, "{name}: f32 is {err:.2e} from f64 (relative L2), expected under 2.5e-7");
    }
}
