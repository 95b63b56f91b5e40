use super::{check, positive, randn};
use oxtrain_tensor::device_test;

device_test! {
    fn conv2d_gradients(dev: Device) {
        check(
            "conv2d with bias, stride, padding, dilation",
            |v| v[0].conv2d(&v[1], Some(&v[2]), [2, 1], [1, 1], [1, 2], 1),
            &[randn(&[1, 5, 4, 2], 1, dev).permute([0, 3, 1, 2]), randn(&[3, 2, 3, 2], 2, dev), randn(&[3], 3, dev)],
        );
        check(
            "conv2d groups, no bias",
            |v| v[0].conv2d(&v[1], None, [1, 1], [0, 0], [1, 1], 2),
            &[randn(&[1, 4, 4, 3], 4, dev), randn(&[2, 2, 2, 2], 5, dev)],
        );
    }
}

device_test! {
    fn pooling_gradients(dev: Device) {
        let x = || [randn(&[1, 4, 5, 2], 6, dev).permute([0, 3, 1, 2])]; // [1, 2, 4, 5], channels-last
        check("max_pool2d", |v| v[0].max_pool2d([2, 2], [2, 1], [1, 0], [1, 1], false), &x());
        check("max_pool2d dilated ceil", |v| v[0].max_pool2d([2, 2], [2, 2], [0, 1], [1, 2], true), &x());
        check("adaptive_max_pool2d", |v| v[0].adaptive_max_pool2d([3, 2]), &x());
        check("avg_pool2d", |v| v[0].avg_pool2d([3, 2], [2, 2], [1, 1], true, false, None), &x());
        check("avg_pool2d include pad", |v| v[0].avg_pool2d([2, 3], [1, 2], [1, 1], false, true, None), &x());
        check("avg_pool2d divisor", |v| v[0].avg_pool2d([2, 2], [2, 2], [0, 0], false, true, Some(3)), &x());
        check("adaptive_avg_pool2d", |v| v[0].adaptive_avg_pool2d([3, 2]), &x());
    }
}

device_test! {
    fn layer_norm_gradients(dev: Device) {
        check(
            "layer_norm affine",
            |v| v[0].layer_norm(4, Some(&v[1]), Some(&v[2]), 1e-5),
            &[randn(&[4, 3], 7, dev).t(), randn(&[4], 8, dev), randn(&[4], 9, dev)],
        );
        check("layer_norm whole input", |v| v[0].layer_norm([3, 4], None, None, 1e-5), &[randn(&[3, 4], 10, dev)]);
        check(
            "layer_norm bias only",
            |v| v[0].layer_norm([3, 4], None, Some(&v[1]), 1e-5),
            &[randn(&[2, 3, 4], 11, dev), randn(&[3, 4], 12, dev)],
        );
    }
}

device_test! {
    fn batch_norm_gradients(dev: Device) {
        check(
            "batch_norm training affine",
            |v| v[0].batch_norm_training(Some(&v[1]), Some(&v[2]), 1e-5).0,
            &[randn(&[3, 2, 2, 2], 13, dev), positive(&[2], 14, dev), randn(&[2], 15, dev)],
        );
        check(
            "batch_norm training [N, C]",
            |v| v[0].batch_norm_training(None, None, 1e-5).0,
            &[randn(&[3, 4], 16, dev).t()],
        );
        let (mean, var) = (randn(&[3], 17, dev), positive(&[3], 18, dev));
        check(
            "batch_norm eval",
            move |v| v[0].batch_norm_eval(&mean, &var, Some(&v[1]), Some(&v[2]), 1e-5),
            &[randn(&[2, 3, 2], 19, dev), randn(&[3], 20, dev), randn(&[3], 21, dev)],
        );
    }
}
