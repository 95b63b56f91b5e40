//! Token shards end to end: `oxtrain tokenize` writes the ids Hugging Face's tokenizer gives
//! (fixture from `token_shards/make_fixture.py`), in llm.c's format byte for byte; the
//! language-model data reads them back as the same blocks; a truncated or foreign shard stops
//! a run with a message naming it; and a run on shards resumes bit-exactly.

#[path = "resume_support/mod.rs"]
mod support;
use support::*;

use oxtrain_datasets::token_shards::{write_shard, TokenShard, TokenShards, TokenWidth};
use oxtrain_datasets::{DataLoader, DistributedSampler, LmDataset, LoaderConfig, PinMemory};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/token_shards").join(name)
}

/// The stream Hugging Face's ids make: every document, then `<|endoftext|>`.
fn expected_stream() -> Vec<u32> {
    let text = std::fs::read_to_string(fixture("expected_ids.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let eos = v["eos"].as_u64().unwrap() as u32;
    let mut stream = Vec::new();
    for doc in v["documents"].as_array().unwrap() {
        stream.extend(doc.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32));
        stream.push(eos);
    }
    stream
}

fn oxtrain(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_oxtrain")).args(args).current_dir(dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `oxtrain tokenize` into shards of `shard_tokens`; returns the shard folder.
fn tokenize(dir: &Path, inputs: &[PathBuf], shard_tokens: usize) -> PathBuf {
    let out = dir.join("shards");
    let (tok, out_s, n) = (fixture("tokenizer.json"), out.display().to_string(), shard_tokens.to_string());
    let mut args =
        vec!["tokenize", "--tokenizer", tok.to_str().unwrap(), "--out", &out_s, "--shard-tokens", &n];
    args.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    let (ok, text) = oxtrain(dir, &args);
    assert!(ok, "oxtrain tokenize failed:\n{text}");
    assert!(text.contains("data.kind=token_shards"), "the report says how to train on them: {text}");
    out
}

#[test]
fn text_to_shards_to_batches_gives_the_tokenizers_ids() {
    let dir = tempfile::tempdir().unwrap();
    let want = expected_stream();
    let shards = tokenize(dir.path(), &[fixture("a.txt"), fixture("b.jsonl")], 50);
    let read = TokenShards::from_spec(shards.to_str().unwrap()).unwrap();
    assert_eq!(read.shards().len(), want.len().div_ceil(50), "shards of 50 tokens");
    assert!(read.shards().iter().all(|s| s.width() == TokenWidth::U16));
    let mut stream = vec![0i64; read.len()];
    read.read_into(0, &mut stream);
    assert_eq!(stream, want.iter().map(|&t| t as i64).collect::<Vec<_>>());

    // Through the loader, in order: every block is the next 17 tokens, across shard ends.
    let block = 16;
    let data = LmDataset::from_shards(read, block).unwrap();
    let blocks = data.len();
    let sampler = DistributedSampler::single(blocks).shuffle(false);
    let config = LoaderConfig { batch_size: 3, pin_memory: PinMemory::Off, ..Default::default() };
    let loader = DataLoader::new(data, sampler, config).unwrap();
    let mut seen = Vec::new();
    for b in loader.epoch(0) {
        seen.extend(b.unwrap().images().to_vec::<i64>());
    }
    let mut expected = Vec::new();
    for i in 0..blocks {
        expected.extend(want[i * block..i * block + block + 1].iter().map(|&t| t as i64));
    }
    assert_eq!(seen, expected);
}

/// Shards match llm.c's `write_datafile` (numpy) byte for byte, in both formats, and read back.
#[test]
fn shards_are_llm_c_files_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let want = expected_stream();
    for (width, name) in [(TokenWidth::U16, "llmc_gpt2.bin"), (TokenWidth::U32, "llmc_llama3.bin")] {
        let ours = dir.path().join(name);
        write_shard(&ours, &want, width).unwrap();
        assert!(std::fs::read(&ours).unwrap() == std::fs::read(fixture(name)).unwrap(), "{name} differs");
        let theirs = TokenShard::open(fixture(name)).unwrap();
        assert_eq!((theirs.width(), theirs.len()), (width, want.len()));
    }
}

/// `train_args` of the resume tests on shards of `corpus.txt` (tokenized with the fixture's
/// tokenizer into shards of 40 tokens, so blocks of 16 cross shard ends).
fn shard_args(dir: &Path, name: &str, extra: &[&str]) -> Vec<String> {
    let mut args = train_args(dir, name, extra);
    let shards = dir.join("shards");
    if !shards.exists() {
        tokenize(dir, &[dir.join("corpus.txt")], 40);
    }
    args.retain(|a| !a.starts_with("data.kind=") && !a.starts_with("data.train="));
    args.extend([
        "data.kind=token_shards".to_string(),
        format!("data.train={}", shards.join("tokens_train_*.bin").display()),
        format!("data.tokenizer={}", fixture("tokenizer.json").display()),
    ]);
    args
}

#[test]
fn a_run_on_shards_resumes_bit_exactly_across_shard_ends() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &shard_args(d, "reference", &[]), &[]);
    let shards = TokenShards::from_spec(d.join("shards").to_str().unwrap()).unwrap();
    assert!(shards.shards().len() >= 3, "the corpus spans several shards: {shards:?}");

    // Stopped by SIGTERM after step 5: it saves step 6 and exits; the resume reads on from
    // there, through blocks that start in one shard and end in the next.
    let args = shard_args(d, "stopped", &[]);
    let mut w = start(d, &args, &[("OXTRAIN_TEST_HALT_AFTER_STEP", "5".into())]);
    let halted = w.wait_for("halted after step 5", 1);
    // SAFETY: kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(pid_in(&halted[0]), libc::SIGTERM) }, 0);
    let (status, out) = w.finish();
    assert!(status.success(), "{out}");
    let out = run_ok(d, &[args, vec!["--resume".into()]].concat(), &[]);
    assert!(out.contains("step-000006 (step 6"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("stopped"));
}

