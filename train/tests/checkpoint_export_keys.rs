//! Exported checkpoints carry exactly the tensors PyTorch's models hold: every name, shape and
//! dtype of torchvision's ResNet-18/50 and Hugging Face's GPT-2 and BERT `state_dict()`s,
//! `num_batches_tracked` included. The expected table is `checkpoint/export_keys.json`, made
//! from torchvision and transformers by `checkpoint/make_export_keys.py`, so this test needs no
//! Python and runs in CI; `checkpoint_export_torch.rs` loads the files in PyTorch itself where
//! torch is installed.

use oxtrain::checkpoint::{export, CheckpointConfig, Checkpointer};
use oxtrain_models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_models::{BertConfig, BertForSequenceClassification};
use oxtrain_nn::Module;
use oxtrain_tensor::safetensors::{self, SafetensorsFile};
use oxtrain_tensor::{DType, Device, Tensor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FIXTURE: &str = include_str!("checkpoint/export_keys.json");

/// What PyTorch's model of one architecture holds, from the fixture.
struct Expected {
    config: Value,
    /// `(name, dtype, shape)` in `state_dict()` order; dtypes as torch names them ("float32").
    tensors: Vec<(String, String, Vec<usize>)>,
    /// Names Hugging Face ties to another tensor and leaves out of its own files.
    tied: BTreeMap<String, String>,
}

fn expected(model: &str) -> Expected {
    let all: Value = serde_json::from_str(FIXTURE).unwrap();
    let entry = &all[model];
    let tensors =
        entry["tensors"].as_array().unwrap_or_else(|| panic!("no model {model} in export_keys.json"));
    let tensors = tensors.iter().map(|t| serde_json::from_value(t.clone()).unwrap()).collect();
    let tied = serde_json::from_value(entry["tied"].clone()).unwrap();
    Expected { config: entry["config"].clone(), tensors, tied }
}

/// Every way `file` differs from `expected`, one line each, naming the key.
fn differences(file: &SafetensorsFile, expected: &Expected) -> Vec<String> {
    let mut found = Vec::new();
    for (name, dtype, shape) in &expected.tensors {
        let Some(info) = file.info(name) else {
            if !expected.tied.contains_key(name) {
                found.push(format!("missing key {name}: PyTorch expects {dtype} {shape:?}"));
            }
            continue;
        };
        if &info.shape != shape {
            found.push(format!("shape of {name}: exported {:?}, PyTorch expects {shape:?}", info.shape));
        }
        if info.dtype.as_str() != dtype {
            found.push(format!("dtype of {name}: exported {}, PyTorch expects {dtype}", info.dtype));
        }
    }
    for name in file.names() {
        if !expected.tensors.iter().any(|(n, _, _)| n == name) {
            let info = file.info(name).unwrap();
            found.push(format!(
                "extra key {name} ({} {:?}): PyTorch's model has none",
                info.dtype, info.shape
            ));
        }
    }
    found
}

/// Saves `model` as a training checkpoint under `dir` and exports it as `oxtrain export` does.
fn export_model(model: &dyn Module, dir: &Path) -> PathBuf {
    let run = dir.join("run");
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&run)).unwrap();
    let snap = ckpt.snapshot(1, 0).unwrap().model(model).unwrap();
    ckpt.save(snap).unwrap();
    ckpt.finish().unwrap();
    let out = dir.join("model.safetensors");
    export(&run, &out).unwrap();
    out
}

fn assert_matches_pytorch(model: &dyn Module, arch: &str, expected: &Expected) {
    let dir = tempfile::tempdir().unwrap();
    let file = safetensors::load(export_model(model, dir.path())).unwrap();
    let problems = differences(&file, expected);
    assert!(problems.is_empty(), "{arch} export differs from PyTorch's state_dict:\n{}", problems.join("\n"));
    assert!(file.len() >= expected.tensors.len() - expected.tied.len(), "{arch}: {} tensors", file.len());
}

fn resnet(arch: &str) -> ResNet {
    let config = match arch {
        "resnet18" => ResNetConfig::resnet18(),
        "resnet50" => ResNetConfig::resnet50(),
        _ => unreachable!("{arch}"),
    };
    assert_eq!(expected(arch).config["num_classes"], config.num_classes);
    ResNet::new(&config, Device::Cpu).unwrap()
}

