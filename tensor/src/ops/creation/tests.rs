//! Tests of creation ops against PyTorch fixtures (`fixtures.py` beside this file), and of the
//! constructors' errors.

use crate::testing::{assert_close, tolerance, Fixtures};
use crate::{DType, Device, Error, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "creation/fixtures.json")
}

crate::device_test! {
    fn arange_linspace_and_eye_match_torch(dev: Device) {
        let fx = fixtures();
        let mut checked = 0;
        for case in fx.case_names() {
            let expected = fx.tensor(case, "y", dev);
            let dtype = expected.dtype();
            let arg = |name| fx.scalar(case, name);
            let y = match case.split('/').next().unwrap() {
                "arange" => Tensor::arange(arg("start"), arg("end"), arg("step"), dtype, dev).unwrap(),
                "linspace" => Tensor::linspace(arg("start"), arg("end"), arg("steps") as usize, dtype, dev).unwrap(),
                "eye" => Tensor::eye(arg("n") as usize, dtype, dev).unwrap(),
                other => panic!("creation fixture names an unknown op {other}"),
            };
            assert_eq!(y.dtype(), dtype, "{case}");
            let (rtol, atol) = tolerance(dtype);
            assert_close(&y, &expected, rtol, atol, case);
            checked += 1;
        }
        assert_eq!(checked, 31);
    }
}

crate::device_test! {
    fn constants_fill_every_element(dev: Device) {
        for dtype in DType::ALL {
            let z = Tensor::zeros([2, 3], dtype, dev).unwrap();
            let o = Tensor::ones([2, 3], dtype, dev).unwrap();
            let f = Tensor::full([4], 7.9, dtype, dev).unwrap();
            assert_eq!((z.dims(), z.dtype(), o.dtype()), (&[2usize, 3][..], dtype, dtype));
            assert_eq!(z.to_f64_vec(), vec![0.0; 6]);
            assert_eq!(o.to_f64_vec(), vec![1.0; 6]);
            // 7.9 cast to the dtype the way a single element converts.
            let one = Tensor::from_vec(vec![7.9f64], 1, dev).unwrap().to_dtype(dtype).to_f64_vec()[0];
            assert_eq!(f.to_f64_vec(), vec![one; 4]);
            assert_eq!(o.zeros_like().to_f64_vec(), z.to_f64_vec());
            assert_eq!(z.ones_like().to_f64_vec(), o.to_f64_vec());
            assert_eq!(z.full_like(7.9).reshape(6).narrow(0, 0, 4).to_f64_vec(), f.to_f64_vec());
        }
        assert_eq!(Tensor::zeros((), DType::F32, dev).unwrap().dims(), &[] as &[usize]);
        assert_eq!(Tensor::zeros([3, 0], DType::F32, dev).unwrap().elem_count(), 0);
    }
}

crate::device_test! {
    fn literals_infer_their_shape(dev: Device) {
        let t = Tensor::new([[[1u8, 2], [3, 4], [5, 6]]], dev).unwrap();
        assert_eq!((t.dims(), t.dtype()), (&[1usize, 3, 2][..], DType::U8));
        assert_eq!(t.to_vec::<u8>(), (1..=6).collect::<Vec<u8>>());
        assert_eq!(Tensor::new(2.5f64, dev).unwrap().item(), 2.5);
        assert_eq!(Tensor::scalar(3i64, dev).unwrap().to_scalar::<i64>(), 3);
        assert_eq!(Tensor::new(vec![1f32, 2.0], dev).unwrap().to_vec1::<f32>(), vec![1.0, 2.0]);
        let empty = Tensor::from_slice::<f32>(&[], [2, 0], dev).unwrap();
        assert_eq!(empty.to_vec2::<f32>(), vec![Vec::<f32>::new(); 2]);
    }
}

#[test]
fn from_vec_with_the_wrong_count_is_an_error() {
    let err = Tensor::from_vec(vec![1f32, 2.0, 3.0], [2, 2], Device::Cpu).unwrap_err();
    assert!(
        matches!(&err, Error::ElementCount { shape, expected: 4, got: 3 } if shape == &[2, 2]),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "cannot build a tensor of shape [2, 2] (4 elements) from 3 elements");
}

