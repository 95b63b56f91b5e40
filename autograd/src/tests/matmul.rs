use super::{check, randn};
use oxtrain_tensor::device_test;

device_test! {
    fn matrix_products(dev: Device) {
        check("2d @ 2d", |v| v[0].matmul(&v[1]), &[randn(&[3, 4], 1, dev), randn(&[5, 4], 2, dev).t()]);
        check("strided lhs", |v| v[0].matmul(&v[1]), &[randn(&[4, 3], 3, dev).t(), randn(&[4, 2], 4, dev)]);
        check("dot", |v| v[0].matmul(&v[1]), &[randn(&[4], 5, dev), randn(&[4], 6, dev)]);
        check("vec @ mat", |v| v[0].matmul(&v[1]), &[randn(&[4], 7, dev), randn(&[4, 3], 8, dev)]);
        check("mat @ vec", |v| v[0].matmul(&v[1]), &[randn(&[2, 4], 9, dev), randn(&[4], 10, dev)]);
    }
}

device_test! {
    fn batched_products(dev: Device) {
        check(
            "broadcast batch",
            |v| v[0].matmul(&v[1]),
            &[randn(&[2, 1, 3, 4], 11, dev), randn(&[3, 4, 2], 12, dev)],
        );
        check("batch @ matrix", |v| v[0].matmul(&v[1]), &[randn(&[2, 3, 4], 13, dev), randn(&[4, 2], 14, dev)]);
        check("batch @ vec", |v| v[0].matmul(&v[1]), &[randn(&[2, 3, 4], 15, dev), randn(&[4], 16, dev)]);
        // The matrix's gradient is one product over every row of the batch: also when the
        // batch is a view whose rows do not stack (a copy first) and when it has two dims.
        check(
            "transposed batch @ matrix",
            |v| v[0].matmul(&v[1]),
            &[randn(&[3, 2, 4], 21, dev).transpose(0, 1), randn(&[4, 5], 22, dev)],
        );
        check("4-d batch @ matrix", |v| v[0].matmul(&v[1]), &[randn(&[2, 2, 3, 4], 23, dev), randn(&[4, 2], 24, dev)]);
        // A transposed matrix (a tied head, `x @ w.t()`) gets its gradient in its own layout.
        check(
            "batch @ transposed matrix",
            |v| v[0].matmul(&v[1].t()),
            &[randn(&[2, 3, 4], 25, dev), randn(&[5, 4], 26, dev)],
        );
        check("vec @ batch", |v| v[0].matmul(&v[1]), &[randn(&[3], 17, dev), randn(&[2, 3, 4], 18, dev)]);
        check(
            "bmm transposed",
            |v| v[0].bmm(&v[1].transpose(1, 2)),
            &[randn(&[2, 3, 4], 19, dev), randn(&[2, 5, 4], 20, dev)],
        );
    }
}
