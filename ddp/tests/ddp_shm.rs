//! DDP across processes on the `shm` backend: 2 and 3 ranks train a small CNN (SGD momentum)
//! and a small Transformer (AdamW) for 5 steps from different initial weights; every rank
//! ends with the same parameters bit for bit, equal to one process on the combined batch;
//! likewise with ZeRO-1 (`zero-*` roles: sharded optimizer, 2 accumulated micro-batches).

mod common;

use common::ddp_train::{self as t, Model, Opt};
use common::procs::{assert_all_succeeded, child_role, spawn_ranks};
use common::zero_train;
use oxtrain_comm::{shm, CommOptions, Communicator, ShmOptions, TcpStore};
use oxtrain_ddp::DdpConfig;
use oxtrain_tensor::DType;
use std::sync::Arc;
use std::time::Duration;

const CHILD: &str = "ddp_child";

/// A digest of the parameters' bits, printed by each rank and compared by the parent.
fn digest(params: &[(String, Vec<f32>)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (_, v) in params {
        for x in v {
            for b in x.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

/// The ranks' entry point (a no-op in the parent's run).
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn ddp_child() {
    let Some((role, rank, world)) = child_role() else { return };
    let port: u16 = std::env::var("OXTRAIN_TEST_STORE_PORT").unwrap().parse().unwrap();
    let store = TcpStore::connect("127.0.0.1", port, Duration::from_secs(30)).unwrap();
    let opts = ShmOptions {
        comm: CommOptions { timeout: Duration::from_secs(30), check: false },
        ..Default::default()
    };
    let w = shm::connect(rank, world, &store, &opts).unwrap();
    let comm: Arc<dyn Communicator> = Arc::new(w.comm);
    let (model, opt, sharded) = match role.as_str() {
        "cnn" => (Model::Cnn, Opt::SgdMomentum, false),
        "transformer" => (Model::Transformer, Opt::AdamW, false),
        "zero-cnn" => (Model::Cnn, Opt::SgdMomentum, true),
        "zero-transformer" => (Model::Transformer, Opt::AdamW, true),
        other => panic!("unknown role {other}"),
    };
    // ZeRO-1 with accumulation over 2 micro-batches (small buckets: several, cut by shards).
    let accumulate = if sharded { 2 } else { 1 };
    let got = if sharded {
        let config = DdpConfig { shard_optimizer: true, bucket_cap_mb: 0.002, ..DdpConfig::default() };
        let extras = zero_train::Extras { accumulate, clip: None, scale: None, dtype: DType::F32 };
        t::params(zero_train::train_rank(comm, model, opt, 5, 3, config, extras).ddp.module())
    } else {
        t::params(t::train_rank(comm, model, opt, 5, 3, 1, DdpConfig::default()).module())
    };
    let reference = t::params(&t::train_single(model, opt, 5, 3 * world, accumulate));
    let err = t::assert_close(&format!("{role} on rank {rank} of {world}"), &got, &reference, 1e-6);
    eprintln!("PARAMS {rank} {:016x} {err:.2e}", digest(&got));
}

#[test]
fn ranks_in_processes_train_as_one_process() {
    for world in [2, 3] {
        for role in ["cnn", "transformer", "zero-cnn", "zero-transformer"] {
            let store = TcpStore::host("127.0.0.1", 0, Duration::from_secs(30)).unwrap();
            let outs =
                spawn_ranks(CHILD, role, world, &[("OXTRAIN_TEST_STORE_PORT", store.port().to_string())]);
            assert_all_succeeded(&outs);
            let digests: Vec<String> =
                outs.iter()
                    .map(|o| {
                        let line =
                            o.stderr.lines().find(|l| l.starts_with("PARAMS ")).unwrap_or_else(|| {
                                panic!("rank {} printed no digest:\n{}", o.rank, o.stderr)
                            });
                        line.split_whitespace().nth(2).unwrap().to_string()
                    })
                    .collect();
            assert!(
                digests.iter().all(|d| *d == digests[0]),
                "{role}, {world} ranks: parameters differ: {digests:?}"
            );
        }
    }
}
