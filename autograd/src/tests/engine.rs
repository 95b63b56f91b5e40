use super::randn;
use crate::{is_grad_enabled, no_grad, Var};
use oxtrain_tensor::{device_test, DType, Tensor};
use std::sync::{Arc, Mutex};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn vars_move_between_threads() {
    assert_send_sync::<Var>();
    assert_send_sync::<crate::HookHandle>();
}

/// A 3-layer perceptron; returns the loss. `w1` is also used by a second path (a penalty), so
/// its gradient is complete only after two contributions.
fn three_layers(x: &Var, layers: &[(Var, Var)]) -> Var {
    let mut h = x.clone();
    for (i, (w, b)) in layers.iter().enumerate() {
        h = h.matmul(w).add(b);
        if i + 1 < layers.len() {
            h = h.tanh();
        }
    }
    h.square().mean_all() + layers[0].0.square().sum_all() * 0.01
}

device_test! {
    fn hooks_fire_once_per_parameter_in_reverse_layer_order(dev: Device) {
        let dims = [4, 5, 3, 2];
        let layers: Vec<(Var, Var)> = (0..3)
            .map(|i| {
                let w = Var::parameter(randn(&[dims[i], dims[i + 1]], i as u64, dev));
                let b = Var::parameter(randn(&[dims[i + 1]], 10 + i as u64, dev));
                (w, b)
            })
            .collect();
        let x = Var::constant(randn(&[6, 4], 99, dev));
        let fired: Arc<Mutex<Vec<(String, Tensor)>>> = Arc::default();
        let mut handles = vec![];
        for (i, (w, b)) in layers.iter().enumerate() {
            for (name, p) in [(format!("w{}", i + 1), w), (format!("b{}", i + 1), b)] {
                let log = fired.clone();
                handles.push(p.register_hook(move |g| log.lock().unwrap().push((name.clone(), g.copy()))));
            }
        }
        for round in 1..=2 {
            three_layers(&x, &layers).backward();
            let events = fired.lock().unwrap().clone();
            // Returned from backward: every hook has fired, exactly once this round.
            assert_eq!(events.len(), 6 * round, "round {round}: {:?}", events.iter().map(|e| &e.0).collect::<Vec<_>>());
            let names: Vec<&str> = events[6 * (round - 1)..].iter().map(|e| e.0.as_str()).collect();
            let layer_of = |n: &str| n[1..].parse::<usize>().unwrap();
            let order: Vec<usize> = names.iter().map(|n| layer_of(n)).collect();
            assert!(order.windows(2).all(|w| w[0] >= w[1]), "hooks not in reverse layer order: {names:?}");
            // Each hook saw the complete gradient: what .grad() holds after backward.
            for (name, seen) in &events[6 * (round - 1)..] {
                let l = layer_of(name) - 1;
                let p = if name.starts_with('w') { &layers[l].0 } else { &layers[l].1 };
                assert_eq!(seen.to_f64_vec(), p.grad().unwrap().to_f64_vec(), "{name} in round {round}");
            }
            for (w, b) in &layers {
                w.zero_grad();
                b.zero_grad();
            }
        }
        // w1's gradient includes the penalty path: compare with a run without it.
        handles.into_iter().for_each(|h| h.remove());
        three_layers(&x, &layers).backward();
        let with_penalty = layers[0].0.grad().unwrap();
        assert_eq!(fired.lock().unwrap().len(), 12, "removed hooks must not fire");
        let penalty = layers[0].0.tensor().mul_scalar(0.02);
        layers[0].0.zero_grad();
        let mut h = x.clone();
        for (i, (w, b)) in layers.iter().enumerate() {
            h = h.matmul(w).add(b);
            if i < 2 {
                h = h.tanh();
            }
        }
        h.square().mean_all().backward();
        let without = layers[0].0.grad().unwrap();
        oxtrain_tensor::testing::assert_close(&with_penalty, &without.add(&penalty), 1e-12, 1e-12, "w1 grad");
    }
}

device_test! {
    fn retain_graph_allows_a_second_backward(dev: Device) {
        let x = Var::parameter(randn(&[3], 1, dev));
        let y = x.exp().sum_all();
        y.backward_with(y.tensor().ones_like(), true);
        let once = x.grad().unwrap();
        y.backward_with(y.tensor().ones_like(), true);
        oxtrain_tensor::testing::assert_close(&x.grad().unwrap(), &once.mul_scalar(2.0), 1e-12, 0.0, "twice");
        y.backward();
        oxtrain_tensor::testing::assert_close(&x.grad().unwrap(), &once.mul_scalar(3.0), 1e-12, 0.0, "thrice");
    }
}

