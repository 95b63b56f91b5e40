use super::{check, randn};
use crate::Var;
use oxtrain_tensor::{device_test, Tensor};

device_test! {
    fn index_select_with_repeats(dev: Device) {
        let idx = Tensor::new([2i64, 0, 2, 1], dev).unwrap();
        let i = idx.clone();
        check("index_select dim 0", move |v| v[0].index_select(0, &i), &[randn(&[4, 3], 1, dev).t()]);
        let i = idx.clone();
        check("index_select dim -1", move |v| v[0].index_select(-1, &i), &[randn(&[2, 3], 2, dev)]);
        let scalar = Tensor::new(1i64, dev).unwrap();
        check("index_select 0-d", move |v| v[0].index_select(1, &scalar), &[randn(&[2, 3], 3, dev)]);
    }
}

device_test! {
    fn gather_and_scatter_add(dev: Device) {
        let index = Tensor::new([[0i64, 2, 2], [1, 0, 1]], dev).unwrap();
        let i = index.clone();
        check("gather dim 1", move |v| v[0].gather(1, &i), &[randn(&[4, 2], 4, dev).t()]);
        let i = index.clone();
        check("gather dim 0", move |v| v[0].gather(0, &i), &[randn(&[3, 3], 5, dev)]);
        let i = index.clone();
        check("scatter_add", move |v| v[0].scatter_add(1, &i, &v[1]), &[randn(&[2, 4], 6, dev), randn(&[3, 2], 7, dev).t()]);
    }
}

device_test! {
    fn embedding_and_index_add(dev: Device) {
        let ids = Tensor::new([[1i64, 3], [1, 0]], dev).unwrap();
        check("embedding", move |v| Var::embedding(&ids, &v[0]), &[randn(&[4, 3], 8, dev)]);
        let index = Tensor::new([0i64, 2, 0], dev).unwrap();
        check(
            "index_add",
            move |v| v[0].index_add(1, &index, &v[1], 0.5),
            &[randn(&[2, 3], 9, dev), randn(&[3, 2], 10, dev).t()],
        );
    }
}
