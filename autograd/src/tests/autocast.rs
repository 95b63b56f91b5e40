//! Autocast: which ops run in which dtype, that gradients reach f32 parameters in f32 and agree
//! with the f32 computation to bf16 accuracy, and type promotion of mixed float inputs.

use super::randn;
use crate::{autocast, autocast_dtype, Var};
use oxtrain_tensor::testing::assert_close;
use oxtrain_tensor::{device_test, DType, Device, Tensor};

fn f32_randn(shape: &[usize], seed: u64, dev: Device) -> Tensor {
    randn(shape, seed, dev).to_dtype(DType::F32)
}

/// conv -> relu -> layer_norm -> linear -> log_softmax, summed: every autocast rule once.
/// With `manual`, the casts autocast should insert are written out instead.
fn net(x: &Var, conv_w: &Var, ln_w: &Var, lin_w: &Var, manual: bool) -> (Var, Vec<DType>) {
    let low = |v: &Var| if manual { v.to_dtype(DType::BF16) } else { v.clone() };
    let wide = |v: &Var| if manual { v.to_dtype(DType::F32) } else { v.clone() };
    let h = low(x).conv2d(&low(conv_w), None, [1, 1], [1, 1], [1, 1], 1).relu();
    let c = h.dtype();
    let h = wide(&h.flatten(1, -1));
    let n = h.layer_norm(h.dims()[1], Some(ln_w), None, 1e-5);
    let logits = low(&n).matmul(&low(lin_w).t());
    let out = wide(&logits).log_softmax(-1);
    (out.sum_all(), vec![c, n.dtype(), logits.dtype(), out.dtype()])
}

device_test! {
    fn autocast_casts_as_pytorch_does_and_keeps_master_gradients_in_f32(dev: Device) {
        let x = Var::constant(f32_randn(&[2, 3, 5, 5], 1, dev));
        let conv_w = Var::parameter(f32_randn(&[4, 3, 3, 3], 2, dev).mul_scalar(0.3));
        let ln_w = Var::parameter(f32_randn(&[100], 3, dev).add_scalar(1.0));
        let lin_w = Var::parameter(f32_randn(&[6, 100], 4, dev).mul_scalar(0.1));
        let params = [&conv_w, &ln_w, &lin_w];

        // The same casts written out by hand: autocast must give exactly this.
        let (loss, dtypes) = net(&x, &conv_w, &ln_w, &lin_w, true);
        assert_eq!(dtypes, vec![DType::BF16, DType::F32, DType::BF16, DType::F32]);
        loss.backward();
        let manual_loss = loss.tensor().item();
        let manual: Vec<Tensor> = params.iter().map(|p| p.grad().unwrap()).collect();
        params.iter().for_each(|p| p.zero_grad());

        let (loss, dtypes) = autocast(DType::BF16, || net(&x, &conv_w, &ln_w, &lin_w, false));
        assert_eq!(autocast_dtype(), None, "the region ended");
        // conv in bf16, layer norm widened to f32, the product back in bf16, log-softmax in f32.
        assert_eq!(dtypes, vec![DType::BF16, DType::F32, DType::BF16, DType::F32]);
        assert_eq!(loss.tensor().item(), manual_loss);
        loss.backward();
        for (p, want) in params.iter().zip(&manual) {
            let g = p.grad().unwrap();
            assert_eq!(g.dtype(), DType::F32, "master gradients stay f32");
            assert_eq!(g.to_f64_vec(), want.to_f64_vec(), "gradient of {:?}", p.dims());
        }

        // And close to the f32 computation where the loss is well conditioned (no norm in front
        // of a scale-invariant loss): bf16 keeps 8 bits of mantissa.
        params.iter().for_each(|p| p.zero_grad());
        let f = || x.conv2d(&conv_w, None, [1, 1], [1, 1], [1, 1], 1).relu().flatten(1, -1).matmul(&lin_w.narrow(1, 0, 100).t());
        let y32 = f();
        let y16 = autocast(DType::BF16, f);
        assert_eq!(y16.dtype(), DType::BF16);
        let scale = y32.tensor().abs().max_all().item();
        assert_close(&y16.tensor().to_dtype(DType::F32), y32.tensor(), 2e-2, 2e-2 * scale, "bf16 forward");
    }
}

