//! End-of-backward callbacks and gradients accumulated into preallocated buffers: what DDP's
//! reducer builds on (gradient as bucket view, waiting for buckets at the end of backward).

use super::randn;
use crate::{in_backward, queue_callback, BackwardError, Var};
use oxtrain_tensor::{device_test, Tensor};
use std::sync::{Arc, Mutex};

fn loss_of(w: &Var, x: &Var) -> Var {
    w.matmul(x).tanh().square().sum_all()
}

device_test! {
    fn a_grad_buffer_receives_the_gradient_in_place(dev: Device) {
        let w = Var::parameter(randn(&[3, 4], 1, dev));
        let x = Var::constant(randn(&[4, 2], 2, dev));
        // The reference: an ordinary parameter with the same value.
        let plain = Var::parameter(w.tensor().copy());
        loss_of(&plain, &x).backward();
        let expected = plain.grad().unwrap().to_f64_vec();

        // A buffer that is a view into a larger flat tensor, as a DDP bucket's slot is.
        let bucket = Tensor::zeros(20, w.dtype(), dev).unwrap();
        let slot = bucket.narrow(0, 5, 12).reshape([3, 4]);
        w.set_grad_buffer(Some(slot.clone()));
        loss_of(&w, &x).backward();
        let g = w.grad().unwrap();
        assert!(g.same_storage(&bucket), "the gradient is not the bucket's memory");
        assert_eq!(g.to_f64_vec(), expected);
        let flat = bucket.to_f64_vec();
        assert_eq!(&flat[5..17], expected.as_slice(), "the bucket does not hold the gradient");
        assert!(flat[..5].iter().chain(&flat[17..]).all(|&v| v == 0.0), "wrote outside the slot");

        // A second backward adds in place (gradient accumulation), still in the bucket.
        loss_of(&w, &x).backward();
        let twice: Vec<f64> = expected.iter().map(|v| v * 2.0).collect();
        assert_eq!(w.grad().unwrap().to_f64_vec(), twice);
        assert_eq!(&bucket.to_f64_vec()[5..17], twice.as_slice());

        // zero_grad forgets the gradient; the next backward overwrites the slot.
        w.zero_grad();
        assert!(w.grad().is_none());
        loss_of(&w, &x).backward();
        assert_eq!(&bucket.to_f64_vec()[5..17], expected.as_slice());
        assert!(w.grad().unwrap().same_storage(&bucket));

        // Without a buffer gradients are fresh tensors again.
        w.set_grad_buffer(None);
        w.zero_grad();
        loss_of(&w, &x).backward();
        assert!(!w.grad().unwrap().same_storage(&bucket));
    }
}

device_test! {
    fn callbacks_run_once_after_every_hook_in_queue_order(dev: Device) {
        let w1 = Var::parameter(randn(&[4, 4], 3, dev));
        let w2 = Var::parameter(randn(&[4, 2], 4, dev));
        let x = Var::constant(randn(&[3, 4], 5, dev));
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut handles = vec![];
        for (name, w) in [("w1", &w1), ("w2", &w2)] {
            let log = log.clone();
            handles.push(w.register_hook(move |_| {
                log.lock().unwrap().push(name.to_string());
                if name == "w2" {
                    // Queued from the first hook to fire; must run after the last one.
                    let (l1, l2) = (log.clone(), log.clone());
                    queue_callback(move || {
                        l1.lock().unwrap().push("end-1".into());
                        // A callback may queue another, which runs in the same pass.
                        queue_callback(move || {
                            l2.lock().unwrap().push("end-3".into());
                            Ok(())
                        });
                        Ok(())
                    });
                    let l = log.clone();
                    queue_callback(move || {
                        l.lock().unwrap().push("end-2".into());
                        Ok(())
                    });
                }
            }));
        }
        assert!(!in_backward());
        x.matmul(&w1).tanh().matmul(&w2).sum_all().backward();
        assert!(!in_backward());
        assert_eq!(*log.lock().unwrap(), ["w2", "w1", "end-1", "end-2", "end-3"]);
        // Nothing carries over into the next pass.
        log.lock().unwrap().clear();
        handles.into_iter().for_each(|h| h.remove());
        x.matmul(&w1).sum_all().backward();
        assert!(log.lock().unwrap().is_empty());
    }
}

device_test! {
    fn a_failing_callback_is_the_error_of_try_backward(dev: Device) {
        let w = Var::parameter(randn(&[2, 2], 6, dev));
        let ran_after = Arc::new(Mutex::new(false));
        let flag = ran_after.clone();
        let h = w.register_hook(move |_| {
            queue_callback(|| Err(BackwardError::new("bucket 3 timed out")));
            let flag = flag.clone();
            queue_callback(move || {
                *flag.lock().unwrap() = true;
                Err(BackwardError::new("a second failure"))
            });
        });
        let err = w.square().sum_all().try_backward().unwrap_err();
        assert_eq!(err.to_string(), "bucket 3 timed out", "the first error is returned");
        assert!(*ran_after.lock().unwrap(), "later callbacks still run");
        // The gradient was computed regardless.
        assert!(w.grad().is_some());
        // backward() turns the error into a panic with its message.
        w.zero_grad();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.square().sum_all().backward()))
            .unwrap_err();
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("bucket 3 timed out"), "{msg}");
        h.remove();
        // After a panicking pass the thread is outside any backward again.
        assert!(!in_backward());
    }
}

#[test]
#[should_panic(expected = "no backward pass is running")]
fn queue_callback_outside_backward_panics() {
    queue_callback(|| Ok(()));
}