#[test]
fn a_missing_cuda_device_is_a_clear_error() {
    // Ordinal 64: missing on a machine without a GPU and on one with a few.
    let dev = Device::Cuda(64);
    let errors = [
        Tensor::zeros([2], DType::F32, dev).unwrap_err(),
        Tensor::new([1f32], dev).unwrap_err(),
        Tensor::arange(0.0, 3.0, 1.0, DType::F32, dev).unwrap_err(),
        Tensor::new([1f32], Device::Cpu).unwrap().to_device(dev).unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::CudaUnavailable { ordinal: 64, .. }), "{err:?}");
        assert!(err.to_string().starts_with("CUDA device 64 is not available"), "{err}");
    }
}

crate::device_test! {
    #[should_panic(expected = "arange: upper bound 0 and lower bound 5 inconsistent with step sign 1")]
    fn arange_step_must_point_at_the_end(dev: Device) {
        let _ = Tensor::arange(5.0, 0.0, 1.0, DType::F32, dev);
    }
}

crate::device_test! {
    #[should_panic(expected = "arange: step must be nonzero")]
    fn arange_step_zero(dev: Device) {
        let _ = Tensor::arange(0.0, 1.0, 0.0, DType::F32, dev);
    }
}

#[test]
fn fill_patterns_are_the_cast_values_bits() {
    use super::cuda::fill_pattern;
    assert_eq!(fill_pattern(DType::F32, 1.5), 1.5f32.to_bits() as u64);
    assert_eq!(fill_pattern(DType::F64, -0.1), (-0.1f64).to_bits());
    assert_eq!(fill_pattern(DType::BF16, 1.0), half::bf16::from_f32(1.0).to_bits() as u64);
    assert_eq!(fill_pattern(DType::F16, 7.9), half::f16::from_f32(7.9).to_bits() as u64);
    assert_eq!(fill_pattern(DType::I64, -3.7), (-3i64) as u64);
    assert_eq!(fill_pattern(DType::U32, 4e9), 4_000_000_000u64);
    assert_eq!(fill_pattern(DType::U8, -1.0), 255);
    assert_eq!(fill_pattern(DType::Bool, 0.5), 1);
    assert_eq!(fill_pattern(DType::Bool, 0.0), 0);
}

/// The device generates every element itself; these must equal the CPU's bits exactly.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_creation_equals_cpu_bit_for_bit() {
    let gpu = Device::Cuda(0);
    let same = |a: Tensor, b: Tensor, what: &str| {
        assert_eq!((a.dims(), a.dtype()), (b.dims(), b.dtype()), "{what}");
        let (a, b) = (a.to_device(Device::Cpu).unwrap(), b.to_device(Device::Cpu).unwrap());
        let bits = |t: &Tensor| match &*t.storage() {
            crate::storage::Storage::Cpu(s) => s.as_bytes().to_vec(),
            crate::storage::Storage::Cuda(_) => unreachable!("copied to the host"),
        };
        assert_eq!(bits(&a), bits(&b), "{what}");
    };
    for dtype in DType::ALL {
        for value in [0.0, -0.0, 1.0, -1.5, 7.9, 1e10, -3e9, f64::NAN, 0.1] {
            let on = |dev| Tensor::full([3, 5], value, dtype, dev).unwrap();
            same(on(gpu), on(Device::Cpu), &format!("full {value} {dtype}"));
        }
        same(
            Tensor::zeros([1000], dtype, gpu).unwrap(),
            Tensor::zeros([1000], dtype, Device::Cpu).unwrap(),
            "zeros",
        );
        for (start, end, step) in
            [(0.0, 10.0, 1.0), (-3.3, 7.1, 0.37), (100.0, -250.5, -1.7), (0.0, 1e6, 0.1)]
        {
            let on = |dev| Tensor::arange(start, end, step, dtype, dev).unwrap();
            same(on(gpu), on(Device::Cpu), &format!("arange {start} {end} {step} {dtype}"));
        }
        for (start, end, steps) in
            [(0.0, 1.0, 7), (-5.5, 3.25, 1000), (2.0, 2.0, 1), (10.0, -10.0, 101), (0.0, 1.0, 0)]
        {
            let on = |dev| Tensor::linspace(start, end, steps, dtype, dev).unwrap();
            same(on(gpu), on(Device::Cpu), &format!("linspace {start} {end} {steps} {dtype}"));
        }
        for n in [0, 1, 17] {
            same(Tensor::eye(n, dtype, gpu).unwrap(), Tensor::eye(n, dtype, Device::Cpu).unwrap(), "eye");
        }
    }
}