device_test! {
    #[should_panic(expected = "backward through the graph a second time")]
    fn a_second_backward_without_retain_graph_panics(dev: Device) {
        let x = Var::parameter(randn(&[3], 1, dev));
        let y = x.exp().sum_all();
        y.backward();
        y.backward();
    }
}

device_test! {
    fn no_grad_records_nothing(dev: Device) {
        let x = Var::parameter(randn(&[3], 1, dev));
        assert!(is_grad_enabled());
        let y = no_grad(|| {
            assert!(!is_grad_enabled());
            let inner = no_grad(|| x.exp());
            assert!(!is_grad_enabled(), "nested no_grad restores the outer state");
            inner.add(&x)
        });
        assert!(is_grad_enabled());
        assert!(!y.requires_grad());
        assert!(x.exp().requires_grad());
        // A panic inside no_grad still restores recording.
        let _ = std::panic::catch_unwind(|| no_grad(|| panic!("inside no_grad")));
        assert!(is_grad_enabled());
        // Ops of constants record nothing either.
        assert!(!Var::constant(randn(&[3], 2, dev)).exp().requires_grad());
    }
}

device_test! {
    fn backward_frees_saved_tensors(dev: Device) {
        let a = Var::parameter(randn(&[4], 1, dev));
        let b = Var::parameter(randn(&[4], 2, dev));
        let e = a.exp(); // saves its output
        let e_value = e.tensor().clone();
        let loss = e.mul(&b).sum_all(); // saves both operands
        drop(e);
        // Our handle plus exp's saved output plus mul's saved operand.
        assert_eq!(e_value.storage_ref_count(), 3);
        assert_eq!(b.tensor().storage_ref_count(), 2);
        loss.backward_with(loss.tensor().ones_like(), true);
        assert_eq!(e_value.storage_ref_count(), 3, "retain_graph keeps saved tensors");
        loss.backward();
        assert_eq!(e_value.storage_ref_count(), 1, "saved tensors outlive backward");
        assert_eq!(b.tensor().storage_ref_count(), 1);
        assert_eq!(a.tensor().storage_ref_count(), 1);
        // Dropping a graph that never ran backward frees its saved tensors too.
        let loss = a.mul(&b).sum_all();
        assert_eq!(b.tensor().storage_ref_count(), 2);
        drop(loss);
        assert_eq!(b.tensor().storage_ref_count(), 1);
    }
}

device_test! {
    fn deep_chains_do_not_overflow_the_stack(dev: Device) {
        let x = Var::parameter(Tensor::ones([2], DType::F64, dev).unwrap());
        let mut y = x.clone();
        for i in 0..10_000 {
            y = if i % 2 == 0 { y.mul_scalar(1.0001) } else { y.add_scalar(0.5) };
        }
        y.sum_all().backward();
        let expected = 1.0001f64.powi(5000);
        for g in x.grad().unwrap().to_vec1::<f64>() {
            assert!((g - expected).abs() < 1e-9 * expected, "{g} vs {expected}");
        }
        // Built and dropped without backward: the graph's destruction is iterative too.
        let mut y = x.clone();
        for _ in 0..50_000 {
            y = y.add_scalar(1.0);
        }
        drop(y);
    }
}

device_test! {
    fn leaf_gradients_do_not_alias(dev: Device) {
        let a = Var::parameter(randn(&[3], 1, dev));
        let b = Var::parameter(randn(&[3], 2, dev));
        a.add(&b).sum_all().backward();
        let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
        assert!(!ga.same_storage(&gb));
        assert_eq!(ga.to_vec1::<f64>(), vec![1.0; 3]);
        // Broadcast gradients reach a leaf summed to its shape and contiguous.
        let c = Var::parameter(randn(&[3, 1], 3, dev));
        c.broadcast_as([2, 3, 4]).sum_all().backward();
        let gc = c.grad().unwrap();
        assert_eq!(gc.dims(), &[3, 1]);
        assert!(gc.is_contiguous());
        assert_eq!(gc.to_vec::<f64>(), vec![8.0; 3]);
    }
}

device_test! {
    fn detach_and_constants(dev: Device) {
        let x = Var::parameter(randn(&[3], 1, dev));
        let y = x.exp().detach().mul(&x).sum_all();
        y.backward();
        // d/dx (c * x) with c = exp(x) held constant.
        oxtrain_tensor::testing::assert_close(&x.grad().unwrap(), &x.tensor().exp(), 1e-12, 0.0, "detach");
        assert!(x.is_leaf() && !x.exp().is_leaf());
        assert!(x.exp().grad().is_none());
    }
}

device_test! {
    #[should_panic(expected = "does not require grad")]
    fn backward_of_a_constant_panics(dev: Device) {
        Var::constant(randn(&[], 1, dev)).backward();
    }
}

