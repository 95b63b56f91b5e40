//! The module system: state-dict names and order against torch's for a nested model, loading
//! (in place, every problem reported at once, all-or-nothing), safetensors round trips,
//! train/eval, devices and dtypes.

use crate::layers::tests::names;
use crate::*;
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::HashMap;

/// torchvision's Bottleneck shape, small.
struct Block {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    relu: ReLU,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    downsample: Sequential,
}

impl Module for Block {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("relu", &self.relu);
        v.child("conv2", &self.conv2);
        v.child("bn2", &self.bn2);
        v.child("downsample", &self.downsample);
    }
}

impl Forward for Block {
    fn forward(&self, x: &Var) -> Var {
        let y = self.relu.forward(&self.bn1.forward(&self.conv1.forward(x)));
        let y = self.bn2.forward(&self.conv2.forward(&y));
        (y + self.downsample.forward(x)).relu()
    }
}

/// The fixture's `Net`: own parameter registered after children, a Sequential of a custom
/// block, attention, layer norm, linear.
struct Net {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    layer1: Sequential,
    scale: Parameter,
    attn: MultiheadSelfAttention,
    norm: LayerNorm,
    fc: Linear,
}

impl Module for Net {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("layer1", &self.layer1);
        v.param("scale", &self.scale);
        v.child("attn", &self.attn);
        v.child("norm", &self.norm);
        v.child("fc", &self.fc);
    }
}

fn net(device: Device) -> Net {
    let no_bias = Conv2dConfig { bias: false, ..Default::default() };
    let pad_no_bias = Conv2dConfig { padding: [1, 1], ..no_bias };
    let block = Block {
        conv1: Conv2d::with_config(4, 4, [3, 3], pad_no_bias, device).unwrap(),
        bn1: BatchNorm2d::new(4, device).unwrap(),
        relu: ReLU,
        conv2: Conv2d::with_config(4, 8, [1, 1], no_bias, device).unwrap(),
        bn2: BatchNorm2d::new(8, device).unwrap(),
        downsample: Sequential::new()
            .append(Conv2d::with_config(4, 8, [1, 1], no_bias, device).unwrap())
            .append(BatchNorm2d::new(8, device).unwrap()),
    };
    Net {
        conv1: Conv2d::with_config(3, 4, [3, 3], no_bias, device).unwrap(),
        bn1: BatchNorm2d::new(4, device).unwrap(),
        layer1: Sequential::new().append(block).append(Identity),
        scale: Parameter::new(Tensor::ones(3, DType::F32, device).unwrap()),
        attn: MultiheadSelfAttention::new(8, 2, device).unwrap(),
        norm: LayerNorm::new([8], device).unwrap(),
        fc: Linear::new(8, 2, device).unwrap(),
    }
}

fn keys<T>(entries: Vec<(String, T)>) -> Vec<String> {
    entries.into_iter().map(|(n, _)| n).collect()
}

#[test]
fn names_and_order_match_torch_for_a_nested_model() {
    let model = net(Device::Cpu);
    assert_eq!(keys(model.state_dict()), names("nested", "names"));
    assert_eq!(keys(model.named_parameters()), names("nested", "parameter_names"));
    assert_eq!(keys(model.named_buffers()), names("nested", "buffer_names"));
    assert_eq!(model.child_names(), ["conv1", "bn1", "layer1", "attn", "norm", "fc"]);
    let expected: usize = model.parameters().iter().map(|p| p.elem_count()).sum();
    assert_eq!(model.num_parameters(), expected);
}

#[test]
fn train_and_eval_reach_every_descendant() {
    let model = net(Device::Cpu);
    let block = model.layer1.get(0).unwrap();
    assert!(model.is_training() && block.is_training());
    model.eval();
    assert!(!model.is_training());
    assert!(!model.bn1.is_training() && !model.attn.is_training());
    assert!(!block.is_training(), "the block's batch norms, inside a Sequential, are in eval mode");
    model.train(true);
    assert!(block.is_training() && model.attn.is_training());
    // A module without any mode-dependent layer reports PyTorch's default.
    assert!(Linear::new(2, 2, Device::Cpu).unwrap().is_training());
}

