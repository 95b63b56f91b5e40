//! The `mpi` backend (feature `mpi`): every op against its reference on 2, 3 and 4 ranks, and
//! the timeout when a rank never calls a collective.
//! Run plainly, each test starts itself under `mpirun`; under mpirun it is one rank.
#![cfg(feature = "mpi")]

mod common;

use oxtrain_comm::{CommError, CommOptions, Communicator, ReduceOp};
use oxtrain_tensor::{Device, Tensor};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn under_mpirun() -> bool {
    std::env::var("OMPI_COMM_WORLD_RANK").is_ok()
}

/// Runs the test `test` of this binary as `n` ranks under mpirun with `env`; sends mpirun
/// SIGTERM past `limit` (a hang fails the test instead of blocking it). Returns whether the
/// job succeeded and its stdout and stderr.
fn mpirun(n: usize, test: &str, env: &[(&str, String)], limit: Duration) -> (bool, String, String) {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &n.to_string()])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("mpirun not found: install Open MPI (libopenmpi-dev openmpi-bin)");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let mut killed = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline && !killed {
            // SAFETY: signals our own child; mpirun passes SIGTERM on to its ranks.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(!killed, "mpirun -np {n} {test} ran past {limit:?} and was stopped:\n{out}\n{err}");
    (status.success(), out, err)
}

#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn mpi_rank() {
    if !under_mpirun() || std::env::var("OXTRAIN_TEST_MPI").is_err() {
        return;
    }
    let comm = oxtrain_comm::mpi::connect(&CommOptions::default()).unwrap();
    assert_eq!(comm.backend(), "mpi");
    common::check_all_ops(&comm, 21 + comm.world_size());
    common::check_bf16_accumulates_in_f32(&comm);
}

#[test]
fn every_op_on_2_3_4_mpi_ranks() {
    if under_mpirun() {
        return;
    }
    for n in [2, 3, 4] {
        let (ok, out, err) =
            mpirun(n, "mpi_rank", &[("OXTRAIN_TEST_MPI", "1".into())], Duration::from_secs(120));
        assert!(ok, "mpirun -np {n} failed:\n{out}\n{err}");
    }
}

const TIMEOUT: Duration = Duration::from_secs(2);

/// One rank: rank `OXTRAIN_TEST_MPI_SKIP` never calls the all_reduce; the others must get
/// the timeout error naming it, and fail at once on the next call.
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn mpi_timeout_rank() {
    let Ok(skip) = std::env::var("OXTRAIN_TEST_MPI_SKIP") else { return };
    if !under_mpirun() {
        return;
    }
    let skip: usize = skip.parse().unwrap();
    let comm = oxtrain_comm::mpi::connect(&CommOptions { timeout: TIMEOUT, check: false }).unwrap();
    let (me, world) = (comm.rank(), comm.world_size());
    // Every rank is up before the clock starts.
    comm.barrier().unwrap().wait().unwrap();
    if me == skip {
        println!("rank {me} skips the all_reduce");
        // Alive but absent; the others end the job long before this sleep does.
        std::thread::sleep(Duration::from_secs(15));
        return;
    }
    let t = Tensor::from_vec(vec![1f32; 8], 8, Device::Cpu).unwrap();
    let start = Instant::now();
    let err = comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap_err();
    let took = start.elapsed();
    let msg = err.to_string();
    assert!(matches!(err, CommError::Timeout { .. }), "{msg}");
    let head = format!("all_reduce: rank {me} timed out after 2s waiting for rank(s) [{skip}]; ");
    assert!(msg.starts_with(&head), "expected {head:?} at the start of: {msg}");
    let others: Vec<usize> = (0..world).filter(|&r| r != me && r != skip).collect();
    if !others.is_empty() {
        let same = format!("rank(s) {others:?} reported being stuck in this same call");
        assert!(msg.contains(&same), "expected {same:?} in: {msg}");
    }
    for part in [
        &format!("rank(s) [{skip}] sent no report"),
        "call #2 (all_reduce)",
        "OXTRAIN_COMM_TIMEOUT",
        "unusable",
    ] {
        assert!(msg.contains(part), "expected {part:?} in: {msg}");
    }
    // The timeout plus the 0.5 s the ranks listen for each other's reports, with slack.
    assert!(took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(4), "timed out after {took:?}");

    // The all_reduce is still pending in MPI: later calls fail at once.
    let start = Instant::now();
    let again = comm.barrier().unwrap().wait().unwrap_err().to_string();
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "a call after the timeout took {:?}",
        start.elapsed()
    );
    assert!(again.contains("unusable after an earlier error") && again.contains(&head), "{again}");
    println!("TIMEOUT-OK rank {me} after {took:?}: {msg}");
    // This rank exits without MPI_Finalize (the collective is pending), which makes mpirun
    // end the job: give the other ranks time to print their line first.
    std::thread::sleep(Duration::from_secs(1));
}

