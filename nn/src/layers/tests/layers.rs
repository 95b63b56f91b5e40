//! Linear, Conv2d, Embedding, activations, pools, Flatten, Sequential against torch; dropout
//! statistics.

use super::{parity, t};
use crate::*;
use oxtrain_autograd::Var;
use oxtrain_tensor::{device_test, manual_seed, DType, Device, Tensor};

device_test!(
    fn linear_matches_torch(device: Device) {
        parity(&Linear::new(5, 4, device).unwrap(), "linear", device);
        let no_bias = LinearConfig { bias: false, ..Default::default() };
        parity(&Linear::with_config(5, 3, no_bias, device).unwrap(), "linear_no_bias", device);
    }
);

device_test!(
    fn conv2d_matches_torch(device: Device) {
        let config = Conv2dConfig { stride: [2, 2], padding: [1, 1], groups: 2, ..Default::default() };
        parity(&Conv2d::with_config(4, 6, [3, 3], config, device).unwrap(), "conv_groups", device);
        let config = Conv2dConfig {
            stride: [1, 2],
            padding: [2, 1],
            dilation: [2, 1],
            bias: false,
            ..Default::default()
        };
        parity(&Conv2d::with_config(3, 4, [3, 2], config, device).unwrap(), "conv_dilation", device);
    }
);

device_test!(
    fn embedding_with_padding_idx_matches_torch(device: Device) {
        let config = EmbeddingConfig { padding_idx: Some(2), ..Default::default() };
        let emb = Embedding::with_config(10, 4, config, device).unwrap();
        parity(&emb, "embedding", device);
        // The padding row's gradient is zero although the id occurs twice.
        let g = emb.weight.var().grad().unwrap();
        assert_eq!(g.narrow(0, 2, 1).abs().sum_all().item(), 0.0);
    }
);

#[test]
fn embedding_init_zeroes_the_padding_row() {
    let config = EmbeddingConfig { padding_idx: Some(3), ..Default::default() };
    let emb = Embedding::with_config(6, 5, config, Device::Cpu).unwrap();
    let w = emb.weight.tensor();
    assert_eq!(w.narrow(0, 3, 1).abs().sum_all().item(), 0.0);
    assert!(w.narrow(0, 0, 3).abs().sum_all().item() > 0.0);
}

device_test!(
    fn activations_match_torch(device: Device) {
        parity(&ReLU, "relu", device);
        parity(&GELU::new(), "gelu", device);
        parity(&GELU::tanh(), "gelu_tanh", device);
        parity(&SiLU, "silu", device);
    }
);

device_test!(
    fn pools_and_flatten_match_torch(device: Device) {
        let config = MaxPool2dConfig { stride: Some([2, 2]), padding: [1, 1], ..Default::default() };
        parity(&MaxPool2d::with_config([3, 3], config), "max_pool", device);
        let config = MaxPool2dConfig { ceil_mode: true, ..Default::default() };
        parity(&MaxPool2d::with_config([2, 2], config), "max_pool_ceil", device);
        let config = AvgPool2dConfig {
            stride: Some([2, 2]),
            padding: [1, 1],
            count_include_pad: false,
            ..Default::default()
        };
        parity(&AvgPool2d::with_config([3, 3], config), "avg_pool", device);
        parity(&AdaptiveAvgPool2d::new([2, 3]), "adaptive_avg_pool", device);
        parity(&Flatten::new(), "flatten", device);
    }
);

fn small_cnn(device: Device) -> Sequential {
    let pad = Conv2dConfig { padding: [1, 1], ..Default::default() };
    Sequential::new()
        .append(Conv2d::with_config(3, 4, [3, 3], pad, device).unwrap())
        .append(BatchNorm2d::new(4, device).unwrap())
        .append(ReLU)
        .append(MaxPool2d::new([2, 2]))
        .append(Flatten::new())
        .append(Linear::new(16, 5, device).unwrap())
        .append(GELU::new())
        .append(Linear::new(5, 3, device).unwrap())
}

