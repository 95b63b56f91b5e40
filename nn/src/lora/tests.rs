//! LoRA on a small model: PEFT's initialisation, the forward against f64 arithmetic, what
//! learns and what a walk finds, the errors for targets that do not fit; and the freezing and
//! batch-counter loading LoRA and fine-tuning build on. (Parity with PEFT itself is in
//! oxtrain-models' tests/lora.rs, on PEFT's own files.)

use super::*;
use crate::{freeze_matching, BatchNorm2d, Forward, FreezeError, LayerNorm, Linear, Sequential};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::HashMap;

fn config(targets: &[&str]) -> LoraConfig {
    LoraConfig {
        rank: 2,
        alpha: 6.0,
        dropout: 0.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
        modules_to_save: Vec::new(),
    }
}

/// `0`: Linear 5 -> 3, `1`: Linear 3 -> 4.
fn two_linears() -> Sequential {
    Sequential::new()
        .append(Linear::new(5, 3, Device::Cpu).unwrap())
        .append(Linear::new(3, 4, Device::Cpu).unwrap())
}

#[test]
fn adapters_start_as_peft_does_and_leave_the_output_unchanged() {
    let x = Var::constant(Tensor::randn([2, 5], DType::F32, Device::Cpu).unwrap());
    let model = LoraModel::new(two_linears(), &config(&["1"])).unwrap();
    let before = model.model.forward(&x).tensor().to_f64_vec();
    let mut seen = 0;
    model.adapters(&mut |name, _, a| {
        assert_eq!(name, "1");
        assert_eq!((a.lora_a.dims(), a.lora_b.dims()), (vec![2, 3], vec![4, 2]));
        // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) with in = 3.
        let bound = 1.0 / 3f64.sqrt();
        assert!(a.lora_a.tensor().to_f64_vec().iter().all(|v| v.abs() <= bound && *v != 0.0));
        assert!(a.lora_b.tensor().to_f64_vec().iter().all(|v| *v == 0.0));
        assert_eq!(a.scaling, 3.0);
        seen += 1;
    });
    assert_eq!(seen, 1);
    assert_eq!(model.model.forward(&x).tensor().to_f64_vec(), before);
}

#[test]
fn forward_adds_the_scaled_low_rank_update() {
    let lin = Linear::new(4, 3, Device::Cpu).unwrap();
    let model = LoraModel::new(Sequential::new().append(lin), &config(&["0"])).unwrap();
    let mut ab = (
        Tensor::zeros(1, DType::F32, Device::Cpu).unwrap(),
        Tensor::zeros(1, DType::F32, Device::Cpu).unwrap(),
    );
    model.adapters(&mut |_, _, a| {
        a.lora_b.tensor().copy_(&Tensor::randn([3, 2], DType::F32, Device::Cpu).unwrap());
        ab = (a.lora_a.tensor(), a.lora_b.tensor());
    });
    let state: HashMap<String, Tensor> = model.model.state_dict().into_iter().collect();
    let x = Tensor::randn([2, 4], DType::F32, Device::Cpu).unwrap();
    let y = model.model.forward(&Var::constant(x.clone())).tensor().to_f64_vec();
    let (w, b) = (state["0.weight"].to_f64_vec(), state["0.bias"].to_f64_vec());
    let (a, bb, xs) = (ab.0.to_f64_vec(), ab.1.to_f64_vec(), x.to_f64_vec());
    for n in 0..2 {
        for o in 0..3 {
            let base: f64 = b[o] + (0..4).map(|i| w[o * 4 + i] * xs[n * 4 + i]).sum::<f64>();
            let low: f64 = (0..2)
                .map(|k| bb[o * 2 + k] * (0..4).map(|i| a[k * 4 + i] * xs[n * 4 + i]).sum::<f64>())
                .sum();
            let expected = base + 3.0 * low;
            assert!((y[n * 3 + o] - expected).abs() < 1e-5, "y[{n},{o}] = {} vs {expected}", y[n * 3 + o]);
        }
    }
}