device_test! {
    fn mixed_float_inputs_promote_to_the_wider_dtype(dev: Device) {
        let a = Var::parameter(f32_randn(&[3, 4], 5, dev).to_dtype(DType::BF16));
        let b = Var::parameter(f32_randn(&[4], 6, dev));
        let y = a.mul(&b).add(&a);
        assert_eq!(y.dtype(), DType::F32);
        y.sum_all().backward();
        assert_eq!(a.grad().unwrap().dtype(), DType::BF16, "a gradient has its input's dtype");
        assert_eq!(b.grad().unwrap().dtype(), DType::F32);
        // d/da (a*b + a) = b + 1, broadcast over rows.
        let want = b.tensor().add_scalar(1.0).broadcast_as((3, 4)).to_dtype(DType::BF16);
        assert_close(&a.grad().unwrap(), &want, 1e-2, 1e-2, "promoted gradient");
        let h = Var::constant(f32_randn(&[2], 7, dev).to_dtype(DType::F16));
        let g = Var::constant(f32_randn(&[2], 8, dev).to_dtype(DType::BF16));
        assert_eq!(h.add(&g).dtype(), DType::F32, "bf16 with f16 meet in f32");
    }
}

#[test]
fn autocast_restores_the_previous_state_after_a_panic() {
    let caught = std::panic::catch_unwind(|| autocast(DType::BF16, || panic!("inside")));
    assert!(caught.is_err());
    assert_eq!(autocast_dtype(), None);
    autocast(DType::F16, || {
        assert_eq!(autocast_dtype(), Some(DType::F16));
        crate::autocast_disabled(|| assert_eq!(autocast_dtype(), None));
        assert_eq!(autocast_dtype(), Some(DType::F16));
    });
}

#[test]
#[should_panic(expected = "autocast: the low-precision dtype must be bf16 or f16, got float32")]
fn autocast_to_f32_is_refused() {
    autocast(DType::F32, || ());
}

device_test! {
    fn autocast_lowers_a_parameter_once_per_change_and_keeps_its_gradient_f32(dev: Device) {
        let w = Var::parameter(f32_randn(&[6, 5], 9, dev));
        let x = Var::constant(f32_randn(&[4, 6], 10, dev));
        let (a, b) = autocast(DType::BF16, || (w.autocast_lower(), w.narrow(0, 1, 3).autocast_lower()));
        assert!(a.tensor().same_storage(b.tensor()), "both uses read the one kept cast");
        let fresh = w.tensor().narrow(0, 1, 3).to_dtype(DType::BF16);
        assert_eq!(b.tensor().to_f64_vec(), fresh.to_f64_vec(), "a view of the kept cast");

        // The product and the gradient are those of an explicit cast; the gradient is f32.
        autocast(DType::BF16, || x.matmul(&w)).sum_all().backward();
        let kept = w.grad().unwrap();
        assert_eq!(kept.dtype(), DType::F32, "the master gradient stays f32");
        w.zero_grad();
        x.to_dtype(DType::BF16).matmul(&w.to_dtype(DType::BF16)).sum_all().backward();
        assert_eq!(kept.to_f64_vec(), w.grad().unwrap().to_f64_vec(), "gradient through the kept cast");

        // Changed in place, the parameter is lowered afresh (the old cast is still held here).
        w.tensor().add_scalar_(1.0);
        let c = autocast(DType::BF16, || w.autocast_lower());
        assert!(!c.tensor().same_storage(a.tensor()));
        assert_eq!(c.tensor().to_f64_vec(), w.tensor().to_dtype(DType::BF16).to_f64_vec());
        assert_ne!(c.tensor().to_f64_vec(), a.tensor().to_f64_vec(), "the held cast kept its values");
    }
}