device_test!(
    fn sequential_matches_torch(device: Device) {
        let model = small_cnn(device);
        assert_eq!(model.len(), 8);
        assert_eq!(model.child_names(), ["0", "1", "2", "3", "4", "5", "6", "7"]);
        parity(&model, "sequential", device);
    }
);

#[test]
fn identity_returns_its_input() {
    let x = Var::parameter(Tensor::new([1f32, -2.0], Device::Cpu).unwrap());
    let y = Identity.forward(&x);
    assert_eq!(y.tensor().to_vec1::<f32>(), [1.0, -2.0]);
    y.sum_all().backward();
    assert_eq!(x.grad().unwrap().to_vec1::<f32>(), [1.0, 1.0]);
}

device_test!(
    fn dropout_keeps_the_mean_and_zeroes_about_p(device: Device) {
        manual_seed(1234);
        let n = 200_000;
        let x = Var::parameter(Tensor::ones(n, DType::F32, device).unwrap());
        for p in [0.1, 0.5, 0.8] {
            let drop = Dropout::new(p);
            let y = drop.forward(&x);
            let values = y.tensor().to_vec1::<f32>();
            let zeros = values.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
            // Binomial standard error is about 1e-3; 5e-3 is five of them.
            assert!((zeros - p).abs() < 5e-3, "p {p}: fraction zeroed {zeros}");
            let kept = 1.0 / (1.0 - p) as f32;
            assert!(
                values.iter().all(|&v| v == 0.0 || (v - kept).abs() < 1e-6),
                "p {p}: kept values are 1/(1-p)"
            );
            let mean = y.tensor().mean_all().item();
            assert!((mean - 1.0).abs() < 0.02, "p {p}: mean {mean}");
            // The gradient is the same mask and scale.
            x.zero_grad();
            y.backward_with(Tensor::ones(n, DType::F32, device).unwrap(), false);
            assert_eq!(x.grad().unwrap().to_vec1::<f32>(), values);
        }
    }
);

#[test]
fn dropout_in_eval_mode_and_p_zero_is_the_identity() {
    let x = Var::constant(Tensor::randn(1000, DType::F32, Device::Cpu).unwrap());
    let drop = Dropout::new(0.5);
    drop.eval();
    assert!(!drop.is_training());
    assert_eq!(drop.forward(&x).tensor().to_vec1::<f32>(), x.tensor().to_vec1::<f32>());
    drop.train(true);
    assert_ne!(drop.forward(&x).tensor().to_vec1::<f32>(), x.tensor().to_vec1::<f32>());
    assert_eq!(Dropout::new(0.0).forward(&x).tensor().to_vec1::<f32>(), x.tensor().to_vec1::<f32>());
    assert_eq!(Dropout::new(1.0).forward(&x).tensor().abs().sum_all().item(), 0.0);
}

device_test!(
    fn linear_in_bf16_matches_torch_to_bf16_precision(device: Device) {
        let layer = Linear::new(5, 4, device).unwrap();
        super::load(&layer, "linear", device);
        layer.to_dtype(DType::BF16).unwrap();
        assert_eq!(layer.weight.tensor().dtype(), DType::BF16);
        let x = Var::constant(t("linear", "x", device).to_dtype(DType::BF16));
        let out = layer.forward(&x).tensor().to_dtype(DType::F32);
        let expected = t("linear", "out", device);
        oxtrain_tensor::testing::assert_close(&out, &expected, 1e-2, 1e-2, "linear bf16");
    }
);

device_test!(
    fn a_model_built_on_the_cpu_moves_to_the_device(device: Device) {
        let model = small_cnn(Device::Cpu);
        super::load(&model, "sequential", Device::Cpu);
        model.to_device(device).unwrap();
        assert!(model.state_dict().iter().all(|(_, t)| t.device() == device));
        super::check_forward_backward(&model, "sequential", device);
    }
);
