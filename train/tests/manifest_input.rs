//! A checkpoint part's manifest.json as read back: a hostile or corrupt manifest is a
//! `Problem` that says what is wrong, and its file list cannot reach outside the part's folder.

use oxtrain::checkpoint::manifest::{parse, verify};
use oxtrain::checkpoint::Problem;

fn manifest(rank: usize, world: usize, file: &str) -> String {
    serde_json::json!({
        "format": "oxtrain-checkpoint", "version": 1, "step": 2, "epoch": 0,
        "rank": rank, "world_size": world,
        "files": [{"name": file, "bytes": 4, "xxh3": "0000000000000000"}],
    })
    .to_string()
}

#[test]
fn a_manifest_naming_files_outside_its_folder_is_refused() {
    for name in ["../../etc/passwd", "/etc/passwd", "a/../../b", "", "."] {
        match parse(&manifest(0, 1, name)) {
            Err(Problem::BadManifest(why)) => assert!(why.contains("not a file inside"), "{name}: {why}"),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    assert!(parse(&manifest(0, 1, "model.safetensors")).is_ok());
    assert!(parse(&manifest(0, 1, "sub/model.safetensors")).is_ok());
}

#[test]
fn impossible_or_foreign_manifests_are_problems_not_panics() {
    let Err(Problem::BadManifest(why)) = parse(&manifest(2, 2, "x")) else { panic!("rank 2 of 2") };
    assert!(why.contains("rank 2 of a world of 2"), "{why}");
    assert!(matches!(parse("{\"format\": 1"), Err(Problem::BadManifest(_))));
    let foreign = manifest(0, 1, "x").replace("oxtrain-checkpoint", "other");
    assert!(matches!(parse(&foreign), Err(Problem::WrongVersion { .. })));
    // Through verify, on disk: the escape is reported before any file is opened.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("manifest.json"), manifest(0, 1, "../outside")).unwrap();
    let problem = verify(dir.path()).unwrap().unwrap_err();
    assert!(problem.to_string().contains("not a file inside"), "{problem}");
}