#[test]
fn load_state_dict_copies_into_the_parameters_in_place() {
    let layer = Linear::new(3, 2, Device::Cpu).unwrap();
    let held: Vec<Var> = layer.parameters(); // what an optimizer holds
    let w = Tensor::new([[1f32, 2., 3.], [4., 5., 6.]], Device::Cpu).unwrap();
    let b = Tensor::new([0.5f64, -0.5], Device::Cpu).unwrap(); // converted to the parameter's f32
    let state = HashMap::from([("weight".to_string(), w.clone()), ("bias".to_string(), b)]);
    let report = layer.load_state_dict(&state, true).unwrap();
    assert_eq!(report, LoadReport::default());
    assert_eq!(held[0].tensor().to_vec2::<f32>(), w.to_vec2::<f32>());
    assert_eq!(held[1].tensor().to_vec1::<f32>(), [0.5, -0.5]);
    assert_eq!(held[1].dtype(), DType::F32);
    // The state dict's tensors are not aliased by the module.
    w.fill_(0.0);
    assert_eq!(layer.weight.tensor().to_vec2::<f32>()[1], [4., 5., 6.]);
}

fn bad_state(model: &Net) -> HashMap<String, Tensor> {
    let mut state: HashMap<String, Tensor> =
        model.state_dict().into_iter().map(|(n, t)| (n, t.zeros_like())).collect();
    state.remove("bn1.running_var");
    state.remove("layer1.0.conv2.weight");
    state.insert("fc.extra".into(), Tensor::zeros(1, DType::F32, Device::Cpu).unwrap());
    state.insert("head.weight".into(), Tensor::zeros(1, DType::F32, Device::Cpu).unwrap());
    state
}

#[test]
fn a_bad_load_reports_every_problem_and_loads_nothing() {
    let model = net(Device::Cpu);
    let mut state = bad_state(&model);
    state.insert("fc.weight".into(), Tensor::zeros([3, 8], DType::F32, Device::Cpu).unwrap());
    state.insert("attn.in_proj_bias".into(), Tensor::zeros(8, DType::F32, Device::Cpu).unwrap());
    let before = model.conv1.weight.tensor().to_f64_vec();
    for strict in [true, false] {
        let err = model.load_state_dict(&state, strict).unwrap_err();
        let LoadError::Mismatch { missing, unexpected, mismatched } = &err else { panic!("{err}") };
        assert_eq!(missing, &["bn1.running_var", "layer1.0.conv2.weight"]);
        assert_eq!(unexpected, &["fc.extra", "head.weight"]);
        let bad: Vec<(&str, &[usize], &[usize])> =
            mismatched.iter().map(|m| (m.name.as_str(), &m.expected[..], &m.got[..])).collect();
        assert_eq!(
            bad,
            [("attn.in_proj_bias", &[24][..], &[8][..]), ("fc.weight", &[2, 8][..], &[3, 8][..])]
        );
        let message = err.to_string();
        for name in [
            "bn1.running_var",
            "layer1.0.conv2.weight",
            "fc.extra",
            "head.weight",
            "fc.weight",
            "attn.in_proj_bias",
        ] {
            assert!(message.contains(name), "the message names {name}: {message}");
        }
        assert_eq!(model.conv1.weight.tensor().to_f64_vec(), before, "nothing was loaded");
    }
}

