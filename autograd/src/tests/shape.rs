use super::{check, randn};
use crate::Var;
use oxtrain_tensor::{device_test, DType};

device_test! {
    fn regrouping_views(dev: Device) {
        let x = || [randn(&[4, 6], 1, dev).t()]; // [6, 4], strided: reshape copies
        check("reshape", |v| v[0].reshape([3, -1, 2]), &x());
        check("reshape contiguous", |v| v[0].contiguous().view([2, 12]), &x());
        check("flatten", |v| v[0].unsqueeze(0).flatten(1, 2), &x());
        check("flatten_all", |v| v[0].flatten_all(), &x());
        check("unsqueeze squeeze", |v| v[0].unsqueeze(-1).mul(&v[0].unsqueeze(2)).squeeze(2), &x());
        check("squeeze_all", |v| v[0].unsqueeze(0).unsqueeze(3).squeeze_all(), &x());
        check("to_dtype f64", |v| v[0].to_dtype(DType::F64).exp(), &x());
    }
}

device_test! {
    fn conversion_to_f32_and_back(dev: Device) {
        // f32 rounding limits the finite differences; the gradient must still come back as f64.
        let x = randn(&[3], 2, dev);
        let f = |v: &[Var]| v[0].to_dtype(DType::F32).square().to_dtype(DType::F64);
        crate::gradcheck(f, &[x], 1e-3, 1e-3).unwrap();
    }
}

device_test! {
    fn reordering_views(dev: Device) {
        let x = || [randn(&[2, 3, 4], 3, dev)];
        check("permute", |v| v[0].permute([2, 0, 1]).exp(), &x());
        check("permute negative dims", |v| v[0].permute([-1, -3, -2]).mul(&v[0].transpose(0, 2).transpose(1, 2)), &x());
        check("transpose", |v| v[0].transpose(0, -1).sin(), &x());
        check("t", |v| v[0].select(0, 1).t().exp(), &x());
    }
}

device_test! {
    fn narrowing_views(dev: Device) {
        let x = || [randn(&[5, 4], 4, dev).t()];
        check("narrow middle", |v| v[0].narrow(1, 1, 3).exp(), &x());
        check("narrow start", |v| v[0].narrow(0, 0, 2).exp(), &x());
        check("narrow end", |v| v[0].narrow(-1, 3, 2).exp(), &x());
        check("slice step", |v| v[0].slice(1, 1, 5, 2).exp(), &x());
        check("slice unit step", |v| v[0].slice(0, 1, 10, 1).exp(), &x());
        check("select", |v| v[0].select(1, 2).exp(), &x());
        check("select twice", |v| v[0].select(0, 1).add(&v[0].select(0, 1)), &x());
    }
}

device_test! {
    fn broadcasting_views(dev: Device) {
        let x = || [randn(&[3, 1], 5, dev)];
        check("broadcast_as", |v| v[0].broadcast_as([2, 3, 4]).exp(), &x());
        check("expand", |v| v[0].expand([2, -1, 5]).sin(), &x());
    }
}

device_test! {
    fn joining_and_splitting(dev: Device) {
        let xs = || [randn(&[2, 3], 6, dev), randn(&[3, 4], 7, dev).t().narrow(0, 0, 1), randn(&[2, 3], 8, dev)];
        check("cat dim 0", |v| Var::cat(v, 0).exp(), &xs());
        check("cat dim 1", |v| Var::cat(&[v[0].t(), v[2].t()], -1).exp(), &xs());
        check("stack", |v| Var::stack(&[v[0].clone(), v[2].clone()], 1).exp(), &xs());
        let x = || [randn(&[7, 2], 9, dev)];
        let parts = |v: Vec<Var>| {
            let weighted: Vec<Var> = v.iter().enumerate().map(|(i, p)| p.mul_scalar(i as f64 + 1.0).sum_all()).collect();
            Var::stack(&weighted, 0)
        };
        check("split", |v| parts(v[0].split(3, 0)), &x());
        check("split_sizes", |v| parts(v[0].split_sizes(&[1, 4, 2], 0)), &x());
        check("chunk", |v| parts(v[0].chunk(2, -1)), &x());
    }
}
