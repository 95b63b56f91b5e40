use super::*;
use std::collections::BTreeSet;

#[test]
fn shards_are_disjoint_and_cover_everything() {
    for (len, world) in [(100, 4), (10, 3), (7, 8), (1000, 6)] {
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|r| {
                let mut s = DistributedSampler::new(len, world, r).unwrap().seed(3).drop_last(true);
                s.set_epoch(2);
                s.epoch_indices()
            })
            .collect();
        let per = shards[0].len();
        assert!(shards.iter().all(|s| s.len() == per), "equal counts with drop_last");
        let all: BTreeSet<usize> = shards.iter().flatten().copied().collect();
        assert_eq!(all.len(), per * world, "disjoint");
        assert_eq!(per * world, len - len % world, "only the tail is dropped ({len}, {world})");
        // Padded: every index appears, each rank gets ceil(len / world).
        let padded: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(len, world, r).unwrap().seed(3).epoch_indices())
            .collect();
        assert!(padded.iter().all(|s| s.len() == len.div_ceil(world)));
        let all: BTreeSet<usize> = padded.iter().flatten().copied().collect();
        assert_eq!(all, (0..len).collect::<BTreeSet<_>>());
    }
}

#[test]
fn padding_repeats_the_start_of_the_list() {
    // 10 over 4 ranks: 12 slots, the first two indices repeat at the end.
    let s0 = DistributedSampler::new(10, 4, 0).unwrap().shuffle(false);
    let s1 = DistributedSampler::new(10, 4, 1).unwrap().shuffle(false);
    let s3 = DistributedSampler::new(10, 4, 3).unwrap().shuffle(false);
    assert_eq!(s0.epoch_indices(), vec![0, 4, 8]);
    assert_eq!(s1.epoch_indices(), vec![1, 5, 9]);
    assert_eq!(s3.epoch_indices(), vec![3, 7, 1]);
    // More padding than data: 2 items over 5 ranks.
    let all: Vec<usize> = (0..5)
        .flat_map(|r| DistributedSampler::new(2, 5, r).unwrap().shuffle(false).epoch_indices())
        .collect();
    assert_eq!(all, vec![0, 1, 0, 1, 0]);
}

#[test]
fn epochs_and_seeds_shuffle_differently() {
    let mut s = DistributedSampler::new(50, 1, 0).unwrap().seed(1);
    let e0 = s.epoch_indices();
    s.set_epoch(1);
    let e1 = s.epoch_indices();
    assert_ne!(e0, e1);
    let mut sorted = e1.clone();
    sorted.sort();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    // torch seeds the permutation with seed + epoch.
    let t = DistributedSampler::new(50, 1, 0).unwrap().seed(2);
    assert_eq!(t.epoch_indices(), e1);
}

#[test]
fn resume_mid_epoch_gives_the_same_remaining_order() {
    let mut a = DistributedSampler::new(97, 3, 1).unwrap().seed(11);
    a.set_epoch(5);
    let full = a.epoch_indices();
    a.advance(13);
    let saved = serde_json::to_string(&a.state_dict()).unwrap();
    let mut b = DistributedSampler::new(97, 3, 1).unwrap().seed(11);
    b.load_state_dict(&serde_json::from_str(&saved).unwrap()).unwrap();
    assert_eq!(b.epoch(), 5);
    assert_eq!(b.remaining(), full[13..].to_vec());
    let mut other_rank = DistributedSampler::new(97, 3, 2).unwrap().seed(11);
    assert!(other_rank.load_state_dict(&a.state_dict()).is_err());
    assert!(DistributedSampler::new(5, 2, 2).is_err());
}

#[test]
fn a_position_resumes_on_another_world_size_in_the_same_global_order() {
    // 60 samples: no padding or dropped tail on 2, 3 or 4 ranks.
    let order = DistributedSampler::new(60, 1, 0).unwrap().seed(5).epoch_indices();
    for (from, to, consumed_per_rank) in [(2, 3, 12), (3, 2, 8), (4, 3, 3)] {
        let mut old = DistributedSampler::new(60, from, 1).unwrap().seed(5);
        old.advance(consumed_per_rank);
        let global = consumed_per_rank * from;
        for r in 0..to {
            let mut new = DistributedSampler::new(60, to, r).unwrap().seed(5);
            new.load_resharded(&old.state_dict()).unwrap();
            let want: Vec<usize> = order[global..].iter().skip(r).step_by(to).copied().collect();
            assert_eq!(new.remaining(), want, "{from} -> {to} ranks, rank {r}");
        }
    }
    // 5 samples consumed on each of 2 ranks: 10, which 3 ranks cannot split.
    let mut old = DistributedSampler::new(60, 2, 0).unwrap().seed(5);
    old.advance(5);
    let mut new = DistributedSampler::new(60, 3, 0).unwrap().seed(5);
    assert!(new.load_resharded(&old.state_dict()).is_err());
    assert!(DistributedSampler::new(61, 3, 0).unwrap().seed(5).load_resharded(&old.state_dict()).is_err());
}

#[test]
fn a_used_up_epoch_resumes_used_up_on_another_world_size() {
    // 33 samples: 17 per rank on 2 (one padded), 11 on 3. An epoch finished on 2 ranks
    // (34 positions, which 3 cannot split) is finished on 3 as well: the next starts afresh.
    let mut old = DistributedSampler::new(33, 2, 1).unwrap().seed(5);
    old.set_epoch(4);
    old.finish_epoch();
    let mut new = DistributedSampler::new(33, 3, 2).unwrap().seed(5);
    new.load_resharded(&old.state_dict()).unwrap();
    assert_eq!((new.epoch(), new.position(), new.remaining().len()), (4, 11, 0));
}