device_test! {
    #[should_panic(expected = "hooks go on leaves")]
    fn hooks_only_on_leaves(dev: Device) {
        Var::parameter(randn(&[2], 1, dev)).exp().register_hook(|_| {});
    }
}

device_test! {
    fn a_hook_fires_while_backward_still_runs(dev: Device) {
        let w1 = Var::parameter(randn(&[3, 3], 1, dev));
        let w2 = Var::parameter(randn(&[3, 3], 2, dev));
        let x = Var::constant(randn(&[2, 3], 3, dev));
        let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
        let (log, first) = (seen.clone(), w1.clone());
        // When w2's gradient is final, w1's (an earlier layer) has not been computed yet.
        let _h = w2.register_hook(move |_| log.lock().unwrap().push(first.grad().is_some()));
        x.matmul(&w1).tanh().matmul(&w2).sum_all().backward();
        assert_eq!(*seen.lock().unwrap(), vec![false]);
        assert!(w1.grad().is_some());
    }
}

device_test! {
    fn summing_gradients_in_place_leaves_a_shared_gradient_alone(dev: Device) {
        // `add` hands one gradient tensor to both x and y (an op, whose gradient waits in the
        // engine). x's gradient arrives first from `add` (the newer op), then from
        // `mul_scalar`: adding the second into the first in place would change y's too.
        let (x, y0) = (Var::parameter(randn(&[3], 1, dev)), Var::parameter(randn(&[3], 2, dev)));
        let y = y0.mul_scalar(1.0);
        let p = x.mul_scalar(3.0);
        let s = x.add(&y);
        p.mul(&s).sum_all().backward();
        let (xv, yv) = (x.tensor().to_f64_vec(), y0.tensor().to_f64_vec());
        let (gx, gy) = (x.grad().unwrap().to_f64_vec(), y0.grad().unwrap().to_f64_vec());
        for i in 0..3 {
            assert!((gy[i] - 3.0 * xv[i]).abs() < 1e-12, "dy[{i}] = {} want {}", gy[i], 3.0 * xv[i]);
            let want = 3.0 * (xv[i] + yv[i]) + 3.0 * xv[i];
            assert!((gx[i] - want).abs() < 1e-12, "dx[{i}] = {} want {want}", gx[i]);
        }
    }
}

device_test! {
    fn an_op_taking_parts_gets_each_part_that_arrived(dev: Device) {
        // y feeds three consumers: its backward sees three parts, in arrival order (newest
        // consumer first), whose sum is the gradient the engine would have summed.
        let x = Var::parameter(randn(&[5], 50, dev));
        let seen: Arc<Mutex<Vec<Vec<f64>>>> = Arc::default();
        let log = seen.clone();
        let y = Var::from_op_parts("identity_parts", x.tensor().clone(), &[&x], move |parts, _| {
            log.lock().unwrap().extend(parts.iter().map(|p| p.to_f64_vec()));
            let mut sum = parts[0].clone();
            for p in &parts[1..] {
                sum = sum.add(p);
            }
            vec![Some(sum)]
        });
        let loss = y.mul_scalar(2.0).sum_all() + y.square().sum_all() + y.mul_scalar(-0.5).sum_all();
        loss.backward();
        let xs = x.tensor().to_f64_vec();
        let parts = seen.lock().unwrap().clone();
        assert_eq!(parts.len(), 3, "one call with three parts");
        let mut want: Vec<Vec<f64>> = vec![vec![2.0; 5], xs.iter().map(|v| 2.0 * v).collect(), vec![-0.5; 5]];
        let mut got = parts.clone();
        let key = |v: &Vec<f64>| v.iter().map(|x| (x * 1e6).round() as i64).collect::<Vec<_>>();
        want.sort_by_key(key);
        got.sort_by_key(key);
        assert_eq!(got, want, "the parts");
        let grad = x.grad().unwrap().to_f64_vec();
        for (g, v) in grad.iter().zip(&xs) {
            assert!((g - (1.5 + 2.0 * v)).abs() < 1e-12, "gradient {g} at {v}");
        }
    }
}

device_test! {
    fn an_op_taking_parts_with_one_consumer_gets_one_part(dev: Device) {
        let x = Var::parameter(randn(&[3], 51, dev));
        let calls: Arc<Mutex<Vec<usize>>> = Arc::default();
        let log = calls.clone();
        let y = Var::from_op_parts("identity_parts", x.tensor().clone(), &[&x], move |parts, _| {
            log.lock().unwrap().push(parts.len());
            vec![Some(parts[0].clone())]
        });
        y.mul_scalar(3.0).sum_all().backward();
        assert_eq!(*calls.lock().unwrap(), vec![1]);
        assert_eq!(x.grad().unwrap().to_f64_vec(), vec![3.0; 3]);
    }
}
