//! Ops with several outputs (`Var::from_multi_output_op`): one backward call that sees the
//! gradient of every output that got one, after all of their consumers.

use super::randn;
use crate::{no_grad, Var};
use oxtrain_tensor::testing::assert_close;
use oxtrain_tensor::{device_test, DType, Tensor};
use std::sync::{Arc, Mutex};

/// Which outputs had a gradient, per backward call.
type Calls = Arc<Mutex<Vec<Vec<bool>>>>;

/// `(2 x, x^2)` as one op whose backward records which output gradients it got.
fn double_and_square(x: &Var, calls: &Calls) -> (Var, Var) {
    let t = x.tensor().clone();
    let outputs = vec![t.mul_scalar(2.0), t.mul(&t)];
    let calls = calls.clone();
    let vars = Var::from_multi_output_op("double_and_square", outputs, &[x], move |g, _| {
        calls.lock().unwrap().push(g.iter().map(Option::is_some).collect());
        let from_double = g[0].as_ref().map(|g| g.mul_scalar(2.0));
        let from_square = g[1].as_ref().map(|g| g.mul(&t).mul_scalar(2.0));
        let total = match (from_double, from_square) {
            (Some(a), Some(b)) => a.add(&b),
            (a, b) => a.or(b).expect("called with a gradient"),
        };
        vec![Some(total)]
    });
    let mut it = vars.into_iter();
    (it.next().unwrap(), it.next().unwrap())
}

device_test! {
    fn a_multi_output_backward_runs_once_with_every_output_gradient(dev: Device) {
        let x = Var::parameter(randn(&[4], 1, dev));
        let calls = Calls::default();
        let (d, s) = double_and_square(&x, &calls);
        assert_eq!((d.dims(), s.dims()), (&[4][..], &[4][..]));
        // The square also reaches the loss through the double's consumer, so both outputs'
        // consumers must run before the op's backward.
        let loss = d.mul(&s.exp()).sum_all().add(&s.sum_all());
        loss.backward();
        assert_eq!(*calls.lock().unwrap(), vec![vec![true, true]], "one call with both gradients");
        // d/dx (2x e^{x^2} + x^2) = 2 e^{x^2} + 4 x^2 e^{x^2} + 2x.
        let t = x.tensor();
        let e = t.mul(t).exp();
        let want = e.mul_scalar(2.0).add(&t.mul(t).mul(&e).mul_scalar(4.0)).add(&t.mul_scalar(2.0));
        assert_close(&x.grad().unwrap(), &want, 1e-12, 1e-12, "gradient through both outputs");
    }
}

device_test! {
    fn an_unused_output_gives_none_and_the_op_still_runs(dev: Device) {
        for used in [0, 1] {
            let x = Var::parameter(randn(&[3], 2, dev));
            let calls = Calls::default();
            let (d, s) = double_and_square(&x, &calls);
            // The other output may even be dropped before backward.
            let out = if used == 0 {
                drop(s);
                d
            } else {
                drop(d);
                s
            };
            out.sum_all().backward();
            let want_called = if used == 0 { vec![true, false] } else { vec![false, true] };
            assert_eq!(*calls.lock().unwrap(), vec![want_called]);
            let want = if used == 0 { x.tensor().ones_like().mul_scalar(2.0) } else { x.tensor().mul_scalar(2.0) };
            assert_close(&x.grad().unwrap(), &want, 1e-12, 0.0, "gradient through one output");
        }
    }
}

device_test! {
    fn multi_output_ops_keep_the_engine_contracts(dev: Device) {
        // No grad: constants, no backward recorded.
        let x = Var::parameter(randn(&[3], 3, dev));
        let calls = Calls::default();
        let (d, s) = no_grad(|| double_and_square(&x, &calls));
        assert!(!d.requires_grad() && !s.requires_grad());
        // retain_graph: a second backward through the op adds the same gradient again.
        let (d, s) = double_and_square(&x, &calls);
        let loss = d.add(&s).sum_all();
        loss.backward_with(loss.tensor().ones_like(), true);
        let once = x.grad().unwrap();
        loss.backward();
        assert_close(&x.grad().unwrap(), &once.mul_scalar(2.0), 1e-12, 0.0, "twice");
        assert_eq!(calls.lock().unwrap().len(), 2);
        // Backward from an output itself.
        x.zero_grad();
        let (d, _) = double_and_square(&x, &calls);
        d.backward_with(d.tensor().ones_like(), false);
        assert_eq!(x.grad().unwrap().to_vec1::<f64>(), vec![2.0; 3]);
        // A long chain of them backwards and drops without deep recursion.
        let x = Var::parameter(Tensor::ones([2], DType::F64, dev).unwrap());
        let mut y = x.clone();
        for _ in 0..20_000 {
            let (d, _) = double_and_square(&y, &calls);
            y = d.mul_scalar(0.5);
        }
        y.sum_all().backward();
        assert_eq!(x.grad().unwrap().to_vec1::<f64>(), vec![1.0; 2]);
        let mut y = x.clone();
        for _ in 0..50_000 {
            y = double_and_square(&y, &calls).1.mul_scalar(0.0).add_scalar(1.0);
        }
        drop(y);
    }
}
