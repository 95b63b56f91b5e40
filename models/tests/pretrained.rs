//! `from_pretrained` of every model family: one shape (`path_or_dir`, `config` or `None` to
//! read it, device), built from the file without random initialisation, and errors for
//! configs and checkpoints that cannot make the model.

mod common;

use common::fill;
use oxtrain_autograd::no_grad;
use oxtrain_models::{
    BertConfig, BertModel, BlockKind, Gpt2Config, Gpt2LMHeadModel, Gpt2Model, ModelError, ResNet,
    ResNetConfig,
};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-pretrained-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn same_state(a: &dyn Module, b: &dyn Module) {
    let (a, b) = (a.state_dict(), b.state_dict());
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_f64_vec(), tb.to_f64_vec(), "{na} differs after the round trip");
    }
}

/// A ResNet saved as torchvision saves a state dict comes back with the same values and the
/// same outputs, from the file or its folder, with the architecture given or read from it.
#[test]
fn resnet_round_trip_with_and_without_a_config() {
    let d = tmp("resnet");
    // A small grouped bottleneck network, so reading the config has groups and width to find.
    let config = ResNetConfig {
        layers: [1, 2, 1, 1],
        groups: 4,
        width_per_group: 16,
        ..ResNetConfig::resnet50().with_num_classes(5)
    };
    let model = ResNet::new(&config, Device::Cpu).unwrap();
    fill(&model);
    model.save_safetensors(d.join("model.safetensors")).unwrap();

    let inferred = ResNet::from_pretrained(&d, None, Device::Cpu).unwrap();
    assert_eq!(inferred.config, config);
    same_state(&model, &inferred);
    let given = ResNet::from_pretrained(d.join("model.safetensors"), config.clone(), Device::Cpu).unwrap();
    same_state(&model, &given);

    let images = Tensor::randn([1, 3, 32, 32], oxtrain_tensor::DType::F32, Device::Cpu).unwrap();
    model.eval();
    inferred.eval();
    let (a, b) = no_grad(|| (model.forward(&images), inferred.forward(&images)));
    assert_eq!(a.tensor().to_vec::<f32>(), b.tensor().to_vec::<f32>());
    std::fs::remove_dir_all(&d).ok();
}

/// torchvision's own files predate `num_batches_tracked`: without it the network loads (the
/// counters stay 0); without a weight, or for another architecture, it fails naming them.
#[test]
fn resnet_from_pretrained_is_strict_about_weights() {
    let d = tmp("resnet-strict");
    let model = ResNet::new(&ResNetConfig::resnet18().with_num_classes(3), Device::Cpu).unwrap();
    let without = |skip: &dyn Fn(&str) -> bool, file: &Path| {
        let entries: Vec<(String, Tensor)> =
            model.state_dict().into_iter().filter(|(n, _)| !skip(n)).collect();
        let refs: Vec<(&str, &Tensor)> = entries.iter().map(|(n, t)| (n.as_str(), t)).collect();
        oxtrain_tensor::safetensors::save(&refs, None, file).unwrap();
    };
    let old = d.join("old.safetensors");
    without(&|n| n.ends_with("num_batches_tracked"), &old);
    let loaded = ResNet::from_pretrained(&old, None, Device::Cpu).unwrap();
    assert_eq!(loaded.config.block, BlockKind::Basic);
    assert_eq!((loaded.config.layers, loaded.config.num_classes), ([2, 2, 2, 2], 3));

    let holed = d.join("holed.safetensors");
    without(&|n| n == "layer2.1.conv2.weight", &holed);
    let err = ResNet::from_pretrained(&holed, None, Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("missing: layer2.1.conv2.weight"), "{err}");

    let err = ResNet::from_pretrained(&old, ResNetConfig::resnet34().with_num_classes(3), Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer1.2.conv1.weight"), "resnet34 has blocks the file lacks: {err}");

    let bert = fixture("bert_tiny/model.safetensors");
    let err = ResNet::from_pretrained(&bert, None, Device::Cpu).unwrap_err();
    assert!(matches!(err, ModelError::NotResNet { .. }) && err.to_string().contains("fc.weight"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

/// GPT-2 and BERT take the same three arguments; with a config given, the folder needs no
/// config.json; the bare GPT-2 takes the head model's checkpoint.
#[test]
fn transformers_take_the_same_arguments() {
    let gpt2 = fixture("gpt2_tiny");
    let reference = Gpt2LMHeadModel::from_pretrained(&gpt2, None, Device::Cpu).unwrap();
    let config = Gpt2Config::from_file(gpt2.join("config.json")).unwrap();
    let index = gpt2.join("model.safetensors.index.json");
    let explicit = Gpt2LMHeadModel::from_pretrained(&index, config.clone(), Device::Cpu).unwrap();
    same_state(&reference, &explicit);
    let bare = Gpt2Model::from_pretrained(&gpt2, None, Device::Cpu).unwrap();
    same_state(&reference.transformer, &bare);

    let bert_file = fixture("bert_tiny/model.safetensors");
    let bert = BertModel::from_pretrained(&bert_file, None, Device::Cpu).unwrap();
    let config = BertConfig::from_file(fixture("bert_tiny/config.json")).unwrap();
    let explicit = BertModel::from_pretrained(&bert_file, config, Device::Cpu).unwrap();
    same_state(&bert, &explicit);
}

/// A config.json whose heads do not split the width is an error naming the file and both
/// numbers, for GPT-2 and BERT alike, and so is the same config made in code.
#[test]
fn configs_that_cannot_make_a_model_are_errors() {
    let d = tmp("bad-config");
    let mut gpt2: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gpt2_tiny/config.json")).unwrap()).unwrap();
    gpt2["n_head"] = 5.into(); // n_embd is 64
    std::fs::write(d.join("config.json"), gpt2.to_string()).unwrap();
    let err = Gpt2LMHeadModel::from_pretrained(&d, None, Device::Cpu).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::BadFile { .. }), "{msg}");
    assert!(
        msg.contains("config.json") && msg.contains("n_embd (64)") && msg.contains("n_head (5)"),
        "{msg}"
    );

    let mut config = Gpt2Config::from_file(fixture("gpt2_tiny/config.json")).unwrap();
    config.n_head = 0;
    assert!(matches!(Gpt2Model::new(&config, Device::Cpu), Err(ModelError::BadConfig { .. })));

    let mut bert = BertConfig::from_file(fixture("bert_tiny/config.json")).unwrap();
    bert.num_attention_heads = bert.hidden_size + 1;
    let msg = BertModel::new(&bert, true, Device::Cpu).unwrap_err().to_string();
    assert!(msg.contains("num_attention_heads"), "{msg}");

    let grouped_basic = ResNetConfig { groups: 2, ..ResNetConfig::resnet18() };
    let msg = ResNet::new(&grouped_basic, Device::Cpu).unwrap_err().to_string();
    assert!(msg.contains("groups = 1"), "{msg}");
    std::fs::remove_dir_all(&d).ok();
}
