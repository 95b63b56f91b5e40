//! Fine-tuning as a Hugging Face / torchvision user does it: a 1000-class ResNet-18 file with
//! torchvision's names and no `num_batches_tracked` starts a 4-class run (a new head, the stem
//! frozen); LoRA on a tiny GPT-2 trains and saves only its adapters, and `export --merge-lora`
//! writes base + scale * B @ A.

mod common;
use common::{assert_loss_falls, metrics, of_kind, oxtrain};
use oxtrain_models::{ResNet, ResNetConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// torchvision's state-dict names and shapes, written by models/fixtures/make_fixtures.py from
/// `torchvision.models.resnet18()`.
const TORCHVISION_NAMES: &str = include_str!("../../models/fixtures/resnet_names.json");

/// A 1000-class ResNet-18 file as torchvision names it, without the batch counters (as files
/// converted by tools that drop them come): torchvision's names and shapes, our own initial
/// values (a pretrained file is 45 MB; the names are what must fit).
fn torchvision_resnet18_without_batch_counters(path: &Path) {
    let names: serde_json::Value = serde_json::from_str(TORCHVISION_NAMES).unwrap();
    let model = ResNet::new(&ResNetConfig::resnet18(), Device::Cpu).unwrap();
    let ours: HashMap<String, Tensor> = model.state_dict().into_iter().collect();
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for entry in names["resnet18"].as_array().unwrap() {
        let name = entry[0].as_str().unwrap();
        let shape: Vec<usize> =
            entry[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        if name.ends_with("num_batches_tracked") {
            continue;
        }
        assert_eq!(ours[name].dims(), shape, "{name}");
        out.push((name.to_string(), ours[name].clone()));
    }
    assert_eq!(out.iter().find(|(n, _)| n == "fc.weight").unwrap().1.dims(), [1000, 512]);
    let refs: Vec<(&str, &Tensor)> = out.iter().map(|(n, t)| (n.as_str(), t)).collect();
    oxtrain_tensor::safetensors::save(&refs, None, path).unwrap();
}

fn tensors(path: &Path) -> HashMap<String, Tensor> {
    oxtrain_tensor::safetensors::load_all(path).unwrap().into_iter().collect()
}

#[test]
fn a_1000_class_torchvision_file_starts_a_4_class_run_with_a_new_head() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("resnet18.safetensors");
    torchvision_resnet18_without_batch_counters(&init);
    let r = oxtrain(
        dir.path(),
        &[
            "train",
            "model.init_from=resnet18.safetensors",
            "model.num_classes=4",
            "optim.freeze=[\"conv1.*\", \"bn1.*\", \"layer1.*\"]",
            "data.per_class=64",
            "data.batch_size=32",
            "optim.lr=3e-4",
            "train.steps=24",
            "log.every_steps=1",
            "train.device=cpu",
            "log.progress=lines",
        ],
    );
    r.ok();
    let head: Vec<&str> = r.stdout.lines().filter(|l| l.contains("new head")).collect();
    assert_eq!(head.len(), 1, "one line names the new head:\n{}", r.stdout);
    assert!(
        head[0].contains("`fc`") && head[0].contains("[1000, 512]") && head[0].contains("[4, 512]"),
        "{}",
        head[0]
    );
    assert_loss_falls(&metrics(&dir.path().join("runs/oxtrain/metrics.jsonl")));
    // The frozen stem and first stage kept the file's values; the rest (the head) trained.
    let start = tensors(&init);
    let end = tensors(&dir.path().join("runs/oxtrain/checkpoints/final/model.safetensors"));
    for name in ["conv1.weight", "layer1.0.conv1.weight", "bn1.bias"] {
        assert_eq!(start[name].to_f64_vec(), end[name].to_f64_vec(), "{name} is frozen but changed");
    }
    assert_ne!(start["layer4.1.conv2.weight"].to_f64_vec(), end["layer4.1.conv2.weight"].to_f64_vec());
    assert_eq!(end["fc.weight"].dims(), [4, 512]);
}

#[test]
fn a_freeze_pattern_that_matches_nothing_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let r =
        oxtrain(dir.path(), &["train", "optim.freeze=[\"layer9.*\"]", "train.steps=1", "train.device=cpu"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("\"layer9.*\"") && r.stderr.contains("matches no parameter"), "{}", r.stderr);
}

fn fixture(path: &str) -> PathBuf {
    common::repo().join("models/fixtures").join(path)
}

/// Trains GPT-2 with LoRA on the tiny fixture base; returns the run's folder.
fn lora_run(dir: &Path, extra: &[&str]) -> PathBuf {
    let line = "the quick brown fox jumps over the lazy dog. ";
    std::fs::write(dir.join("corpus.txt"), line.repeat(100)).unwrap();
    let init = format!("model.init_from={}", fixture("gpt2_lora/base").display());
    let mut args = vec![
        "train",
        "model.name=gpt2",
        "data.kind=text_lm",
        "data.train=corpus.txt",
        "data.block_size=32",
        "data.batch_size=4",
        &init,
        "lora.rank=4",
        "lora.alpha=8",
        "optim.lr=3e-2",
        "optim.weight_decay=0",
        "train.steps=15",
        "log.every_steps=1",
        "train.device=cpu",
        "log.progress=lines",
    ];
    args.extend_from_slice(extra);
    oxtrain(dir, &args).ok();
    dir.join("runs/oxtrain")
}

#[test]
fn a_lora_run_trains_and_saves_only_the_adapters_and_merges_on_export() {
    let dir = tempfile::tempdir().unwrap();
    let run = lora_run(dir.path(), &[]);
    assert_loss_falls(&metrics(&run.join("metrics.jsonl")));
    let final_dir = run.join("checkpoints/final");
    let adapters = tensors(&final_dir.join("model.safetensors"));
    let names: BTreeSet<&str> = adapters.keys().map(String::as_str).collect();
    let expected: BTreeSet<String> = (0..2)
        .flat_map(|i| {
            ["A", "B"].map(|m| format!("base_model.model.transformer.h.{i}.attn.c_attn.lora_{m}.weight"))
        })
        .collect();
    assert_eq!(
        names,
        expected.iter().map(String::as_str).collect(),
        "the checkpoint holds PEFT's adapter names only"
    );

    // The optimizer's state: AdamW's two moments for each of the four adapter tensors, nothing else.
    let ckpt = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("optimizer.safetensors").is_file())
        .expect("a checkpoint with the optimizer");
    let opt = tensors(&ckpt.join("optimizer.safetensors"));
    let adapter_shapes: BTreeSet<Vec<usize>> = adapters.values().map(|t| t.dims().to_vec()).collect();
    let params: BTreeSet<&str> = opt.keys().map(|k| k.split('.').nth(1).unwrap()).collect();
    assert_eq!(params.len(), 4, "optimizer state of {params:?}: {:?}", opt.keys().collect::<Vec<_>>());
    for (name, t) in &opt {
        if t.elem_count() > 1 {
            assert!(adapter_shapes.contains(t.dims()), "{name} {:?} is not an adapter's state", t.dims());
        }
    }

    // export --merge-lora: the full model, PyTorch's names, W + (alpha / rank) B @ A in f64.
    let r = oxtrain(
        dir.path(),
        &[
            "export",
            "--merge-lora",
            "--checkpoint",
            "runs/oxtrain/checkpoints/final",
            "--out",
            "merged.safetensors",
        ],
    );
    r.ok();
    let merged = tensors(&dir.path().join("merged.safetensors"));
    let base = tensors(&fixture("gpt2_lora/base/model.safetensors"));
    assert!(merged.contains_key("lm_head.weight") && merged.contains_key("transformer.wte.weight"));
    for i in 0..2 {
        let w = base[&format!("transformer.h.{i}.attn.c_attn.weight")].to_f64_vec(); // [in 32, out 96]
        let a =
            adapters[&format!("base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight")].to_f64_vec(); // [4, 32]
        let b =
            adapters[&format!("base_model.model.transformer.h.{i}.attn.c_attn.lora_B.weight")].to_f64_vec(); // [96, 4]
        let got = merged[&format!("transformer.h.{i}.attn.c_attn.weight")].to_f64_vec();
        let mut worst = 0.0f64;
        for inp in 0..32 {
            for out in 0..96 {
                let d: f64 = (0..4).map(|k| b[out * 4 + k] * a[k * 32 + inp]).sum();
                worst = worst.max((got[inp * 96 + out] - (w[inp * 96 + out] + 2.0 * d)).abs());
            }
        }
        assert!(worst < 1e-6, "layer {i}: merged differs from W + 2 B A by {worst}");
        assert!(b.iter().any(|v| *v != 0.0), "the run trained B");
    }
    let untouched = "transformer.h.1.mlp.c_fc.weight";
    assert_eq!(merged[untouched].to_f64_vec(), base["transformer.h.1.mlp.c_fc.weight"].to_f64_vec());
}

