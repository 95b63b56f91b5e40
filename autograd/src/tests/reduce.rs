use super::{check, randn};
use crate::Var;
use oxtrain_tensor::{device_test, Tensor};

device_test! {
    fn sum_and_mean_over_dims(dev: Device) {
        let x = || [randn(&[4, 2, 3], 1, dev).permute([2, 0, 1])]; // [3, 4, 2], strided
        check("sum dim", |v| v[0].sum(1, false), &x());
        check("sum keepdim", |v| v[0].sum([0, -1], true), &x());
        check("sum all dims", |v| v[0].sum(&[] as &[usize], false), &x());
        check("sum_all", |v| v[0].sum_all(), &x());
        check("mean dim", |v| v[0].mean(-1, false), &x());
        check("mean keepdim", |v| v[0].mean([0, 2], true), &x());
        check("mean_all", |v| v[0].mean_all(), &x());
        check("sum of a scalar", |v| v[0].sum(0, false), &[randn(&[], 2, dev)]);
    }
}

device_test! {
    fn max_and_min_over_dims(dev: Device) {
        let x = || [randn(&[5, 4], 3, dev).t()];
        check("max dim", |v| v[0].max(1, false), &x());
        check("max keepdim", |v| v[0].max(0, true), &x());
        check("max_all", |v| v[0].max_all(), &x());
        check("min dim", |v| v[0].min(-1, true), &x());
        check("min_all", |v| v[0].min_all(), &x());
    }
}

device_test! {
    fn tied_maxima_share_the_gradient(dev: Device) {
        let x = Var::parameter(Tensor::new([[1.0f64, 3.0, 3.0], [2.0, 0.0, 1.0]], dev).unwrap());
        x.max(1, false).sum_all().backward();
        assert_eq!(x.grad().unwrap().to_vec2::<f64>(), vec![vec![0.0, 0.5, 0.5], vec![1.0, 0.0, 0.0]]);
    }
}

device_test! {
    fn var_std_logsumexp(dev: Device) {
        let x = || [randn(&[3, 5], 4, dev).narrow(1, 1, 4)];
        check("var unbiased", |v| v[0].var(1, 1, false), &x());
        check("var population keepdim", |v| v[0].var([0, 1], 0, true), &x());
        check("std", |v| v[0].std(0, 1, false), &x());
        check("logsumexp", |v| v[0].logsumexp(-1, false), &x());
        check("logsumexp keepdim", |v| v[0].logsumexp(0, true), &x());
    }
}

device_test! {
    fn softmax_and_log_softmax(dev: Device) {
        let x = || [randn(&[4, 3, 2], 5, dev).transpose(0, 2)];
        for dim in [0, 1, -1] {
            check("softmax", |v| v[0].softmax(dim), &x());
            check("log_softmax", |v| v[0].log_softmax(dim), &x());
        }
    }
}