#[test]
fn resnet18_export_has_torchvisions_keys_shapes_and_dtypes() {
    assert_matches_pytorch(&resnet("resnet18"), "resnet18", &expected("resnet18"));
}

#[test]
fn resnet50_export_has_torchvisions_keys_shapes_and_dtypes() {
    assert_matches_pytorch(&resnet("resnet50"), "resnet50", &expected("resnet50"));
}

#[test]
fn gpt2_export_has_hugging_faces_keys_shapes_and_dtypes() {
    let expected = expected("gpt2");
    let config: Gpt2Config = serde_json::from_value(expected.config.clone()).unwrap();
    assert_matches_pytorch(&Gpt2LMHeadModel::new(&config, Device::Cpu).unwrap(), "gpt2", &expected);
}

#[test]
fn bert_export_has_hugging_faces_keys_shapes_and_dtypes() {
    let expected = expected("bert");
    let mut json = expected.config.clone();
    // Hugging Face's `num_labels` is the length of `id2label`, which is what oxtrain reads.
    let labels = json["num_labels"].as_u64().unwrap();
    json["id2label"] = (0..labels).map(|i| (i.to_string(), Value::from(format!("LABEL_{i}")))).collect();
    let config: BertConfig = serde_json::from_value(json).unwrap();
    assert_matches_pytorch(
        &BertForSequenceClassification::new(&config, Device::Cpu).unwrap(),
        "bert",
        &expected,
    );
}

/// The comparison catches each kind of mistake and names the key: a renamed tensor (missing
/// plus extra), a reshaped one, one of another dtype, and one left out.
#[test]
fn a_renamed_reshaped_retyped_or_missing_tensor_fails_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let exported = export_model(&resnet("resnet18"), dir.path());
    let expected = expected("resnet18");
    let mut tensors: Vec<(String, Tensor)> = safetensors::load_all(&exported).unwrap();
    assert!(differences(&safetensors::load(&exported).unwrap(), &expected).is_empty());

    let mut edit = |name: &str, change: &dyn Fn(&mut (String, Tensor))| {
        let entry = tensors.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}"));
        change(entry);
    };
    edit("fc.weight", &|e| e.0 = "fc.weights".into());
    edit("layer1.0.conv1.weight", &|e| e.1 = e.1.reshape([64, 576]));
    edit("bn1.num_batches_tracked", &|e| e.1 = e.1.to_dtype(DType::F32));
    tensors.retain(|(n, _)| n != "layer4.1.bn2.running_var");
    let broken = dir.path().join("broken.safetensors");
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::save(&refs, None, &broken).unwrap();

    let mut problems = differences(&safetensors::load(&broken).unwrap(), &expected);
    problems.sort();
    assert_eq!(
        problems,
        [
            "dtype of bn1.num_batches_tracked: exported float32, PyTorch expects int64",
            "extra key fc.weights (float32 [1000, 512]): PyTorch's model has none",
            "missing key fc.weight: PyTorch expects float32 [1000, 512]",
            "missing key layer4.1.bn2.running_var: PyTorch expects float32 [512]",
            "shape of layer1.0.conv1.weight: exported [64, 576], PyTorch expects [64, 64, 3, 3]",
        ]
    );
}

/// A tied name may be left out (Hugging Face's own files leave it out), but only a tied one.
#[test]
fn only_a_tied_tensor_may_be_left_out() {
    let expected = expected("gpt2");
    assert_eq!(expected.tied.get("lm_head.weight").map(String::as_str), Some("transformer.wte.weight"));
    let dir = tempfile::tempdir().unwrap();
    let wte = Tensor::zeros([97, 64], DType::F32, Device::Cpu).unwrap();
    let path = dir.path().join("only-wte.safetensors");
    safetensors::save(&[("transformer.wte.weight", &wte)], None, &path).unwrap();
    let problems = differences(&safetensors::load(&path).unwrap(), &expected);
    assert!(!problems.iter().any(|p| p.contains("lm_head.weight")), "{problems:?}");
    assert!(problems
        .iter()
        .any(|p| p == "missing key transformer.wpe.weight: PyTorch expects float32 [32, 64]"));
}
