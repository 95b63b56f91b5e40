//! Bad files under the Replace policy (full, equal batches on every rank) and an image folder
//! whose every file is bad (an error, not empty epochs).

use super::tests::{config, tmp, write_bad_files};
use super::*;
use crate::image_folder::ImageFolder;
use crate::transforms::ImageTransform;

fn is_bad(ds: &ImageFolder, i: usize) -> bool {
    ds.samples[i].0.file_name().unwrap().to_string_lossy().starts_with("bad_")
}

#[test]
fn replaced_bad_files_keep_every_ranks_batches_full_and_equal() {
    let d = tmp("bad_replace");
    crate::synthetic::write_shapes_image_folder(&d, 2, 5, 64, 6).unwrap();
    let bad = write_bad_files(&d.join("circle"));
    let len = 10 + bad;
    let (world, batch) = (2, 3);
    let mut per_rank = vec![];
    for rank in 0..world {
        let mut by_workers = vec![];
        for workers in [0, 2] {
            let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(32)).unwrap();
            let sampler = DistributedSampler::new(len, world, rank).unwrap().seed(3);
            let loader = DataLoader::new(ds, sampler, config(batch, workers)).unwrap();
            assert_eq!(loader.config().bad_files, BadFilePolicy::Replace, "the default");
            let batches: Vec<Batch> = loader.epoch(0).map(|b| b.unwrap()).collect();
            assert_eq!(batches.len(), loader.len(), "no batch lost");
            for b in &batches {
                assert_eq!(b.len(), batch, "rank {rank}, {workers} workers: a short batch {:?}", b.indices);
                assert_eq!(b.images_shape()[0], batch);
                for &i in &b.indices {
                    assert!(!is_bad(loader.dataset(), i), "bad sample {i} was handed out");
                }
            }
            by_workers
                .push((batches.iter().map(|b| b.indices.clone()).collect::<Vec<_>>(), loader.bad_files()));
        }
        assert_eq!(by_workers[0], by_workers[1], "rank {rank}: the replacements depend on the workers");
        per_rank.push(by_workers.remove(0));
    }
    // Between them the ranks met every bad file once (the sampler splits the indices).
    let met: usize = per_rank.iter().map(|(_, n)| n).sum();
    assert!(met >= bad, "{met} bad loads counted for {bad} bad files");
    assert_eq!(per_rank[0].0.len(), per_rank[1].0.len(), "ranks disagree on the number of steps");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_folder_where_every_file_is_bad_is_an_error_not_empty_epochs() {
    let d = tmp("all_bad");
    crate::synthetic::write_shapes_image_folder(&d, 1, 4, 64, 6).unwrap();
    write_bad_files(&d.join("circle"));
    for entry in std::fs::read_dir(d.join("circle")).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_string_lossy().starts_with("bad_") {
            std::fs::remove_file(path).unwrap();
        }
    }
    for policy in [BadFilePolicy::Replace, BadFilePolicy::Skip] {
        for workers in [0, 2] {
            let ds = ImageFolder::new(&d, ImageTransform::imagenet_train(32)).unwrap();
            assert!(ds.samples.iter().enumerate().all(|(i, _)| is_bad(&ds, i)), "every file is bad");
            let n = ds.len();
            let cfg = LoaderConfig { bad_files: policy, ..config(2, workers) };
            let loader = DataLoader::new(ds, DistributedSampler::single(n), cfg).unwrap();
            let results: Vec<Result<Batch>> = loader.epoch(0).collect();
            let err = results.into_iter().find_map(|r| r.err()).expect("an error, not an empty epoch");
            assert!(matches!(err, Error::NoGoodFiles { .. }), "{policy:?}: {err}");
            // Replace meets the bad files while looking for a replacement and names none of
            // them on its way: the error names the first.
            assert!(err.to_string().contains("the first: bad image file "), "{policy:?}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains("every image of the epoch failed") && msg.contains("check the data folder"),
                "{msg}"
            );
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
