//! LoRA against PEFT: adapters saved by PEFT (models/fixtures/{gpt2,bert}_lora, written by
//! make_lora_fixtures.py with random nonzero A and B) load into our models, whose forward must
//! give PEFT's logits; what we save must carry PEFT's names; the merged weights must be
//! `W + scale * B @ A`, checked in f64.

mod common;

use common::assert_rel;
use oxtrain_models::{BertForSequenceClassification, Gpt2LMHeadModel};
use oxtrain_nn::lora::{peft, LoraModel};
use oxtrain_nn::Module;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::{Device, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

type StateDict = Vec<(String, Tensor)>;

const FIXTURES: &str = include_str!("../fixtures/lora.json");

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(path)
}

fn gpt2_with_peft_adapter() -> LoraModel<Gpt2LMHeadModel> {
    let base = Gpt2LMHeadModel::from_pretrained(fixture("gpt2_lora/base"), None, Device::Cpu).unwrap();
    let adapter = fixture("gpt2_lora/adapter");
    let model = LoraModel::new(base, &peft::read_config(&adapter).unwrap()).unwrap();
    peft::load_adapter(&model, &adapter).unwrap();
    model.eval();
    model
}

fn bert_with_peft_adapter() -> LoraModel<BertForSequenceClassification> {
    let base =
        BertForSequenceClassification::from_pretrained(fixture("bert_tiny"), None, Device::Cpu).unwrap();
    let adapter = fixture("bert_lora/adapter");
    let model = LoraModel::new(base, &peft::read_config(&adapter).unwrap()).unwrap();
    peft::load_adapter(&model, &adapter).unwrap();
    model.eval();
    model
}

/// Names and shapes of a safetensors file.
fn names_and_shapes(path: &std::path::Path) -> BTreeMap<String, Vec<usize>> {
    oxtrain_tensor::safetensors::load_all(path)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect()
}

#[test]
fn gpt2_forward_with_peft_adapters_equals_peft() {
    let fx = Fixtures::parse(FIXTURES, "lora.json");
    let model = gpt2_with_peft_adapter();
    assert_eq!(model.adapted, ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]);
    let logits = model.forward(&fx.tensor("gpt2", "ids", Device::Cpu), None);
    assert_rel(logits.tensor(), &fx.tensor("gpt2", "logits", Device::Cpu), 1e-5, "gpt2 logits");
    // The adapters matter: without them the logits differ by far more than the tolerance.
    let bare = Gpt2LMHeadModel::from_pretrained(fixture("gpt2_lora/base"), None, Device::Cpu).unwrap();
    bare.eval();
    let plain = bare.forward(&fx.tensor("gpt2", "ids", Device::Cpu), None);
    let diff = plain.tensor().sub(logits.tensor()).abs().max_all().item();
    assert!(diff > 1e-2, "the adapters changed the logits by only {diff}");
}

#[test]
fn bert_forward_with_peft_adapters_equals_peft() {
    let fx = Fixtures::parse(FIXTURES, "lora.json");
    let model = bert_with_peft_adapter();
    let (ids, mask) = (fx.tensor("bert", "ids", Device::Cpu), fx.tensor("bert", "mask", Device::Cpu));
    let logits = model.forward(&ids, Some(&mask), None);
    assert_rel(logits.tensor(), &fx.tensor("bert", "logits", Device::Cpu), 1e-5, "bert logits");
}