/// Under DDP only the adapters are registered in the buckets (a frozen weight gets no gradient
/// and would leave its bucket waiting): two shm ranks train LoRA and end with equal adapters.
/// A LoRA run of the tiny GPT-2 on 2 shm ranks (`extra`: more keys); rank 0's and rank 1's
/// final adapters.
fn lora_on_two_ranks(dir: &Path, port: u16, extra: &[&str]) -> [HashMap<String, Tensor>; 2] {
    let line = "the quick brown fox jumps over the lazy dog. ";
    std::fs::write(dir.join("corpus.txt"), line.repeat(100)).unwrap();
    let init = format!("model.init_from={}", fixture("gpt2_lora/base").display());
    let port = port.to_string();
    let mut args = vec!["launch", "--nproc-per-node", "2", "--backend", "shm", "--master-port", &port, "--"];
    args.extend([
        "train",
        "model.name=gpt2",
        "data.kind=text_lm",
        "data.train=corpus.txt",
        "data.block_size=32",
        "data.batch_size=4",
        &init,
        "lora.rank=4",
        "lora.dropout=0.1",
        "optim.lr=1e-2",
        "train.steps=4",
        "train.device=cpu",
        "log.progress=lines",
        "checkpoint.all_ranks=true",
    ]);
    args.extend(extra);
    let r = oxtrain(dir, &args);
    r.ok();
    assert!(r.stderr.contains("DDP rank 0 of 2 (shm"), "{}", r.stderr);
    let final_dir = dir.join("runs/oxtrain/checkpoints");
    [
        tensors(&final_dir.join("final/model.safetensors")),
        tensors(&final_dir.join("final-rank1/model.safetensors")),
    ]
}

