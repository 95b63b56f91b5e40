//! GPT-2 against Hugging Face: a small GPT2LMHeadModel saved by `save_pretrained` in two
//! shards with an index (models/fixtures/gpt2_tiny, written by make_fixtures.py) is loaded
//! through the real loader and must give HF's logits, loss and gradients.

mod common;

use common::{assert_rel, assert_scalar, check_grads};
use oxtrain_models::{Gpt2Config, Gpt2LMHeadModel, Gpt2Model, ModelError};
use oxtrain_nn::Module;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::{Device, Tensor};
use std::collections::HashMap;
use std::path::PathBuf;

const FIXTURES: &str = include_str!("../fixtures/gpt2.json");

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpt2_tiny")
}

#[test]
fn sharded_checkpoint_matches_transformers() {
    let fx = Fixtures::parse(FIXTURES, "gpt2.json");
    let model = Gpt2LMHeadModel::from_pretrained(dir(), None, Device::Cpu).unwrap();
    model.eval();
    let ids = fx.tensor("gpt2", "ids", Device::Cpu);
    let logits = model.forward(&ids, None);
    assert_rel(logits.tensor(), &fx.tensor("gpt2", "logits", Device::Cpu), 1e-4, "logits");
    let loss = Gpt2LMHeadModel::loss(&logits, &fx.tensor("gpt2", "labels", Device::Cpu));
    assert_scalar(loss.tensor().item(), fx.scalar("gpt2", "loss"), 1e-4, "loss");
    loss.backward();
    let names = [
        "transformer.h.0.attn.c_attn.weight",
        "transformer.wte.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.weight",
    ];
    check_grads(&model, &fx, "gpt2", &names, 4, 1e-4);

    let mask = fx.tensor("gpt2", "mask", Device::Cpu);
    let masked = oxtrain_autograd::no_grad(|| model.forward(&ids, Some(&mask)));
    assert_rel(
        masked.tensor(),
        &fx.tensor("gpt2", "masked_logits", Device::Cpu),
        1e-4,
        "logits with padding",
    );
}

/// The chunked loss (`set_chunked_loss`: the head and the cross-entropy in chunks of tokens,
/// logits recomputed in backward) gives HF's loss and gradients too.
#[test]
fn chunked_loss_matches_transformers() {
    let fx = Fixtures::parse(FIXTURES, "gpt2.json");
    let mut model = Gpt2LMHeadModel::from_pretrained(dir(), None, Device::Cpu).unwrap();
    model.eval();
    model.set_chunked_loss(true);
    let ids = fx.tensor("gpt2", "ids", Device::Cpu);
    let loss = model.forward_loss(&ids, &fx.tensor("gpt2", "labels", Device::Cpu), None);
    assert_scalar(loss.tensor().item(), fx.scalar("gpt2", "loss"), 1e-4, "loss");
    loss.backward();
    let names = ["transformer.h.0.attn.c_attn.weight", "transformer.wte.weight", "transformer.ln_f.weight"];
    check_grads(&model, &fx, "gpt2", &names, 4, 1e-4);
}

#[test]
fn lm_head_is_tied_to_wte() {
    let model = Gpt2LMHeadModel::new(&Gpt2Config::from_file(dir().join("config.json")).unwrap(), Device::Cpu)
        .unwrap();
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "transformer.wte.weight");
    assert!(!names.contains(&"lm_head.weight".to_string()), "a tied head is one parameter");
    assert!(
        model.state_dict().iter().any(|(n, _)| n == "lm_head.weight"),
        "but it is in the state dict, as in HF"
    );
    assert!(model.lm_head.weight.tensor().same_storage(&model.transformer.wte.weight.tensor()));
}

/// Names with and without `transformer.`, with and without `lm_head.weight`, and the old
/// causal-mask buffers all load to the same model.
#[test]
fn checkpoint_names_with_or_without_prefix_and_head() {
    let fx = Fixtures::parse(FIXTURES, "gpt2.json");
    let ids = fx.tensor("gpt2", "ids", Device::Cpu);
    let reference = Gpt2LMHeadModel::from_pretrained(dir(), None, Device::Cpu).unwrap();
    let state: Vec<(String, Tensor)> = reference.state_dict();
    let tmp = std::env::temp_dir().join(format!("oxtrain-gpt2-names-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let config = Gpt2Config::from_file(dir().join("config.json")).unwrap();
    type Rename = Box<dyn Fn(&str) -> Option<String>>;
    let variants: [(&str, Rename); 3] = [
        ("with head", Box::new(|n: &str| Some(n.to_string()))),
        ("bare model", Box::new(|n: &str| n.strip_prefix("transformer.").map(str::to_string))),
        ("with mask buffers", Box::new(|n: &str| Some(n.replace("ln_1.weight", "attn.bias")))),
    ];
    for (what, rename) in variants {
        let entries: Vec<(String, Tensor)> =
            state.iter().filter_map(|(n, t)| rename(n).map(|m| (m, t.clone()))).collect();
        let mut entries = entries;
        if what == "with mask buffers" {
            entries.extend(state.iter().map(|(n, t)| (n.clone(), t.clone())));
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries.dedup_by(|a, b| a.0 == b.0);
        }
        let refs: Vec<(&str, &Tensor)> = entries.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let file = tmp.join(format!("{}.safetensors", what.replace(' ', "_")));
        oxtrain_tensor::safetensors::save(&refs, None, &file).unwrap();
        let model = Gpt2LMHeadModel::new(&config, Device::Cpu).unwrap();
        let report = model.load_weights(&file).unwrap();
        assert!(report.missing.is_empty() && report.unexpected.is_empty(), "{what}: {report:?}");
        model.eval();
        reference.eval();
        let (a, b) = oxtrain_autograd::no_grad(|| (model.forward(&ids, None), reference.forward(&ids, None)));
        assert_rel(a.tensor(), b.tensor(), 0.0, what);
    }
    // And the bare GPT2Model takes the head model's checkpoint, dropping `transformer.`.
    let bare = Gpt2Model::new(&config, Device::Cpu).unwrap();
    let state: HashMap<String, Tensor> = oxtrain_models::loading::read_checkpoint(dir()).unwrap();
    let report = oxtrain_models::loading::load_pretrained(
        &bare,
        state,
        &oxtrain_models::loading::NameRules { base_prefix: "transformer", ..Default::default() },
    )
    .unwrap();
    assert!(report.missing.is_empty(), "{report:?}");
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn another_architecture_is_refused_with_every_name() {
    let bert = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/bert_tiny/model.safetensors");
    let model = Gpt2LMHeadModel::new(&Gpt2Config::from_file(dir().join("config.json")).unwrap(), Device::Cpu)
        .unwrap();
    let err = model.load_weights(bert).unwrap_err();
    assert!(matches!(err, ModelError::Load(_)), "{err}");
    let msg = err.to_string();
    for name in [
        "transformer.wte.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "bert.embeddings.word_embeddings.weight",
        "classifier.weight",
    ] {
        assert!(msg.contains(name), "the error should name {name}: {msg}");
    }
    // Same names, wrong shapes: a wider config.
    let mut wide = Gpt2Config::from_file(dir().join("config.json")).unwrap();
    wide.n_embd = 128;
    let model = Gpt2LMHeadModel::new(&wide, Device::Cpu).unwrap();
    let msg = model.load_weights(dir()).unwrap_err().to_string();
    assert!(msg.contains("transformer.wte.weight (module [100, 128], state dict [100, 64])"), "{msg}");
}
