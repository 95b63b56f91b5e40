//! BatchNorm2d (training steps updating the running statistics, then eval) and LayerNorm
//! against torch.

use super::{close, entries, parity, t};
use crate::*;
use oxtrain_autograd::Var;
use oxtrain_tensor::testing::assert_close;
use oxtrain_tensor::{device_test, DType, Device};

/// Two training steps (the second on `x2`), the running statistics against torch's, then an
/// eval forward and backward on `x_eval`.
fn batch_norm_case(bn: &BatchNorm2d, case: &str, device: Device) {
    assert!(bn.is_training());
    parity(bn, case, device);
    bn.forward(&Var::constant(t(case, "x2", device)));
    let after = entries(case, "after.", device);
    for (name, value) in bn.state_dict() {
        let tol = super::tol(device);
        assert_close(&value, &after[&name], tol, tol, &format!("{case}: {name} after two steps"));
    }
    bn.eval();
    let before = bn.state_dict().into_iter().map(|(n, v)| (n, v.copy())).collect::<Vec<_>>();
    let x = Var::parameter(t(case, "x_eval", device));
    let out = bn.forward(&x);
    close(out.tensor(), case, "out_eval", device);
    out.backward_with(t(case, "grad_out_eval", device), false);
    close(&x.grad().unwrap(), case, "grad_x_eval", device);
    // Eval mode reads the running statistics and leaves them alone.
    for ((name, old), (_, new)) in before.iter().zip(bn.state_dict()) {
        assert_eq!(old.to_f64_vec(), new.to_f64_vec(), "{case}: eval changed {name}");
    }
}

device_test!(
    fn batch_norm_trains_then_evaluates_like_torch(device: Device) {
        let bn = BatchNorm2d::new(3, device).unwrap();
        batch_norm_case(&bn, "bn", device);
        let tracked = bn.running.as_ref().unwrap().num_batches_tracked.tensor();
        assert_eq!(tracked.dtype(), DType::I64);
        assert_eq!(tracked.to_vec::<i64>(), [2]);
    }
);

device_test!(
    fn batch_norm_cumulative_average_without_affine_matches_torch(device: Device) {
        let config = BatchNormConfig { momentum: None, affine: false, ..Default::default() };
        let bn = BatchNorm2d::with_config(3, config, device).unwrap();
        assert!(bn.parameters().is_empty());
        batch_norm_case(&bn, "bn_cumulative", device);
    }
);

#[test]
fn batch_norm_without_running_stats_uses_batch_statistics_in_eval() {
    let config = BatchNormConfig { track_running_stats: false, ..Default::default() };
    let bn = BatchNorm2d::with_config(3, config, Device::Cpu).unwrap();
    assert_eq!(bn.state_dict().len(), 2, "weight and bias only");
    let x = Var::constant(t("bn", "x", Device::Cpu));
    let train = bn.forward(&x).tensor().clone();
    bn.eval();
    let eval = bn.forward(&x).tensor().clone();
    assert_eq!(train.to_f64_vec(), eval.to_f64_vec());
    // Normalised per channel with the batch's statistics: mean 0 over N, H, W.
    let means = eval.mean([0, 2, 3], false).to_vec1::<f32>();
    assert!(means.iter().all(|m| m.abs() < 1e-5), "{means:?}");
}

#[test]
#[should_panic(expected = "more than 1 value per channel")]
fn batch_norm_refuses_one_value_per_channel_in_training() {
    let bn = BatchNorm2d::new(2, Device::Cpu).unwrap();
    bn.forward(&Var::constant(oxtrain_tensor::Tensor::ones([1, 2, 1, 1], DType::F32, Device::Cpu).unwrap()));
}

device_test!(
    fn layer_norm_matches_torch(device: Device) {
        let ln = LayerNorm::new([4, 6], device).unwrap();
        parity(&ln, "layer_norm", device);
    }
);

device_test!(
    fn layer_norm_in_bf16_matches_torch_to_bf16_precision(device: Device) {
        let ln = LayerNorm::new([4, 6], device).unwrap();
        super::load(&ln, "layer_norm", device);
        ln.to_dtype(DType::BF16).unwrap();
        let x = Var::constant(t("layer_norm", "x", device).to_dtype(DType::BF16));
        let out = ln.forward(&x).tensor().to_dtype(DType::F32);
        assert_close(&out, &t("layer_norm", "out", device), 1e-2, 2e-2, "layer_norm bf16");
    }
);
