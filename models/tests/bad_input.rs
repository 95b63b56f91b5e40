//! Files that are not what they claim to be: each is an error naming the file, never a panic.

use oxtrain_models::{ModelError, Tokenizer};
use std::path::PathBuf;

fn tmp(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-models-bad-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_tokenizer_file_that_is_not_json_is_an_error_naming_it() {
    let d = tmp("tokenizer");
    let cases: [(&str, &[u8]); 4] = [
        ("text.json", b"this is not JSON"),
        ("empty.json", b""),
        ("binary.json", &[0xff, 0xfe, 0x00, 0x01]),
        ("other.json", br#"{"model": {"type": "NoSuchModel"}}"#),
    ];
    for (name, bytes) in cases {
        let path = d.join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = Tokenizer::from_file(&path).expect_err(name);
        assert!(matches!(err, ModelError::Tokenizer { .. }), "{name}: {err}");
        assert!(err.to_string().contains(name), "{name}: the error should name the file: {err}");
    }
    // A folder without tokenizer.json names the file it looked for.
    let err = Tokenizer::from_file(&d).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}
