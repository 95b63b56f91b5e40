//! The next epoch's first batches load while the current one ends, and change nothing in what
//! the loader hands out.

use super::tests::{config, tmp};
use super::*;
use crate::image_folder::ImageFolder;
use crate::transforms::ImageTransform;
use std::path::Path;

type Seen = Vec<(Vec<f32>, Vec<i64>, Vec<usize>)>;

fn drain<D: Dataset>(it: &mut EpochIter<D>) -> Seen {
    it.by_ref()
        .map(|b| {
            let mut b = b.unwrap();
            (b.images().to_vec::<f32>(), b.labels().to_vec::<i64>(), b.indices.clone())
        })
        .collect()
}

/// 21 shapes in batches of 4 (6 batches, 5 with `drop_last`); 2 workers load 4 batches ahead.
fn loader(d: &Path, workers: usize, prefetch: bool, drop_last: bool) -> DataLoader<ImageFolder> {
    let ds = ImageFolder::new(d, ImageTransform::imagenet_train(24)).unwrap();
    let sampler = DistributedSampler::single(ds.len()).seed(5);
    let lc = LoaderConfig { prefetch_next_epoch: prefetch, drop_last, ..config(4, workers) };
    DataLoader::new(ds, sampler, lc).unwrap()
}

fn folder(name: &str) -> std::path::PathBuf {
    let d = tmp(name);
    crate::synthetic::write_shapes_image_folder(&d, 3, 7, 48, 3).unwrap();
    d
}

#[test]
fn the_next_epochs_batches_are_loaded_before_this_epoch_is_dropped() {
    let d = folder("prefetch_ready");
    let l = loader(&d, 2, true, false);
    let mut e1 = l.epoch(1);
    let first = drain(&mut e1);
    assert_eq!(first.len(), 6);
    // Epoch 1 is used up but its iterator lives: epoch 2's first batches are already out.
    let status = l.wait_prefetched().unwrap().expect("epoch 2 loading ahead");
    assert_eq!(status, PrefetchStatus { epoch: 2, sent: 4, loaded: 4 });
    drop(e1);
    let mut e2 = l.epoch(2);
    assert_eq!(e2.prefetched(), 4);
    let second = drain(&mut e2);
    drop(e2);
    let reference = loader(&d, 0, false, false);
    assert_eq!(first, drain(&mut reference.epoch(1)));
    assert_eq!(second, drain(&mut reference.epoch(2)));
    assert_ne!(first, second);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn many_epochs_give_the_batches_of_a_loader_without_prefetch() {
    let d = folder("prefetch_epochs");
    for drop_last in [false, true] {
        let (with, without) = (loader(&d, 3, true, drop_last), loader(&d, 0, false, drop_last));
        with.prefetch_epoch(0);
        for epoch in 0..4 {
            let mut it = with.epoch(epoch);
            assert_eq!(it.prefetched(), if drop_last { 5 } else { 6 }, "epoch {epoch} started loaded");
            let got = drain(&mut it);
            assert_eq!(got.len(), if drop_last { 5 } else { 6 });
            assert_eq!(got, drain(&mut without.epoch(epoch)), "epoch {epoch}, drop_last {drop_last}");
            assert_eq!(it.state_dict(), without.state_dict());
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_resumed_position_discards_the_prefetch() {
    let d = folder("prefetch_resume");
    let l = loader(&d, 2, true, false);
    assert_eq!(drain(&mut l.epoch(1)).len(), 6);
    assert_eq!(l.prefetch_status().map(|s| (s.epoch, s.sent)), Some((2, 4)));
    // A checkpoint of epoch 2 two batches in: the rest of epoch 2, not its start.
    let reference = loader(&d, 0, false, false);
    let full = drain(&mut reference.epoch(2));
    let mut saved = reference.state_dict();
    saved.position = 8;
    l.load_state_dict(&saved).unwrap();
    let mut it = l.epoch(2);
    assert_eq!(it.prefetched(), 0);
    assert_eq!(drain(&mut it), full[2..].to_vec());
    // Asking for another epoch than the one prefetched is the same.
    assert_eq!(l.prefetch_status().map(|s| s.epoch), Some(3));
    let mut other = l.epoch(7);
    assert_eq!(other.prefetched(), 0);
    assert_eq!(drain(&mut other), drain(&mut reference.epoch(7)));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn no_prefetch_when_switched_off_or_when_an_epoch_is_left_early() {
    let d = folder("prefetch_off");
    let off = loader(&d, 2, false, false);
    assert_eq!(drain(&mut off.epoch(0)).len(), 6);
    assert_eq!(off.prefetch_status(), None);
    assert_eq!(off.epoch(1).prefetched(), 0);
    let on = loader(&d, 2, true, false);
    let mut it = on.epoch(0);
    it.next().unwrap().unwrap();
    drop(it); // one batch of six handed out: nothing of epoch 1 was sent
    assert_eq!(on.prefetch_status(), None);
    let reference = loader(&d, 0, false, false);
    assert_eq!(drain(&mut on.epoch(1)), drain(&mut reference.epoch(1)));
    std::fs::remove_dir_all(&d).unwrap();
}