#[test]
fn lora_under_ddp_reduces_only_the_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = lora_on_two_ranks(dir.path(), 29737, &[]);
    assert_eq!(a.len(), 4, "{:?}", a.keys().collect::<Vec<_>>());
    for (name, t) in &a {
        assert_eq!(t.to_f64_vec(), b[name].to_f64_vec(), "{name} differs between the ranks");
    }
    // Under ZeRO-1 the adapters' optimizer state is sharded; without clipping the adapters
    // end equal to plain DDP's, bit for bit, on both ranks.
    let zero_dir = tempfile::tempdir().unwrap();
    let [za, zb] = lora_on_two_ranks(zero_dir.path(), 29738, &["ddp.shard_optimizer=true"]);
    for (name, t) in &a {
        assert_eq!(t.to_f64_vec(), za[name].to_f64_vec(), "{name}: ZeRO-1 differs from DDP");
        assert_eq!(t.to_f64_vec(), zb[name].to_f64_vec(), "{name}: ZeRO-1 rank 1 differs");
    }
}

/// PEFT itself loads what `export --peft-adapter` writes, and its forward equals the model
/// `export --merge-lora` writes (train/tests/checkpoint/peft_check.py).
#[test]
#[ignore = "needs a python with torch, transformers, peft and safetensors (OXTRAIN_TEST_PYTHON)"]
fn peft_loads_the_exported_adapter_and_agrees_with_the_merged_model() {
    let python = std::env::var("OXTRAIN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = tempfile::tempdir().unwrap();
    lora_run(dir.path(), &[]);
    let final_dir = "runs/oxtrain/checkpoints/final";
    oxtrain(dir.path(), &["export", "--peft-adapter", "--checkpoint", final_dir, "--out", "adapter"]).ok();
    oxtrain(
        dir.path(),
        &["export", "--merge-lora", "--checkpoint", final_dir, "--out", "merged.safetensors"],
    )
    .ok();
    let out = std::process::Command::new(&python)
        .arg(common::repo().join("train/tests/checkpoint/peft_check.py"))
        .arg(fixture("gpt2_lora/base"))
        .arg(dir.path().join("adapter"))
        .arg(dir.path().join("merged.safetensors"))
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// BERT with LoRA on a 3-class checkpoint for 2 classes: a new classifier (one line), the
/// adapters and the classifier saved under the names PEFT's SEQ_CLS saves (its fixture file),
/// and a resumed run continues from them.
#[test]
fn bert_lora_with_a_new_head_saves_peft_names_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    // Upper case and digits: byte ids below the tiny fixture's vocabulary of 100.
    let lines: String = (0..64)
        .map(|i| {
            format!(
                "{{\"text\": \"{} {i}\", \"label\": {}}}\n",
                if i % 2 == 0 { "GOOD FUN" } else { "BAD DAY" },
                i % 2
            )
        })
        .collect();
    std::fs::write(dir.path().join("t.jsonl"), lines).unwrap();
    let init = format!("model.init_from={}", fixture("bert_tiny").display());
    let args = |steps: &'static str| {
        vec![
            "train",
            "model.name=bert",
            "data.kind=jsonl_classification",
            "data.train=t.jsonl",
            "data.batch_size=8",
            "data.max_length=16",
            &init,
            "lora.rank=4",
            "lora.alpha=16",
            steps,
            "checkpoint.every_steps=3",
            "train.device=cpu",
            "log.progress=lines",
        ]
    };
    let r = oxtrain(dir.path(), &args("train.steps=3"));
    r.ok();
    let head: Vec<&str> = r.stdout.lines().filter(|l| l.contains("new head `classifier`")).collect();
    assert!(head.len() == 1 && head[0].contains("[3, 32]") && head[0].contains("[2, 32]"), "{}", r.stdout);
    let ours = tensors(&dir.path().join("runs/oxtrain/checkpoints/final/model.safetensors"));
    let peft = tensors(&fixture("bert_lora/adapter/adapter_model.safetensors"));
    let (a, b): (BTreeSet<&String>, BTreeSet<&String>) = (ours.keys().collect(), peft.keys().collect());
    assert_eq!(a, b, "the checkpoint's names are PEFT's");
    let mut resumed = args("train.steps=6");
    resumed.push("--resume");
    let r = oxtrain(dir.path(), &resumed);
    r.ok();
    let m = metrics(&dir.path().join("runs/oxtrain/metrics.jsonl"));
    assert_eq!(of_kind(&m, "train").last().unwrap()["step"], 6, "{}", r.stdout);
}
