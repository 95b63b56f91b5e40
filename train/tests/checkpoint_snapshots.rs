//! A snapshot's life: the writer starts on its big files while it is still being built, so a
//! snapshot dropped unsaved, one saved by another Checkpointer, and a second snapshot taken
//! while the first is open must each end in a complete checkpoint or in nothing at all.

use oxtrain::checkpoint::*;
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{Linear, Module};
use oxtrain_tensor::{Device, Tensor};
use std::path::{Path, PathBuf};

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxtrain-ckpt-snapshots-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Large enough (4 MB of weights, as much momentum) for the O_DIRECT path.
fn trained() -> (Linear, Sgd) {
    let model = Linear::new(1024, 1024, Device::Cpu).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    for p in model.parameters() {
        p.set_grad(Some(Tensor::ones(p.dims(), p.dtype(), Device::Cpu).unwrap()));
    }
    opt.step();
    (model, opt)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn weights(dir: &Path, step: u64) -> Vec<f32> {
    let c = Checkpoint::load(dir.join(step_dir_name(step)), 0, 1).unwrap();
    c.model_state().unwrap()["weight"].to_vec::<f32>()
}

#[test]
fn a_snapshot_dropped_unsaved_leaves_nothing_and_the_next_save_is_whole() {
    let dir = fresh_dir("dropped");
    let (model, opt) = trained();
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&dir)).unwrap();
    // The model's file is handed to the writer here; the snapshot is then dropped.
    drop(ckpt.snapshot(1, 0).unwrap().model(&model).unwrap());
    assert!(ckpt.wait().unwrap().is_none(), "nothing was saved");
    assert!(entries(&dir).is_empty(), "the dropped snapshot's files are removed: {:?}", entries(&dir));

    let snap = ckpt.snapshot(2, 0).unwrap().model(&model).unwrap().optimizer(&opt).unwrap();
    ckpt.save(snap).unwrap();
    let saved = ckpt.finish().unwrap().unwrap();
    assert_eq!(saved.step, 2);
    assert_eq!(entries(&dir), [step_dir_name(2)]);
    let found = latest_valid(&dir).unwrap();
    assert_eq!(found.step(), Some(2), "{found}");
    assert_eq!(weights(&dir, 2), model.state_dict()[0].1.to_vec::<f32>());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_snapshot_saved_by_another_checkpointer_is_written_whole_there() {
    let (dir, other_dir) = (fresh_dir("taker"), fresh_dir("saver"));
    let (model, opt) = trained();
    let mut taker = Checkpointer::new(CheckpointConfig::new(&dir)).unwrap();
    let snap = taker.snapshot(3, 0).unwrap().model(&model).unwrap().optimizer(&opt).unwrap();
    let mut saver = Checkpointer::new(CheckpointConfig::new(&other_dir)).unwrap();
    saver.save(snap).unwrap();
    assert_eq!(saver.finish().unwrap().unwrap().step, 3);
    assert!(taker.wait().unwrap().is_none(), "the taker saved nothing");
    assert!(entries(&dir).is_empty(), "the taker's partial write is removed: {:?}", entries(&dir));

    let manifest = verify_checkpoint(&other_dir.join(step_dir_name(3))).unwrap().unwrap();
    let names: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&MODEL_FILE) && names.contains(&OPTIMIZER_FILE), "{names:?}");
    assert_eq!(weights(&other_dir, 3), model.state_dict()[0].1.to_vec::<f32>());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(other_dir);
}

#[test]
fn a_second_snapshot_while_one_is_open_is_an_error_and_finish_does_not_hang() {
    let dir = fresh_dir("open");
    let (model, _) = trained();
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(&dir)).unwrap();
    let open = ckpt.snapshot(1, 0).unwrap().model(&model).unwrap();
    let err = ckpt.snapshot(2, 0).map(|_| ()).unwrap_err();
    assert!(matches!(err, CheckpointError::SnapshotOpen), "{err}");
    assert!(err.to_string().contains("save it"), "{err}");
    // Finishing with the snapshot still open discards it and what was written of it.
    assert!(ckpt.finish().unwrap().is_none());
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
    drop(open);
    let _ = std::fs::remove_dir_all(dir);
}
