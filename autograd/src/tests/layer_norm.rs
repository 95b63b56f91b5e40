//! Layer norm's fused forms in the graph: `add_layer_norm` (two outputs, one backward) and the
//! autocast-lowered outputs, against finite differences in f64 and against the unfused ops
//! (add, layer norm, the autocast cast), whose loss and gradients they must equal bit for bit.

use super::{check, randn};
use crate::{autocast, Var};
use oxtrain_tensor::{device_test, DType, Tensor};

device_test! {
    fn add_layer_norm_gradients(dev: Device) {
        let inputs = || [randn(&[3, 4], 1, dev), randn(&[3, 4], 2, dev), randn(&[4], 3, dev), randn(&[4], 4, dev)];
        check(
            "add_layer_norm, both outputs used",
            |v| {
                let (s, n) = v[0].add_layer_norm(&v[1], 4, Some(&v[2]), Some(&v[3]), 1e-5);
                s.tanh().add(&n.mul(&s))
            },
            &inputs(),
        );
        check("add_layer_norm, only the norm used", |v| v[0].add_layer_norm(&v[1], 4, Some(&v[2]), None, 1e-5).1, &inputs());
        check("add_layer_norm, only the sum used", |v| v[0].add_layer_norm(&v[1], 4, None, Some(&v[3]), 1e-5).0.exp(), &inputs());
        // An addend that broadcasts.
        check(
            "add_layer_norm, broadcast addend",
            |v| {
                let (s, n) = v[0].add_layer_norm(&v[2], 4, None, None, 1e-5);
                s.add(&n.square())
            },
            &inputs(),
        );
    }
}

/// Two residual steps of a pre-norm transformer, fused (`add_layer_norm_lowered`) or written
/// out (add, layer norm, the autocast cast): the loss and the gradients of every input.
fn two_residual_steps(v: &[Var], fused: bool) -> (f64, Vec<Tensor>) {
    let (x, y, w, b, p, q) = (&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
    let step = |s: &Var, y: &Var| {
        if fused {
            s.add_layer_norm_lowered(y, 33, Some(w), Some(b), 1e-5)
        } else {
            let t = s.add(y);
            let n = t.layer_norm(33, Some(w), Some(b), 1e-5).autocast_lower();
            (t, n)
        }
    };
    let (s1, n1) = step(x, y);
    let branch = n1.matmul(p).tanh();
    let (s2, n2) = step(&s1, &branch);
    let loss = n2.matmul(q).to_dtype(DType::F32).square().mean_all().add(&s2.square().mean_all());
    loss.backward();
    let grads = v.iter().map(|p| p.grad().expect("every input gets a gradient")).collect();
    (loss.tensor().to_dtype(DType::F64).item(), grads)
}

device_test! {
    fn add_layer_norm_equals_the_unfused_ops_bit_for_bit(dev: Device) {
        for (region, y_dtype) in [(None, DType::F32), (Some(DType::BF16), DType::BF16), (Some(DType::BF16), DType::F32)] {
            let make = || {
                let f32s = |shape: &[usize], seed: u64, scale: f64| randn(shape, seed, dev).mul_scalar(scale).to_dtype(DType::F32);
                vec![
                    Var::parameter(f32s(&[2, 5, 33], 10, 1.0).add_scalar(2.0)),
                    Var::parameter(f32s(&[2, 5, 33], 11, 1.0).to_dtype(y_dtype)),
                    Var::parameter(f32s(&[33], 12, 0.3).add_scalar(1.0)),
                    Var::parameter(f32s(&[33], 13, 0.3)),
                    Var::parameter(f32s(&[33, 33], 14, 0.2)),
                    Var::parameter(f32s(&[33, 7], 15, 0.2)),
                ]
            };
            let run = |fused: bool| match region {
                Some(low) => autocast(low, || two_residual_steps(&make(), fused)),
                None => two_residual_steps(&make(), fused),
            };
            let ((loss, grads), (want_loss, want_grads)) = (run(true), run(false));
            let what = format!("autocast {region:?}, y {y_dtype}");
            assert_eq!(loss.to_bits(), want_loss.to_bits(), "{what}: loss");
            for (i, (g, want)) in grads.iter().zip(&want_grads).enumerate() {
                assert_eq!(g.dtype(), want.dtype(), "{what}: dtype of input {i}'s gradient");
                let bits = |t: &Tensor| t.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(g), bits(want), "{what}: gradient of input {i}");
            }
        }
    }
}

device_test! {
    fn layer_norm_under_autocast_computes_in_f32(dev: Device) {
        let x = Var::parameter(randn(&[4, 33], 20, dev).to_dtype(DType::BF16));
        let w = Var::parameter(randn(&[33], 21, dev).to_dtype(DType::F32));
        let (plain, lowered) = autocast(DType::BF16, || {
            (x.layer_norm(33, Some(&w), None, 1e-5), x.layer_norm_lowered(33, Some(&w), None, 1e-5))
        });
        assert_eq!((plain.dtype(), lowered.dtype()), (DType::F32, DType::BF16));
        // The f32 norm of the widened input, rounded once.
        let (want, _, _) = x.tensor().to_dtype(DType::F32).layer_norm(33, Some(w.tensor()), None, 1e-5);
        assert_eq!(plain.tensor().to_f64_vec(), want.to_f64_vec());
        assert_eq!(lowered.tensor().to_f64_vec(), want.to_dtype(DType::BF16).to_f64_vec());
        // Outside a region the lowered form is layer norm itself.
        let outside = x.layer_norm_lowered(33, Some(&w), None, 1e-5);
        assert_eq!(outside.dtype(), DType::BF16);
        lowered.to_dtype(DType::F32).sum_all().backward();
        assert_eq!((x.grad().unwrap().dtype(), w.grad().unwrap().dtype()), (DType::BF16, DType::F32));
    }
}