#[test]
fn a_rank_that_skips_a_collective_times_the_others_out() {
    if under_mpirun() {
        return;
    }
    for (n, skip) in [(2, 1), (3, 0)] {
        let start = Instant::now();
        let (_, out, err) = mpirun(
            n,
            "mpi_timeout_rank",
            &[("OXTRAIN_TEST_MPI_SKIP", skip.to_string())],
            Duration::from_secs(30),
        );
        for r in (0..n).filter(|&r| r != skip) {
            assert!(
                out.contains(&format!("TIMEOUT-OK rank {r} ")),
                "rank {r} did not pass (np {n}):\n{out}\n{err}"
            );
        }
        eprintln!("np {n}: the job ended after {:?}", start.elapsed());
    }
}

/// One rank of DDP over MPI: a small CNN (SGD momentum) and a small Transformer (AdamW) for 5
/// steps, plain and with ZeRO-1, checked against one process on the combined batch; prints a digest of the final
/// parameters for the parent to compare across ranks.
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn mpi_ddp_rank() {
    use common::ddp_train::{self as t, Model, Opt};
    if !under_mpirun() || std::env::var("OXTRAIN_TEST_MPI_DDP").is_err() {
        return;
    }
    let comm: std::sync::Arc<dyn Communicator> =
        std::sync::Arc::new(oxtrain_comm::mpi::connect(&CommOptions::default()).unwrap());
    let (rank, world) = (comm.rank(), comm.world_size());
    let digest = |got: &[(String, Vec<f32>)]| {
        let bits: Vec<String> =
            got.iter().flat_map(|(_, v)| v.iter().map(|x| format!("{:08x}", x.to_bits()))).collect();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bits.concat().bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        h
    };
    for (model, opt) in [(Model::Cnn, Opt::SgdMomentum), (Model::Transformer, Opt::AdamW)] {
        let ddp = t::train_rank(comm.clone(), model, opt, 5, 3, 1, oxtrain_ddp::DdpConfig::default());
        let got = t::params(ddp.module());
        let reference = t::params(&t::train_single(model, opt, 5, 3 * world, 1));
        t::assert_close(&format!("{model:?} on MPI rank {rank}"), &got, &reference, 1e-6);
        println!("DDP-PARAMS {model:?} {:016x}", digest(&got));
        // ZeRO-1 (sharded optimizer, small buckets cut by the shards, 2 micro-batches).
        let config =
            oxtrain_ddp::DdpConfig { shard_optimizer: true, bucket_cap_mb: 0.002, ..Default::default() };
        let extras = common::zero_train::Extras {
            accumulate: 2,
            clip: None,
            scale: None,
            dtype: oxtrain_tensor::DType::F32,
        };
        let run = common::zero_train::train_rank(comm.clone(), model, opt, 5, 3, config, extras);
        let got = t::params(run.ddp.module());
        let reference = t::params(&t::train_single(model, opt, 5, 3 * world, 2));
        t::assert_close(&format!("ZeRO-1 {model:?} on MPI rank {rank}"), &got, &reference, 1e-6);
        println!("DDP-PARAMS Zero{model:?} {:016x}", digest(&got));
    }
}

#[test]
fn ddp_on_2_and_3_mpi_ranks() {
    if under_mpirun() {
        return;
    }
    for n in [2, 3] {
        let (ok, out, err) =
            mpirun(n, "mpi_ddp_rank", &[("OXTRAIN_TEST_MPI_DDP", "1".into())], Duration::from_secs(120));
        assert!(ok, "mpirun -np {n} (DDP) failed:\n{out}\n{err}");
        for model in ["Cnn", "Transformer", "ZeroCnn", "ZeroTransformer"] {
            let digests: Vec<&str> = out
                .lines()
                .filter(|l| l.starts_with(&format!("DDP-PARAMS {model} ")))
                .map(|l| l.rsplit(' ').next().unwrap())
                .collect();
            assert_eq!(digests.len(), n, "{model}: expected one digest per rank in:\n{out}");
            assert!(digests.iter().all(|d| *d == digests[0]), "{model}: ranks differ: {digests:?}");
        }
    }
}
