//! Tests of dtype conversion against PyTorch fixtures (`fixtures.py` beside this file).

use crate::testing::{assert_close, Fixtures};
use crate::{DType, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "convert/fixtures.json")
}

fn dtype_named(name: &str) -> DType {
    DType::ALL.into_iter().find(|d| d.as_str() == name).unwrap_or_else(|| panic!("no dtype {name}"))
}

crate::device_test! {
    fn every_pair_of_dtypes_converts_like_torch(dev: Device) {
        let fx = fixtures();
        let mut pairs = 0;
        for case in fx.case_names() {
            let (_, to) = case.split_once("->").unwrap();
            let to = dtype_named(to);
            let x = fx.tensor(case, "x", dev);
            let expected = fx.tensor(case, "y", dev);
            let y = x.to_dtype(to);
            assert_eq!(y.dtype(), to, "{case}");
            // Exact: a conversion has one right answer (NaN matches NaN).
            assert_close(&y, &expected, 0.0, 0.0, case);
            // A strided view converts the same: every other element of a wider copy.
            let n = x.elem_count();
            let strided = x.unsqueeze(1).expand([n as i64, 2]).copy().select(1, 1);
            assert_close(&strided.to_dtype(to), &expected, 0.0, 0.0, &format!("{case} (strided)"));
            pairs += 1;
        }
        assert_eq!(pairs, 56, "every ordered pair of the 8 dtypes");
    }
}

crate::device_test! {
    fn signed_zero_survives_float_conversions(dev: Device) {
        let x = Tensor::new([-0.0f32, 0.0], dev).unwrap();
        for dtype in [DType::F64, DType::F16, DType::BF16] {
            let back = x.to_dtype(dtype).to_dtype(DType::F32).to_vec::<f32>();
            let signs: Vec<bool> = back.iter().map(|v| v.is_sign_negative()).collect();
            assert_eq!(signs, vec![true, false], "{dtype}");
        }
    }
}

crate::device_test! {
    fn integers_beyond_f64_precision_convert_exactly(dev: Device) {
        // Values JSON cannot carry: checked against Rust's own `as` casts.
        let values = [i64::MAX, i64::MIN, (1 << 62) + 1, -(1 << 53) - 1];
        let x = Tensor::new(values, dev).unwrap();
        assert_eq!(x.to_dtype(DType::U32).to_vec::<u32>(), values.map(|v| v as u32));
        assert_eq!(x.to_dtype(DType::U8).to_vec::<u8>(), values.map(|v| v as u8));
        assert_eq!(x.to_dtype(DType::F32).to_vec::<f32>(), values.map(|v| v as f32));
        assert_eq!(x.to_dtype(DType::U32).to_dtype(DType::I64).to_vec::<i64>(), values.map(|v| v as u32 as i64));
    }
}

crate::device_test! {
    fn same_dtype_is_a_cheap_clone(dev: Device) {
        let x = Tensor::new([1f32, 2.0], dev).unwrap();
        assert!(x.to_dtype(DType::F32).same_storage(&x));
        assert!(!x.to_dtype(DType::F64).same_storage(&x));
    }
}
