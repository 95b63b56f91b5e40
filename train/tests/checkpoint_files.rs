//! Checkpoint files on disk: corruption and truncation are caught by the manifest and named,
//! retention keeps what it says, multi-rank parts are checked together, world-size changes are
//! refused with advice, and SIGTERM becomes a save request.

use oxtrain::checkpoint::*;
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer};
use oxtrain_nn::{Linear, Module};
use oxtrain_tensor::{Device, Tensor};
use std::path::{Path, PathBuf};

mod small_disk;
use small_disk::SmallDisk;

/// The tests of this file one at a time: each builds models from the global generator, and
/// `restore_brings_back_model_optimizer_and_rng` compares that generator's state before and
/// after, which a model built meanwhile on another test thread would move.
static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    GLOBAL_RNG.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxtrain-ckpt-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A model and an optimizer that has taken a step (so it has state to save).
fn trained() -> (Linear, AdamW) {
    let model = Linear::new(5, 3, Device::Cpu).unwrap();
    let mut opt = AdamW::new(model.parameters(), AdamWConfig::default());
    for p in model.parameters() {
        p.set_grad(Some(Tensor::ones(p.dims(), p.dtype(), Device::Cpu).unwrap()));
    }
    opt.step();
    (model, opt)
}

/// Saves `steps` of one trained model; returns the model.
fn save_steps(dir: &Path, config: CheckpointConfig, steps: &[u64]) -> Linear {
    let (model, opt) = trained();
    let mut ckpt = Checkpointer::new(config).unwrap();
    for &s in steps {
        let snap = ckpt
            .snapshot(s, 0)
            .unwrap()
            .model(&model)
            .unwrap()
            .optimizer(&opt)
            .unwrap()
            .config_toml("lr = 0.1\n");
        ckpt.save(snap).unwrap();
    }
    let last = ckpt.finish().unwrap().unwrap();
    assert_eq!(last.path, dir.join(part_name(*steps.last().unwrap(), 0)));
    model
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_flipped_byte_and_a_truncated_file_are_rejected_by_name() {
    let _serial = serial();
    let dir = fresh_dir("corrupt");
    let _ = save_steps(&dir, CheckpointConfig::new(&dir), &[10]);
    let good = dir.join("step-000010");
    assert_eq!(latest_valid(&dir).unwrap().step(), Some(10));

    // Step 20: one byte of the model's data flipped. Step 30: the optimizer file cut short.
    copy_dir(&good, &dir.join("step-000020"));
    let model = dir.join("step-000020").join(MODEL_FILE);
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    std::fs::write(&model, bytes).unwrap();
    copy_dir(&good, &dir.join("step-000030"));
    let opt = dir.join("step-000030").join(OPTIMIZER_FILE);
    let len = std::fs::metadata(&opt).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&opt).unwrap().set_len(len - 7).unwrap();

    let found = latest_valid(&dir).unwrap();
    assert_eq!(found.step(), Some(10), "{found}");
    let report = found.to_string();
    assert!(
        report.contains("step-000030")
            && report.contains("optimizer.safetensors is")
            && report.contains("truncated"),
        "{report}"
    );
    assert!(
        report.contains("step-000020") && report.contains("model.safetensors fails its checksum"),
        "{report}"
    );

    let err = Checkpoint::load(dir.join("step-000020"), 0, 1).unwrap_err().to_string();
    assert!(err.contains("model.safetensors") && err.contains("checksum"), "{err}");
    let err = export(dir.join("step-000030"), dir.join("out.safetensors")).unwrap_err().to_string();
    assert!(err.contains("optimizer.safetensors") && err.contains("truncated"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_partial_write_is_skipped_and_reported() {
    let _serial = serial();
    let dir = fresh_dir("partial");
    let _ = save_steps(&dir, CheckpointConfig::new(&dir), &[1]);
    // What a process killed mid-write leaves: a temporary directory with some files, and a
    // committed directory whose manifest was deleted (as a hand-made partial copy would be).
    copy_dir(&dir.join("step-000001"), &dir.join(".step-000003.tmp-999-0"));
    copy_dir(&dir.join("step-000001"), &dir.join("step-000002"));
    std::fs::remove_file(dir.join("step-000002").join("manifest.json")).unwrap();
    let found = latest_valid(&dir).unwrap();
    assert_eq!(found.step(), Some(1));
    let report = found.to_string();
    assert!(report.contains(".step-000003.tmp-999-0: partial"), "{report}");
    assert!(report.contains("step-000002: partial: no manifest.json"), "{report}");
    assert!(report.ends_with("resuming from ") || report.contains("resuming from"), "{report}");
    // A new writer of rank 0 clears the unfinished write; committed ones stay.
    drop(Checkpointer::new(CheckpointConfig::new(&dir)).unwrap());
    assert!(!dir.join(".step-000003.tmp-999-0").exists());
    assert!(dir.join("step-000002").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn restore_brings_back_model_optimizer_and_rng() {
    let _serial = serial();
    let dir = fresh_dir("restore");
    let (model, opt) = trained();
    oxtrain_tensor::manual_seed(77);
    let _ = Tensor::rand(10, oxtrain_tensor::DType::F32, Device::Cpu).unwrap();
    let rng = oxtrain_tensor::default_generator_state();
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&dir)).unwrap();
    let gen = oxtrain_tensor::Generator::new(5);
    let snap =
        ckpt.snapshot(4, 2).unwrap().model(&model).unwrap().optimizer(&opt).unwrap().generator("mine", &gen);
    ckpt.save(snap.extra(serde_json::json!({"best": 0.5}))).unwrap();
    ckpt.finish().unwrap();

    let (other, mut other_opt) = (Linear::new(5, 3, Device::Cpu).unwrap(), None::<AdamW>);
    let c = Checkpoint::load(dir.join("step-000004"), 0, 1).unwrap();
    assert_eq!((c.step(), c.epoch()), (4, 2));
    assert_eq!(c.extra()["best"], 0.5);
    assert_eq!(c.generator("mine"), Some(gen.state()));
    c.restore_model(&other).unwrap();
    for ((n, a), (_, b)) in model.state_dict().iter().zip(other.state_dict()) {
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>(), "{n}");
    }
    let opt2 = other_opt.insert(AdamW::new(other.parameters(), AdamWConfig::default()));
    c.restore_optimizer(opt2).unwrap();
    let (a, b) = (opt.state_dict(), opt2.state_dict());
    assert_eq!(a.tensors.keys().collect::<Vec<_>>(), b.tensors.keys().collect::<Vec<_>>());
    for (k, t) in &a.tensors {
        assert_eq!(t.to_f64_vec(), b.tensors[k].to_f64_vec(), "{k}");
    }
    oxtrain_tensor::manual_seed(1);
    c.restore_rng();
    assert_eq!(oxtrain_tensor::default_generator_state(), rng);
    // A model of another shape is refused with the name of what differs.
    let wrong = Linear::new(5, 4, Device::Cpu).unwrap();
    let err = c.restore_model(&wrong).unwrap_err().to_string();
    assert!(err.contains("weight"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn retention_keeps_the_last_k_and_every_nth() {
    let _serial = serial();
    let dir = fresh_dir("retention");
    let config = CheckpointConfig { keep_last: Some(2), keep_every: Some(3), ..CheckpointConfig::new(&dir) };
    let _ = save_steps(&dir, config, &[1, 2, 3, 4, 5, 6, 7]);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["step-000003", "step-000006", "step-000007"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ranks_write_their_own_parts_and_another_world_size_reads_rank_0s() {
    let _serial = serial();
    let dir = fresh_dir("ranks");
    let (model, opt) = trained();
    for rank in [1, 0] {
        let config = CheckpointConfig { rank, world_size: 2, ..CheckpointConfig::new(&dir) };
        let mut ckpt = Checkpointer::new(config).unwrap();
        let sampler = oxtrain_datasets::DistributedSampler::new(10, 2, rank).unwrap().state_dict();
        let snap =
            ckpt.snapshot(8, 1).unwrap().model(&model).unwrap().optimizer(&opt).unwrap().sampler(sampler);
        ckpt.save(snap).unwrap();
        ckpt.finish().unwrap();
    }
    // Rank 1's part holds only its own state.
    let mut rank1: Vec<String> = std::fs::read_dir(dir.join("step-000008.rank-1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    rank1.sort();
    assert_eq!(rank1, ["manifest.json", "rank-1.json"]);
    let c = Checkpoint::load(dir.join("step-000008"), 1, 2).unwrap();
    assert_eq!(c.sampler().unwrap().rank, 1);
    // On 4 ranks: taken as one of another world size; ranks the saving run lacked read rank
    // 0's part (their data position is re-dealt by the sampler).
    let c = Checkpoint::load(dir.join("step-000008"), 3, 4).unwrap();
    assert!(c.resharded());
    assert_eq!(c.sampler().unwrap().rank, 0);
    assert!(!Checkpoint::load(dir.join("step-000008"), 1, 2).unwrap().resharded());

    std::fs::remove_dir_all(dir.join("step-000008.rank-1")).unwrap();
    let found = latest_valid(&dir).unwrap();
    assert_eq!(found.step(), None);
    assert!(found.to_string().contains("rank 1's part: partial"), "{found}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn export_writes_the_plain_state_dict() {
    let _serial = serial();
    let dir = fresh_dir("export");
    let model = save_steps(&dir, CheckpointConfig::new(&dir), &[3, 9]);
    let out = dir.join("exported").join("model.safetensors");
    let done = export(&dir, &out).unwrap();
    assert_eq!(done.step, 9);
    let file = oxtrain_tensor::safetensors::load(&out).unwrap();
    let mut names = file.names().to_vec();
    names.sort();
    assert_eq!(names, ["bias", "weight"]);
    assert_eq!(file.get("weight").unwrap().to_vec::<f32>(), model.state_dict()[0].1.to_vec::<f32>());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigterm_asks_for_a_save_and_a_stop() {
    let _serial = serial();
    let mut policy =
        SavePolicy::new(SaveTriggers { every_steps: Some(5), every: None, at_end: true, on_signal: true })
            .unwrap();
    assert_eq!(policy.due(4), None);
    assert_eq!(policy.due(5), Some(SaveReason::Steps));
    // SAFETY: the policy's handler is installed, so SIGTERM only raises its flag.
    unsafe { libc::raise(libc::SIGTERM) };
    assert!(policy.stop_requested());
    assert_eq!(policy.due(6), Some(SaveReason::Signal));
    let mut timed = SavePolicy::new(SaveTriggers {
        every_steps: None,
        every: Some(std::time::Duration::ZERO),
        at_end: false,
        on_signal: false,
    })
    .unwrap();
    assert_eq!(timed.due(1), Some(SaveReason::Time));
}

#[test]
fn a_second_save_reuses_host_buffers_but_writes_the_new_values() {
    let _serial = serial();
    let dir = fresh_dir("staging");
    let (model, opt) = trained();
    let before = model.state_dict()[0].1.to_vec::<f32>();
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&dir)).unwrap();
    let snap = ckpt.snapshot(1, 0).unwrap().model(&model).unwrap().optimizer(&opt).unwrap();
    ckpt.save(snap).unwrap();
    // The next snapshot copies into the first one's host tensors, after its write finished.
    let snap = ckpt.snapshot(2, 0).unwrap();
    model.state_dict()[0].1.fill_(2.0);
    ckpt.save(snap.model(&model).unwrap()).unwrap();
    model.state_dict()[0].1.fill_(3.0);
    ckpt.finish().unwrap();
    let weight = |step| {
        let c = Checkpoint::load(dir.join(step_dir_name(step)), 0, 1).unwrap();
        c.model_state().unwrap()[&model.state_dict()[0].0].to_vec::<f32>()
    };
    assert_eq!(weight(1), before);
    assert!(weight(2).iter().all(|&w| w == 2.0));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_full_disk_is_a_clear_error_and_keeps_the_previous_checkpoint() {
    let _serial = serial();
    let test = "a_full_disk_is_a_clear_error_and_keeps_the_previous_checkpoint";
    let Some(disk) = SmallDisk::mount_or_skip(test, &fresh_dir("full"), 256 << 10) else { return };
    let small = Linear::new(4, 2, Device::Cpu).unwrap();
    let big = Linear::new(256, 512, Device::Cpu).unwrap(); // 513 KB of weights
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&disk.0)).unwrap();
    let snap = ckpt.snapshot(1, 0).unwrap().model(&small).unwrap();
    ckpt.save(snap).unwrap();
    let snap = ckpt.snapshot(2, 0).unwrap().model(&big).unwrap();
    ckpt.save(snap).unwrap();
    let err = ckpt.finish().unwrap_err();
    let msg = err.to_string();
    println!("{msg}");
    assert!(matches!(err, CheckpointError::DiskFull { needed, .. } if needed > 256 << 10), "{msg}");
    assert!(msg.contains("not enough disk space") && msg.contains("bytes are free"), "{msg}");
    assert!(msg.contains("step-000001 is intact"), "{msg}");
    let found = latest_valid(&disk.0).unwrap();
    assert_eq!(found.step(), Some(1), "{found}");
    assert!(found.skipped.is_empty(), "nothing of the failed write is left: {found}");
}

#[test]
fn a_disk_that_fills_during_the_write_is_the_same_clear_error() {
    let _serial = serial();
    let test = "a_disk_that_fills_during_the_write_is_the_same_clear_error";
    let Some(disk) = SmallDisk::mount_or_skip(test, &fresh_dir("fills"), 1 << 20) else { return };
    let small = Linear::new(4, 2, Device::Cpu).unwrap();
    let big = Linear::new(256, 512, Device::Cpu).unwrap(); // fits on its own
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&disk.0)).unwrap();
    let snap = ckpt.snapshot(1, 0).unwrap().model(&small).unwrap();
    ckpt.save(snap).unwrap();
    ckpt.finish().unwrap();
    // Another program takes the rest of the disk as soon as the write has begun; the manifest,
    // written last, then finds no room.
    let filler = disk.0.join("filler");
    let filled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook: ProgressFn = std::sync::Arc::new(move |_| {
        if !filled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            use std::io::Write;
            let mut f = std::fs::File::create(&filler).unwrap();
            while f.write_all(&[0u8; 4096]).is_ok() {}
        }
    });
    let config = CheckpointConfig { on_progress: Some(hook), ..CheckpointConfig::new(&disk.0) };
    let mut ckpt = Checkpointer::new(config).unwrap();
    let snap = ckpt.snapshot(2, 0).unwrap().model(&big).unwrap();
    ckpt.save(snap).unwrap();
    let err = ckpt.finish().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CheckpointError::DiskFull { .. }), "{msg}");
    assert!(msg.contains("step-000001 is intact"), "{msg}");
    let found = latest_valid(&disk.0).unwrap();
    assert_eq!(found.step(), Some(1), "{found}");
    assert!(found.skipped.is_empty(), "the failed write's temporary directory is removed: {found}");
}
