use super::{check, positive, randn};
use crate::Var;
use oxtrain_tensor::{device_test, CmpOp};

type UnaryCase = (&'static str, fn(&Var) -> Var);

/// Functions checked on normal samples (kinks at 0 are never hit by random values).
const ANYWHERE: &[UnaryCase] = &[
    ("neg", |x| x.neg()),
    ("neg operator", |x| -x),
    ("affine", |x| x.affine(-1.5, 0.25)),
    ("add_scalar", |x| x.add_scalar(3.0)),
    ("mul_scalar", |x| x.mul_scalar(-2.0)),
    ("var + f64", |x| x + 2.0),
    ("var - f64", |x| x - 2.0),
    ("f64 - var", |x| 2.0 - x),
    ("var * f64", |x| x * 3.0),
    ("f64 * var", |x| 3.0 * x),
    ("var / f64", |x| x / 4.0),
    ("exp", |x| x.exp()),
    ("sin", |x| x.sin()),
    ("cos", |x| x.cos()),
    ("tanh", |x| x.tanh()),
    ("sigmoid", |x| x.sigmoid()),
    ("relu", |x| x.relu()),
    ("gelu", |x| x.gelu()),
    ("gelu_tanh", |x| x.gelu_tanh()),
    ("silu", |x| x.silu()),
    ("square", |x| x.square()),
    ("abs", |x| x.abs()),
    ("clamp", |x| x.clamp(-0.5, 0.7)),
    ("powf integer", |x| x.powf(3.0)),
];

/// Functions checked on samples in [0.5, 2.5).
const POSITIVE: &[UnaryCase] = &[
    ("log", |x| x.log()),
    ("log1p", |x| x.log1p()),
    ("sqrt", |x| x.sqrt()),
    ("rsqrt", |x| x.rsqrt()),
    ("recip", |x| x.recip()),
    ("f64 / var", |x| 2.0 / x),
    ("powf fractional", |x| x.powf(-1.7)),
];

device_test! {
    fn unary_functions_on_strided_inputs(dev: Device) {
        for (i, (name, f)) in ANYWHERE.iter().enumerate() {
            // A transposed view and a narrowed view, so the ops read strided inputs.
            let x = randn(&[4, 3], i as u64, dev).t();
            check(name, |v| f(&v[0]), &[x]);
            let x = randn(&[5, 4], 100 + i as u64, dev).narrow(0, 1, 3);
            check(name, |v| f(&v[0]), &[x]);
        }
        for (i, (name, f)) in POSITIVE.iter().enumerate() {
            let x = positive(&[4, 3], i as u64, dev).t();
            check(name, |v| f(&v[0]), &[x]);
        }
    }
}

device_test! {
    fn gelu_at_zero_has_gradient_one_half(dev: Device) {
        let x = Var::parameter(oxtrain_tensor::Tensor::zeros([2], oxtrain_tensor::DType::F64, dev).unwrap());
        x.gelu().sum_all().backward();
        assert_eq!(x.grad().unwrap().to_vec1::<f64>(), vec![0.5, 0.5]);
    }
}

type BinaryCase = (&'static str, fn(&Var, &Var) -> Var);

const BINARY: &[BinaryCase] = &[
    ("add", |a, b| a.add(b)),
    ("sub", |a, b| a.sub(b)),
    ("mul", |a, b| a.mul(b)),
    ("div", |a, b| a.div(b)),
    ("maximum", |a, b| a.maximum(b)),
    ("minimum", |a, b| a.minimum(b)),
    ("pow", |a, b| a.pow(b)),
    ("+ operator", |a, b| a + b),
    ("- operator", |a, b| a - b),
    ("* operator", |a, b| a * b),
    ("/ operator", |a, b| a / b),
    ("owned operators", |a, b| a.clone() * b.clone() + a.clone()),
];

device_test! {
    fn binary_ops_broadcast_and_strided(dev: Device) {
        for (i, (name, f)) in BINARY.iter().enumerate() {
            let s = 10 * i as u64;
            // Positive operands keep div and pow well defined.
            let same = [positive(&[3, 4], s, dev).t(), positive(&[4, 3], s + 1, dev)];
            check(name, |v| f(&v[0], &v[1]), &same);
            // [2, 1, 3] with [4, 1]: both sides broadcast.
            let bcast = [positive(&[2, 1, 3], s + 2, dev), positive(&[5, 4], s + 3, dev).narrow(1, 2, 1).narrow(0, 0, 4)];
            check(name, |v| f(&v[0], &v[1]), &bcast);
            // A scalar operand and an expanded one.
            let scalar = [positive(&[], s + 4, dev), positive(&[3], s + 5, dev)];
            check(name, |v| f(&v[0], &v[1].expand([2, -1])), &scalar);
        }
    }
}

device_test! {
    fn the_same_var_on_both_sides(dev: Device) {
        check("x * x", |v| v[0].mul(&v[0]), &[randn(&[3], 1, dev)]);
        check("x / (x + 3)", |v| v[0].div(&(&v[0] + 3.0)), &[positive(&[3], 2, dev)]);
    }
}

device_test! {
    fn ties_split_the_gradient(dev: Device) {
        let a = Var::parameter(oxtrain_tensor::Tensor::new([1.0f64, 2.0], dev).unwrap());
        let b = Var::parameter(oxtrain_tensor::Tensor::new([1.0f64, 3.0], dev).unwrap());
        a.maximum(&b).sum_all().backward();
        assert_eq!(a.grad().unwrap().to_vec1::<f64>(), vec![0.5, 0.0]);
        assert_eq!(b.grad().unwrap().to_vec1::<f64>(), vec![0.5, 1.0]);
    }
}

device_test! {
    fn where_and_masked_fill(dev: Device) {
        let mask = randn(&[3, 4], 1, dev).cmp_scalar(0.0, CmpOp::Gt);
        let m = mask.clone();
        check(
            "where_cond",
            move |v| Var::where_cond(&m, &v[0], &v[1]),
            &[randn(&[4, 3], 2, dev).t(), randn(&[4], 3, dev)],
        );
        let m = mask.narrow(0, 0, 1);
        check("masked_fill", move |v| v[0].masked_fill(&m, 2.0), &[randn(&[3, 4], 4, dev)]);
    }
}