#[test]
fn a_truncated_or_foreign_shard_stops_the_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shards = {
        train_args(d, "x", &[]);
        tokenize(d, &[d.join("corpus.txt")], 40)
    };
    let victim = shards.join("tokens_train_000001.bin");
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() - 3]).unwrap();
    let (ok, out) = oxtrain(d, &shard_args(d, "cut", &[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok, "{out}");
    assert!(out.contains("tokens_train_000001.bin") && out.contains("the file holds"), "{out}");
    assert!(out.contains("oxtrain tokenize"), "it says what to do: {out}");

    let mut foreign = bytes;
    foreign[..4].copy_from_slice(&20240522i32.to_le_bytes());
    std::fs::write(&victim, &foreign).unwrap();
    let (ok, out) = oxtrain(d, &shard_args(d, "magic", &[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok && out.contains("tokens_train_000001.bin") && out.contains("magic number 20240522"), "{out}");
}

/// A shard with an id past the model's vocabulary is refused before training, not at the
/// embedding lookup.
#[test]
fn ids_outside_the_vocabulary_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = shard_args(d, "vocab", &[]);
    // The fixture's tokenizer has 300 ids; a shard from another tokenizer holds 400.
    let other = d.join("other");
    std::fs::create_dir_all(&other).unwrap();
    write_shard(
        &other.join("x.bin"),
        &(0..200).map(|i| if i == 99 { 400 } else { i }).collect::<Vec<u32>>(),
        TokenWidth::U16,
    )
    .unwrap();
    args.push(format!("data.train={}", other.display()));
    let (ok, out) = oxtrain(d, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!ok, "{out}");
    assert!(
        out.contains("data.train holds the token id 400, outside the model's vocabulary of 300"),
        "{out}"
    );
}