#[test]
fn a_non_strict_load_skips_missing_and_unexpected_names() {
    let model = net(Device::Cpu);
    let state = bad_state(&model);
    assert!(model.load_state_dict(&state, true).is_err());
    assert_eq!(
        model.bn1.running.as_ref().unwrap().var.tensor().to_vec1::<f32>(),
        [1.0; 4],
        "strict loaded nothing"
    );
    let report = model.load_state_dict(&state, false).unwrap();
    assert_eq!(report.missing, ["bn1.running_var", "layer1.0.conv2.weight"]);
    assert_eq!(report.unexpected, ["fc.extra", "head.weight"]);
    assert_eq!(model.conv1.weight.tensor().abs().sum_all().item(), 0.0, "present names were loaded");
    assert_eq!(
        model.bn1.running.as_ref().unwrap().var.tensor().to_vec1::<f32>(),
        [1.0; 4],
        "missing ones kept"
    );
}

#[test]
fn safetensors_round_trip_restores_parameters_and_buffers() {
    let path = std::env::temp_dir().join(format!("oxtrain-nn-roundtrip-{}.safetensors", std::process::id()));
    let a = net(Device::Cpu);
    // Give the buffers values other than their initial ones.
    a.bn1.forward(&Var::constant(Tensor::randn([2, 4, 3, 3], DType::F32, Device::Cpu).unwrap()));
    a.save_safetensors(&path).unwrap();
    let b = net(Device::Cpu);
    b.load_safetensors(&path, true).unwrap();
    for ((na, ta), (nb, tb)) in a.state_dict().into_iter().zip(b.state_dict()) {
        assert_eq!(na, nb);
        assert_eq!(ta.dtype(), tb.dtype(), "{na}");
        assert_eq!(ta.to_f64_vec(), tb.to_f64_vec(), "{na}");
    }
    let file = oxtrain_tensor::safetensors::load(&path).unwrap();
    assert_eq!(file.info("bn1.num_batches_tracked").unwrap().dtype, DType::I64);
    std::fs::remove_file(&path).unwrap();
    let missing = b.load_safetensors(&path, true).unwrap_err();
    assert!(matches!(missing, LoadError::Tensor(_)), "{missing}");
}

#[test]
fn to_dtype_converts_floats_and_keeps_integer_buffers() {
    let model = net(Device::Cpu);
    model.to_dtype(DType::BF16).unwrap();
    for (name, t) in model.state_dict() {
        let expected = if name.ends_with("num_batches_tracked") { DType::I64 } else { DType::BF16 };
        assert_eq!(t.dtype(), expected, "{name}");
    }
    assert!(model.parameters().iter().all(|p| p.requires_grad() && p.is_leaf()));
    model.to_device(Device::Cpu).unwrap();
}

#[test]
fn zero_grad_clears_every_gradient() {
    let layer = Linear::new(3, 2, Device::Cpu).unwrap();
    layer
        .forward(&Var::constant(Tensor::ones([1, 3], DType::F32, Device::Cpu).unwrap()))
        .sum_all()
        .backward();
    assert!(layer.parameters().iter().all(|p| p.grad().is_some()));
    layer.zero_grad();
    assert!(layer.parameters().iter().all(|p| p.grad().is_none()));
}

#[test]
fn tied_parameters_are_listed_once_but_saved_under_both_names() {
    struct Tied {
        emb: Embedding,
        head: Parameter,
    }
    impl Module for Tied {
        fn visit(&self, v: &mut dyn Visitor) {
            v.child("emb", &self.emb);
            v.param("head", &self.head);
        }
    }
    let emb = Embedding::new(5, 3, Device::Cpu).unwrap();
    let head = Parameter::from_var(emb.weight.var());
    let tied = Tied { emb, head };
    assert_eq!(keys(tied.named_parameters()), ["head"]);
    assert_eq!(keys(tied.state_dict()), ["head", "emb.weight"]);
    // Converting keeps them tied.
    tied.to_dtype(DType::F64).unwrap();
    assert_eq!(keys(tied.named_parameters()), ["head"]);
    assert_eq!(tied.head.tensor().dtype(), DType::F64);
    assert!(tied.head.tensor().same_storage(&tied.emb.weight.tensor()));
}

#[test]
fn modules_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Sequential>();
    check::<MultiheadSelfAttention>();
    check::<BatchNorm2d>();
    check::<Box<dyn Forward>>();
}
