//! Test helpers shared by the op families: fixture loading, closeness checks, and the
//! `device_test!` macro that makes one test per device.
//!
//! Fixtures are JSON files written by a committed Python script beside them (numpy or PyTorch
//! as the independent reference) and embedded with `include_str!`, so test binaries carry them
//! to machines without this checkout (the GPU machine).

use crate::{DType, Device, Tensor, UnaryOp};
use std::collections::BTreeMap;

/// Every [`UnaryOp`], the parameterised ones with parameters that keep the results finite on
/// inputs in [-2, 2]: the list the unary tests of every backend run. A new op goes here.
pub const UNARY_OPS: [UnaryOp; 24] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Log1p,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Sign,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
    UnaryOp::Affine { mul: 1.5, add: -0.25 },
    UnaryOp::Powf(2.0),
    UnaryOp::Clamp { min: -1.0, max: 0.5 },
];

/// One fixture file: named cases, each a map from names to tensors (inputs, outputs, and
/// scalar parameters stored as rank-0 tensors).
pub struct Fixtures {
    cases: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    file: &'static str,
}

impl Fixtures {
    /// Parses fixture JSON: `{"case": {"name": {"dtype": "float32", "shape": [..], "data": [..]}, ...}}`.
    pub fn parse(json: &str, file: &'static str) -> Fixtures {
        let cases = serde_json::from_str(json).unwrap_or_else(|e| panic!("{file}: bad fixture JSON: {e}"));
        Fixtures { cases, file }
    }

    pub fn case_names(&self) -> impl Iterator<Item = &str> {
        self.cases.keys().map(String::as_str)
    }

    fn value(&self, case: &str, name: &str) -> &serde_json::Value {
        self.cases
            .get(case)
            .unwrap_or_else(|| panic!("{}: no case `{case}`", self.file))
            .get(name)
            .unwrap_or_else(|| panic!("{}: case `{case}` has no `{name}`", self.file))
    }

    /// A tensor of the fixture, on `device`, in the dtype the fixture names.
    pub fn tensor(&self, case: &str, name: &str, device: Device) -> Tensor {
        let v = self.value(case, name);
        let dtype = match v["dtype"].as_str().unwrap_or("float64") {
            "float32" => DType::F32,
            "float64" => DType::F64,
            "float16" => DType::F16,
            "bfloat16" => DType::BF16,
            "int64" => DType::I64,
            "uint32" => DType::U32,
            "uint8" => DType::U8,
            "bool" => DType::Bool,
            other => panic!("{}: case `{case}`, `{name}`: unknown dtype {other}", self.file),
        };
        let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).expect("fixture shape");
        let data: Vec<f64> = v["data"]
            .as_array()
            .expect("fixture data")
            .iter()
            .map(|x| match x {
                serde_json::Value::Bool(b) => *b as u8 as f64,
                serde_json::Value::String(s) => match s.as_str() {
                    "nan" => f64::NAN,
                    "inf" => f64::INFINITY,
                    "-inf" => f64::NEG_INFINITY,
                    _ => panic!("fixture number {s}"),
                },
                x => x.as_f64().expect("fixture number"),
            })
            .collect();
        let t = Tensor::from_vec(data, shape, Device::Cpu).unwrap().to_dtype(dtype);
        t.to_device(device).unwrap()
    }

    /// A scalar parameter of a case (a bare JSON number).
    pub fn scalar(&self, case: &str, name: &str) -> f64 {
        self.value(case, name)
            .as_f64()
            .unwrap_or_else(|| panic!("{}: `{case}.{name}` is not a number", self.file))
    }

    /// A list-of-integers parameter of a case.
    pub fn ints(&self, case: &str, name: &str) -> Vec<i64> {
        serde_json::from_value(self.value(case, name).clone())
            .unwrap_or_else(|_| panic!("{}: `{case}.{name}` is not a list of integers", self.file))
    }
}

/// Asserts `|actual - expected| <= atol + rtol * |expected|` elementwise (NaNs must match),
/// with a message naming `what`, the first bad index and both values.
#[track_caller]
pub fn assert_close(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64, what: &str) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shapes differ");
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    for (i, (&x, &y)) in a.iter().zip(&e).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * y.abs()
        };
        assert!(ok, "{what}: element {i} is {x}, expected {y} (rtol {rtol}, atol {atol})");
    }
}

/// Default tolerances for comparing a result of `dtype` with a reference.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (2e-3, 1e-3),
        DType::BF16 => (1e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// Defines a test body that takes a [`Device`](crate::Device), and one `#[test]` per device
/// that runs it: `name::cpu`, and `name::cuda`, which is ignored unless asked for
/// (`cargo test -- --include-ignored` on a machine with a GPU). Attributes such as
/// `#[should_panic]` go on the generated tests.
#[macro_export]
macro_rules! device_test {
    ($(#[$meta:meta])* fn $name:ident($dev:ident: Device) $body:block) => {
        #[allow(dead_code)]
        fn $name($dev: $crate::Device) $body
        mod $name {
            #[test]
            $(#[$meta])*
            fn cpu() {
                super::$name($crate::Device::Cpu)
            }
            #[test]
            #[ignore = "needs a CUDA GPU"]
            $(#[$meta])*
            fn cuda() {
                super::$name($crate::Device::Cuda(0))
            }
        }
    };
}
