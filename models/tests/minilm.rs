//! The real all-MiniLM-L6-v2 checkpoint: tokenization and sentence embeddings (mean pooling,
//! L2-normalised) against sentence-transformers (fixtures/minilm.json, written by
//! fixtures/make_minilm_fixture.py), and a few SGD fine-tuning steps that lower the loss.
//!
//! The checkpoint is not in the repository: `scripts/fetch_test_assets.sh` puts it in
//! `$OXTRAIN_TEST_ASSETS` (default `<workspace>/target/test-assets`). Without it the tests say
//! they are skipped, unless `OXTRAIN_REQUIRE_TEST_ASSETS=1` (as in CI) makes them fail.

mod common;

use common::assert_rel;
use oxtrain_models::bert::{l2_normalize, mean_pooling};
use oxtrain_models::{BertForSequenceClassification, BertModel, Padding, Tokenizer};
use oxtrain_nn::Module;
use oxtrain_tensor::testing::Fixtures;
use oxtrain_tensor::{Device, Tensor};
use std::path::PathBuf;

const FIXTURES: &str = include_str!("../fixtures/minilm.json");

/// The checkpoint folder, or `None` (after saying why) when it is absent and not required.
fn assets() -> Option<PathBuf> {
    let root = std::env::var_os("OXTRAIN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-assets"));
    let dir = root.join("all-MiniLM-L6-v2");
    if dir.join("model.safetensors").is_file() && dir.join("tokenizer.json").is_file() {
        return Some(dir);
    }
    let msg = format!(
        "all-MiniLM-L6-v2 is not in {}; fetch it with scripts/fetch_test_assets.sh (or point \
         OXTRAIN_TEST_ASSETS at a folder holding all-MiniLM-L6-v2/)",
        root.display()
    );
    if std::env::var("OXTRAIN_REQUIRE_TEST_ASSETS").as_deref() == Ok("1") {
        panic!("{msg}");
    }
    eprintln!("skipped: {msg}");
    None
}

fn sentences() -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(FIXTURES).unwrap();
    serde_json::from_value(v["minilm"]["sentences"].clone()).unwrap()
}

#[test]
fn sentence_embeddings_match_sentence_transformers() {
    let Some(dir) = assets() else { return };
    let fx = Fixtures::parse(FIXTURES, "minilm.json");
    let sentences = sentences();
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let tokenizer = Tokenizer::from_file(&dir).unwrap();
    let batch = tokenizer.encode_batch(&texts, Padding::Longest, Some(256), Device::Cpu).unwrap();
    assert_eq!(batch.input_ids.to_vec::<i64>(), fx.tensor("minilm", "ids", Device::Cpu).to_vec::<i64>());
    assert_eq!(batch.input_ids.dims(), fx.tensor("minilm", "ids", Device::Cpu).dims());
    let mask = fx.tensor("minilm", "mask", Device::Cpu);
    assert_eq!(batch.attention_mask.to_vec::<i64>(), mask.to_vec::<i64>());

    // Fixed-length padding truncates and pads every row to that length.
    let fixed = tokenizer.encode_batch(&texts, Padding::Fixed(8), None, Device::Cpu).unwrap();
    assert_eq!(fixed.input_ids.dims(), [texts.len(), 8]);
    let ids = fx.tensor("minilm", "ids", Device::Cpu).to_vec::<i64>();
    let width = batch.input_ids.dims()[1];
    assert_eq!(fixed.input_ids.to_vec::<i64>()[..7], ids[..7], "the first row's tokens up to the limit");
    assert_eq!(fixed.input_ids.to_vec::<i64>()[7], 102, "truncation keeps [SEP] last");
    assert!(width > 8, "the longest sentence needs more than 8 tokens");

    let model = BertModel::from_pretrained(&dir, None, Device::Cpu).unwrap();
    model.eval();
    let out = oxtrain_autograd::no_grad(|| {
        model.forward(&batch.input_ids, Some(&batch.attention_mask), Some(&batch.token_type_ids))
    });
    let embeddings = l2_normalize(&mean_pooling(&out.last_hidden_state, &batch.attention_mask));
    assert_rel(
        embeddings.tensor(),
        &fx.tensor("minilm", "embeddings", Device::Cpu),
        1e-4,
        "sentence embeddings",
    );
}

/// Plain SGD on the classifier and the last encoder layer of a MiniLM classifier lowers the
/// training loss on a tiny batch (dropout off, so the steps are deterministic).
#[test]
fn fine_tuning_steps_lower_the_loss() {
    let Some(dir) = assets() else { return };
    let model = BertForSequenceClassification::from_pretrained(&dir, None, Device::Cpu).unwrap();
    let report = model.load_weights(&dir).unwrap();
    assert_eq!(report.missing, ["classifier.weight", "classifier.bias"], "a fresh head on the encoder");
    model.eval();
    let tokenizer = Tokenizer::from_file(&dir).unwrap();
    let texts = [
        "I loved this film.",
        "Terrible, a waste of time.",
        "What a wonderful day!",
        "I hated every minute.",
    ];
    let batch = tokenizer.encode_batch(&texts, Padding::Longest, None, Device::Cpu).unwrap();
    let labels = Tensor::from_vec(vec![1i64, 0, 1, 0], [4], Device::Cpu).unwrap();
    let trained: Vec<_> = model
        .named_parameters()
        .into_iter()
        .filter(|(n, _)| n.starts_with("classifier.") || n.starts_with("bert.encoder.layer.5."))
        .map(|(_, p)| p)
        .collect();
    let mut losses = Vec::new();
    for _ in 0..6 {
        model.zero_grad();
        let logits =
            model.forward(&batch.input_ids, Some(&batch.attention_mask), Some(&batch.token_type_ids));
        let loss = BertForSequenceClassification::loss(&logits, &labels);
        loss.backward();
        losses.push(loss.tensor().item());
        for p in &trained {
            let g = p.grad().expect("a trained parameter has a gradient");
            p.tensor().sub_(&g.mul_scalar(0.5));
        }
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[5] < losses[0] * 0.8, "the loss should fall: {losses:?}");
}
