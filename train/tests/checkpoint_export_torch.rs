//! Exported checkpoints load into PyTorch as they are: a ResNet-18 into torchvision's
//! `resnet18().load_state_dict(load_file(...))` (strict) and a GPT-2 into Hugging Face's
//! `GPT2LMHeadModel.from_pretrained(dir)`, with the same logits as oxtrain's. Runs
//! `checkpoint/export_check.py` with `$OXTRAIN_TEST_PYTHON` (default `python3`), which must have
//! torch, torchvision, transformers and safetensors, so it is ignored unless asked for
//! (`cargo test --release -p oxtrain --test checkpoint_export_torch -- --include-ignored`). CI
//! has no torch: there `checkpoint_export_keys.rs` checks every exported name, shape and dtype
//! against a table that torchvision and transformers wrote.

use oxtrain::checkpoint::{export, CheckpointConfig, Checkpointer};
use oxtrain_autograd::Var;
use oxtrain_models::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{safetensors, DType, Device, Tensor};
use std::path::Path;
use std::process::Command;

fn python() -> String {
    std::env::var("OXTRAIN_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn has_torch(python: &str) -> bool {
    Command::new(python)
        .args(["-c", "import torch, torchvision, transformers, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Saves `model` as a checkpoint under `run` and exports it to `out/model.safetensors`.
fn checkpoint_and_export(model: &dyn Module, run: &Path, out: &Path) {
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(run)).unwrap();
    let snap = ckpt.snapshot(1, 0).unwrap().model(model).unwrap();
    ckpt.save(snap).unwrap();
    ckpt.finish().unwrap();
    export(run, out.join("model.safetensors")).unwrap();
}

#[test]
#[ignore = "needs a python with torch, torchvision, transformers and safetensors (OXTRAIN_TEST_PYTHON)"]
fn exported_models_load_in_pytorch() {
    let python = python();
    assert!(
        has_torch(&python),
        "`{python}` cannot import torch, torchvision, transformers and safetensors; set \
         OXTRAIN_TEST_PYTHON to a python that can"
    );
    let root = std::env::temp_dir().join(format!("oxtrain-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);

    oxtrain_tensor::manual_seed(3);
    let resnet = ResNet::new(&ResNetConfig::resnet18(), Device::Cpu).unwrap();
    resnet.eval();
    checkpoint_and_export(&resnet, &root.join("resnet-run"), &root.join("resnet"));
    let x = Tensor::randn([2, 3, 64, 64], DType::F32, Device::Cpu).unwrap();
    let logits = resnet.forward(Var::constant(x.clone())).tensor().clone();
    safetensors::save(&[("x", &x), ("logits", &logits)], None, root.join("resnet/io.safetensors")).unwrap();

    let config = Gpt2Config {
        vocab_size: 97,
        n_positions: 32,
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        ..Gpt2Config::gpt2()
    };
    let gpt2 = Gpt2LMHeadModel::new(&config, Device::Cpu).unwrap();
    gpt2.eval();
    checkpoint_and_export(&gpt2, &root.join("gpt2-run"), &root.join("gpt2"));
    let mut json = serde_json::to_value(&config).unwrap();
    json["model_type"] = "gpt2".into();
    json["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
    std::fs::write(root.join("gpt2/config.json"), json.to_string()).unwrap();
    let ids: Vec<i64> = (0..12).map(|i| (i * 37 + 5) % 97).collect();
    let ids = Tensor::from_vec(ids, [2, 6], Device::Cpu).unwrap();
    let logits = gpt2.forward(&ids, None).tensor().clone();
    safetensors::save(&[("input_ids", &ids), ("logits", &logits)], None, root.join("gpt2/io.safetensors"))
        .unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/checkpoint/export_check.py");
    let out = Command::new(&python).arg(&script).arg(&root).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.matches(" ok").count(), 2, "{stdout}");
    let _ = std::fs::remove_dir_all(root);
}