#[test]
fn only_adapters_learn_are_walked_and_get_gradients() {
    let model = LoraModel::new(two_linears(), &config(&["0", "1"])).unwrap();
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "base_model.model.0.lora_A.weight",
            "base_model.model.0.lora_B.weight",
            "base_model.model.1.lora_A.weight",
            "base_model.model.1.lora_B.weight"
        ]
    );
    assert_eq!(model.state_dict().len(), 4, "the base is not in the wrapper's state dict");
    assert!(model.model.trainable_named_parameters().is_empty(), "the base is frozen");
    let x = Var::constant(Tensor::randn([2, 5], DType::F32, Device::Cpu).unwrap());
    model.model.forward(&x).sum_all().backward();
    for (name, p) in model.named_parameters() {
        assert!(p.grad().is_some(), "{name} got no gradient");
    }
    let first = model.model.state_dict();
    assert_eq!(first[0].0, "0.weight");
}

#[test]
fn targets_that_do_not_fit_are_errors_naming_them() {
    let err = LoraModel::new(two_linears(), &config(&["c_attn"])).err().unwrap();
    assert!(matches!(&err, LoraError::NoMatch { target, .. } if target == "c_attn"), "{err}");
    let model = Sequential::new().append(LayerNorm::new([4], Device::Cpu).unwrap());
    let err = LoraModel::new(model, &config(&["0"])).err().unwrap();
    assert!(matches!(&err, LoraError::NotAdaptable { module, .. } if module == "0"), "{err}");
    let err = LoraModel::new(two_linears(), &LoraConfig { rank: 0, ..config(&["0"]) }).err().unwrap();
    assert!(matches!(err, LoraError::ZeroRank));
}

#[test]
fn freezing_by_pattern_leaves_those_out_of_the_trainable_parameters_but_in_the_state_dict() {
    let model = two_linears();
    let frozen = freeze_matching(&model, &["0.*"]).unwrap();
    assert_eq!(frozen, ["0.weight", "0.bias"]);
    let names: Vec<String> = model.trainable_named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["1.weight", "1.bias"]);
    // As PyTorch's named_parameters(), the full list keeps the frozen ones.
    assert_eq!(model.named_parameters().len(), 4);
    assert_eq!(model.state_dict().len(), 4);
    let x = Var::constant(Tensor::randn([2, 5], DType::F32, Device::Cpu).unwrap());
    model.forward(&x).sum_all().backward();
    let mut grads = 0;
    for (_, p) in model.named_parameters() {
        grads += p.grad().is_some() as usize;
    }
    assert_eq!(grads, 2);
    // A frozen parameter still loads (the state dict keeps it).
    let state: HashMap<String, Tensor> = model.state_dict().into_iter().collect();
    model.load_state_dict(&state, true).unwrap();
}

#[test]
fn a_freeze_pattern_that_matches_nothing_is_an_error_naming_it() {
    let err = freeze_matching(&two_linears(), &["0.*", "layer9.*"]).unwrap_err();
    assert!(matches!(&err, FreezeError::NoMatch { pattern, .. } if pattern == "layer9.*"), "{err}");
    assert!(err.to_string().contains("0.weight"), "the message shows what names look like: {err}");
    let err = freeze_matching(&two_linears(), &["[0"]).unwrap_err();
    assert!(matches!(err, FreezeError::BadPattern { .. }));
}

#[test]
fn a_missing_batch_counter_loads_strictly_and_keeps_its_value() {
    let bn = Sequential::new().append(BatchNorm2d::new(3, Device::Cpu).unwrap());
    let mut state: HashMap<String, Tensor> = bn.state_dict().into_iter().collect();
    assert!(state.remove("0.num_batches_tracked").is_some());
    bn.load_state_dict(&state, true).unwrap();
    // Any other missing name still fails a strict load.
    state.remove("0.running_mean");
    assert!(bn.load_state_dict(&state, true).is_err());
}
