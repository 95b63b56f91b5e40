//! A rank that hangs (SIGSTOP: alive, holding its shared memory, never answering): the other
//! rank stops within the communicator's timeout with an error naming the rank and the
//! collective, instead of waiting for ever.

mod common;

use common::procs::{child_role, spawn_ranks};
use oxtrain_comm::{shm, CommError, CommOptions, Communicator, ReduceOp, ShmOptions, TcpStore};
use oxtrain_tensor::{Device, Tensor};
use std::time::{Duration, Instant};

const CHILD: &str = "child";
const TIMEOUT: Duration = Duration::from_secs(2);

/// The ranks' entry point (a no-op in the parent's run).
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn child() {
    let Some((_role, rank, world)) = child_role() else { return };
    let port: u16 = std::env::var("OXTRAIN_TEST_STORE_PORT").unwrap().parse().unwrap();
    let store = TcpStore::connect("127.0.0.1", port, Duration::from_secs(30)).unwrap();
    let opts = ShmOptions {
        comm: CommOptions { timeout: TIMEOUT, check: false },
        chunk_bytes: 1024,
        heap_bytes: 1 << 20,
        name: None,
    };
    let w = shm::connect(rank, world, &store, &opts).unwrap();
    let comm: &dyn Communicator = &w.comm;
    let victim = world - 1;
    comm.barrier().unwrap().wait().unwrap();
    if rank == victim {
        store.set("victim_pid", std::process::id().to_string().as_bytes()).unwrap();
        // Stops the whole process while the collectives below run; only a signal from rank
        // 0 (SIGKILL, once it has seen the timeout) ends it.
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: raise only sends a signal to this process.
            unsafe { libc::raise(libc::SIGSTOP) };
        });
    }
    let t = Tensor::from_vec(vec![1f32; 1 << 16], 1 << 16, Device::Cpu).unwrap();
    // The victim stops inside one of these calls; the other rank's call must time out.
    let (e, waited) = loop {
        let start = Instant::now();
        if let Err(e) = comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait() {
            break (e, start.elapsed());
        }
    };
    eprintln!("RANK-ERROR after {waited:?}: {e}");
    assert!(matches!(&e, CommError::Timeout { ranks, .. } if ranks == &vec![victim]), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("all_reduce") && msg.contains(&format!("rank(s) [{victim}]")), "{msg}");
    assert!(waited < TIMEOUT + Duration::from_secs(3), "stopped after {waited:?}, timeout {TIMEOUT:?}");
    let pid: i32 = String::from_utf8(store.get("victim_pid").unwrap()).unwrap().parse().unwrap();
    // SAFETY: kill sends a signal to the stopped victim, a child of the same test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn a_stopped_rank_is_named_with_the_collective_within_the_timeout() {
    let store = TcpStore::host("127.0.0.1", 0, Duration::from_secs(30)).unwrap();
    let start = Instant::now();
    let outs = spawn_ranks(CHILD, "hang", 2, &[("OXTRAIN_TEST_STORE_PORT", store.port().to_string())]);
    assert!(outs[0].success, "rank 0 should report the stopped rank:\n{}", outs[0].stderr);
    assert!(outs[0].stderr.contains("RANK-ERROR"), "{}", outs[0].stderr);
    eprintln!("{}", outs[0].stderr.lines().find(|l| l.contains("RANK-ERROR")).unwrap_or_default());
    assert!(!outs[1].success, "the stopped rank was meant to be killed");
    assert!(start.elapsed() < Duration::from_secs(60), "took {:?}", start.elapsed());
}
