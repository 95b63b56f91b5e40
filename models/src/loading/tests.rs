use super::*;
use oxtrain_tensor::{DType, Device};

fn t(n: usize) -> Tensor {
    Tensor::zeros([n], DType::F32, Device::Cpu).unwrap()
}

fn names(state: &HashMap<String, Tensor>) -> Vec<String> {
    let mut v: Vec<String> = state.keys().cloned().collect();
    v.sort();
    v
}

#[test]
fn prefix_is_added_for_a_head_model_and_kept_for_top_level_names() {
    let model = vec!["transformer.wte.weight".to_string(), "lm_head.weight".to_string()];
    let state = HashMap::from([("wte.weight".to_string(), t(1)), ("lm_head.weight".to_string(), t(1))]);
    let rules = NameRules { base_prefix: "transformer", ..Default::default() };
    assert_eq!(names(&fit_names(&model, state, &rules)), ["lm_head.weight", "transformer.wte.weight"]);
}

#[test]
fn prefix_is_stripped_for_a_bare_model_and_ignored_names_dropped() {
    let model = vec!["embeddings.word_embeddings.weight".to_string()];
    let state = HashMap::from([
        ("bert.embeddings.word_embeddings.weight".to_string(), t(1)),
        ("bert.embeddings.position_ids".to_string(), t(1)),
        ("classifier.weight".to_string(), t(1)),
    ]);
    let rules =
        NameRules { base_prefix: "bert", ignore_suffixes: &["embeddings.position_ids"], may_be_missing: &[] };
    assert_eq!(
        names(&fit_names(&model, state, &rules)),
        ["classifier.weight", "embeddings.word_embeddings.weight"]
    );
}

#[test]
fn sharded_index_is_read_and_checked() {
    let dir = std::env::temp_dir().join(format!("oxtrain-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    safetensors::save(&[("a", &t(2))], None, dir.join("s1.safetensors")).unwrap();
    safetensors::save(&[("b", &t(3))], None, dir.join("s2.safetensors")).unwrap();
    let index = r#"{"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}"#;
    std::fs::write(dir.join(SAFETENSORS_INDEX_FILE), index).unwrap();
    let state = read_checkpoint(&dir).unwrap();
    assert_eq!(names(&state), ["a", "b"]);
    assert_eq!(state["b"].dims(), [3]);

    let wrong = r#"{"weight_map": {"a": "s2.safetensors"}}"#;
    std::fs::write(dir.join(SAFETENSORS_INDEX_FILE), wrong).unwrap();
    let err = read_checkpoint(&dir).unwrap_err().to_string();
    assert!(err.contains("puts `a` in s2.safetensors"), "{err}");

    std::fs::remove_file(dir.join(SAFETENSORS_INDEX_FILE)).unwrap();
    let err = read_checkpoint(&dir).unwrap_err().to_string();
    assert!(err.contains("neither model.safetensors nor"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A fresh folder with `model.safetensors.index.json` holding `weight_map`, and one real shard.
fn index_folder(test: &str, weight_map: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxtrain-models-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    safetensors::save(&[("w", &t(2))], None, dir.join("model-00001-of-00001.safetensors")).unwrap();
    std::fs::write(
        dir.join(SAFETENSORS_INDEX_FILE),
        format!(r#"{{"metadata":{{}},"weight_map":{weight_map}}}"#),
    )
    .unwrap();
    dir
}

#[test]
fn a_weight_map_naming_a_path_outside_the_folder_is_refused() {
    // A shard beside the folder that a `..` would reach: it must not be opened.
    let dir = index_folder("index_escape", "{}");
    let outside = dir.with_extension("outside.safetensors");
    safetensors::save(&[("w", &t(2))], None, &outside).unwrap();
    let escape = format!("../{}", outside.file_name().unwrap().to_string_lossy());
    for shard in ["../../../etc/passwd", "/etc/passwd", escape.as_str(), "sub/../../x", ""] {
        let map = format!(r#"{{"w":{}}}"#, serde_json::to_string(shard).unwrap());
        std::fs::write(dir.join(SAFETENSORS_INDEX_FILE), format!(r#"{{"weight_map":{map}}}"#)).unwrap();
        let err = read_checkpoint(&dir).expect_err(shard).to_string();
        assert!(
            err.contains("not a file inside the checkpoint's folder") && err.contains(SAFETENSORS_INDEX_FILE),
            "{shard}: {err}"
        );
    }
    std::fs::remove_file(&outside).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