#[test]
fn saved_adapters_have_peft_names_and_config() {
    let dir = std::env::temp_dir().join(format!("oxtrain-lora-names-{}", std::process::id()));
    for (model_dir, save) in [
        (
            "gpt2_lora/adapter",
            Box::new(|d: &std::path::Path| peft::save_adapter(&gpt2_with_peft_adapter(), d, "gpt2"))
                as Box<dyn Fn(&std::path::Path) -> _>,
        ),
        (
            "bert_lora/adapter",
            Box::new(|d: &std::path::Path| peft::save_adapter(&bert_with_peft_adapter(), d, "bert")),
        ),
    ] {
        let out = dir.join(model_dir);
        save(&out).unwrap();
        let ours = names_and_shapes(&out.join(peft::ADAPTER_WEIGHTS_FILE));
        let theirs = names_and_shapes(&fixture(model_dir).join(peft::ADAPTER_WEIGHTS_FILE));
        assert_eq!(ours, theirs, "{model_dir}: our adapter file's names and shapes are not PEFT's");
        let read = |p: PathBuf| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        let (ours, theirs) = (
            read(out.join(peft::ADAPTER_CONFIG_FILE)),
            read(fixture(model_dir).join(peft::ADAPTER_CONFIG_FILE)),
        );
        for key in ["peft_type", "r", "fan_in_fan_out", "bias"] {
            assert_eq!(ours[key], theirs[key], "{model_dir}: {key}");
        }
        assert_eq!(ours["lora_alpha"].as_f64(), theirs["lora_alpha"].as_f64(), "{model_dir}: lora_alpha");
        let sorted = |v: &serde_json::Value| {
            let mut names: Vec<String> =
                v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            names.sort();
            names
        };
        assert_eq!(sorted(&ours["target_modules"]), sorted(&theirs["target_modules"]), "{model_dir}");
        // And what we wrote loads back into a fresh model with the same values.
        assert!(peft::read_config(&out).is_ok());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `W + scale * B @ A` in f64 from the tensors, for a weight stored `[out, in]` or (`fan_in_fan_out`) `[in, out]`.
fn merged_in_f64(w: &Tensor, a: &Tensor, b: &Tensor, scale: f64, fan_in_fan_out: bool) -> Vec<f64> {
    let (r, inp, out) = (a.dims()[0], a.dims()[1], b.dims()[0]);
    let (w, a, b) = (w.to_f64_vec(), a.to_f64_vec(), b.to_f64_vec());
    let mut m = w.clone();
    for o in 0..out {
        for i in 0..inp {
            let d: f64 = (0..r).map(|k| b[o * r + k] * a[k * inp + i]).sum();
            let at = if fan_in_fan_out { i * out + o } else { o * inp + i };
            m[at] += scale * d;
        }
    }
    m
}

#[test]
fn merged_state_is_base_plus_scaled_product_and_gives_the_same_logits() {
    let fx = Fixtures::parse(FIXTURES, "lora.json");
    for fan_in_fan_out in [true, false] {
        let (merged, adapters, base): (StateDict, StateDict, StateDict) = if fan_in_fan_out {
            let m = gpt2_with_peft_adapter();
            (m.merged_state_dict(), m.state_dict(), m.model.state_dict())
        } else {
            let m = bert_with_peft_adapter();
            (m.merged_state_dict(), m.state_dict(), m.model.state_dict())
        };
        let get =
            |list: &[(String, Tensor)], name: &str| list.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let mut checked = 0;
        for (name, _) in adapters.iter().filter(|(n, _)| n.ends_with("lora_A.weight")) {
            let module = name.trim_start_matches("base_model.model.").trim_end_matches(".lora_A.weight");
            let weight = format!("{module}.weight");
            let scale = if fan_in_fan_out { 8.0 / 4.0 } else { 16.0 / 4.0 };
            let expected = merged_in_f64(
                &get(&base, &weight),
                &get(&adapters, name),
                &get(&adapters, &name.replace("lora_A", "lora_B")),
                scale,
                fan_in_fan_out,
            );
            let got = get(&merged, &weight).to_f64_vec();
            let worst = got.iter().zip(&expected).map(|(g, e)| (g - e).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-6, "{weight}: merged differs from W + scale B A by {worst}");
            checked += 1;
        }
        assert!(checked >= 2);
        // Every other name keeps the base's value.
        assert_eq!(merged.len(), base.len());
    }
    // The merged GPT-2 alone gives PEFT's logits.
    let merged = gpt2_with_peft_adapter().merged_state_dict();
    let plain = Gpt2LMHeadModel::from_pretrained(fixture("gpt2_lora/base"), None, Device::Cpu).unwrap();
    plain.load_state_dict(&merged.into_iter().collect(), true).unwrap();
    plain.eval();
    let logits = plain.forward(&fx.tensor("gpt2", "ids", Device::Cpu), None);
    assert_rel(logits.tensor(), &fx.tensor("gpt2", "logits", Device::Cpu), 1e-5, "merged gpt2 logits");
}

#[test]
fn only_adapters_learn_and_are_listed() {
    let model = gpt2_with_peft_adapter();
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.contains(".lora_")), "{names:?}");
    // The base is frozen in place: no parameter of the inner model learns.
    assert!(model.model.trainable_named_parameters().is_empty());
    // BERT's classifier is a module to save (PEFT's SEQ_CLS): it learns and is saved whole.
    let bert = bert_with_peft_adapter();
    let names: Vec<String> = bert.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"base_model.model.classifier.weight".to_string()), "{names:?}");
}
