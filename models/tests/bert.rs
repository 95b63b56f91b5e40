//! BERT against Hugging Face: a small BertForSequenceClassification saved by `save_pretrained`
//! (models/fixtures/bert_tiny, `bert.`-prefixed names, written by make_fixtures.py) loads
//! through the real loader and must give HF's hidden states, pooler output, mean pooling,
//! logits, loss and gradients, with padding and token types.

mod common;

use common::{assert_rel, assert_scalar, check_grads};
use oxtrain_models::bert::{l2_normalize, mean_pooling};
use oxtrain_models::{BertConfig, BertForSequenceClassification, BertModel};
use oxtrain_nn::Module;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::Device;
use std::path::PathBuf;

const FIXTURES: &str = include_str!("../fixtures/bert.json");

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/bert_tiny")
}

#[test]
fn classifier_matches_transformers() {
    let fx = Fixtures::parse(FIXTURES, "bert.json");
    let t = |name: &str| fx.tensor("bert", name, Device::Cpu);
    let model = BertForSequenceClassification::from_pretrained(dir(), None, Device::Cpu).unwrap();
    let report = model.load_weights(dir()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty(), "{report:?}");
    assert_eq!(model.num_labels, 3);
    model.eval();
    let (ids, mask, types) = (t("ids"), t("mask"), t("types"));
    let out = model.bert.forward(&ids, Some(&mask), Some(&types));
    assert_rel(out.last_hidden_state.tensor(), &t("hidden"), 1e-4, "last_hidden_state");
    assert_rel(out.pooler_output.as_ref().unwrap().tensor(), &t("pooled"), 1e-4, "pooler_output");
    let mean = mean_pooling(&out.last_hidden_state, &mask);
    assert_rel(mean.tensor(), &t("mean_pooled"), 1e-4, "mean pooling");
    assert_rel(l2_normalize(&mean).tensor(), &t("normalized"), 1e-4, "normalized");

    let logits = model.forward(&ids, Some(&mask), Some(&types));
    assert_rel(logits.tensor(), &t("logits"), 1e-4, "logits");
    let loss = BertForSequenceClassification::loss(&logits, &t("labels"));
    assert_scalar(loss.tensor().item(), fx.scalar("bert", "loss"), 1e-4, "loss");
    loss.backward();
    let names = [
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.embeddings.word_embeddings.weight",
        "classifier.weight",
        "bert.pooler.dense.bias",
    ];
    check_grads(&model, &fx, "bert", &names, 4, 1e-4);
}

/// The classifier's checkpoint loads into the bare BertModel (`bert.` stripped, the
/// classifier reported as unexpected), and the bare model's state into the classifier (the
/// classifier reported as missing, freshly initialised).
#[test]
fn prefix_is_added_or_stripped_as_in_transformers() {
    let fx = Fixtures::parse(FIXTURES, "bert.json");
    let t = |name: &str| fx.tensor("bert", name, Device::Cpu);
    let bare = BertModel::from_pretrained(dir(), None, Device::Cpu).unwrap();
    bare.eval();
    let out = bare.forward(&t("ids"), Some(&t("mask")), Some(&t("types")));
    assert_rel(
        out.last_hidden_state.tensor(),
        &t("hidden"),
        1e-4,
        "bare model from the classifier's checkpoint",
    );
    let report = bare.load_weights(dir()).unwrap();
    assert_eq!(report.unexpected, ["classifier.bias", "classifier.weight"]);

    let tmp = std::env::temp_dir().join(format!("oxtrain-bert-bare-{}.safetensors", std::process::id()));
    bare.save_safetensors(&tmp).unwrap();
    let config = BertConfig::from_file(dir().join("config.json")).unwrap();
    let cls = BertForSequenceClassification::new(&config, Device::Cpu).unwrap();
    let report = cls.load_weights(&tmp).unwrap();
    assert_eq!(report.missing, ["classifier.weight", "classifier.bias"]);
    cls.eval();
    let out = cls.bert.forward(&t("ids"), Some(&t("mask")), Some(&t("types")));
    assert_rel(out.last_hidden_state.tensor(), &t("hidden"), 1e-4, "classifier from the bare checkpoint");
    std::fs::remove_file(&tmp).ok();

    // A checkpoint of another architecture: every missing name is listed.
    let gpt2 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpt2_tiny");
    let msg = bare.load_weights(gpt2).unwrap_err().to_string();
    assert!(
        msg.contains("encoder.layer.1.output.LayerNorm.bias") && msg.contains("transformer.wte.weight"),
        "{msg}"
    );
}

#[test]
fn state_dict_names_are_hugging_face_s() {
    let config = BertConfig::from_file(dir().join("config.json")).unwrap();
    let model = BertForSequenceClassification::new(&config, Device::Cpu).unwrap();
    let names: Vec<String> = model.state_dict().into_iter().map(|(n, _)| n).collect();
    let file = oxtrain_tensor::safetensors::load(dir().join("model.safetensors")).unwrap();
    let mut theirs = file.names().to_vec();
    let mut ours = names.clone();
    theirs.sort();
    ours.sort();
    assert_eq!(ours, theirs);
    assert_eq!(names[0], "bert.embeddings.word_embeddings.weight");
    assert!(names.contains(&"bert.encoder.layer.1.attention.output.LayerNorm.weight".to_string()));
}
