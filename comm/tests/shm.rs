//! The `shm` backend across processes: every op against its reference on 2, 3 and 4 ranks,
//! a rank killed mid-collective, a rank that never comes, mismatched calls in checking
//! mode, the one-sided API, and bootstrap from torchrun-style variables.

mod common;

use common::procs::{assert_all_succeeded, child_role, spawn_ranks};
use oxtrain_comm::{
    shm, Cmp, CommError, CommOptions, Communicator, ReduceOp, ShmOptions, SignalOp, SymmetricMemory, TcpStore,
};
use oxtrain_tensor::{Device, Tensor};
use std::time::{Duration, Instant};

const CHILD: &str = "child";

fn host_store() -> TcpStore {
    TcpStore::host("127.0.0.1", 0, Duration::from_secs(30)).unwrap()
}

fn run(role: &str, world: usize, extra: &[(&str, String)]) -> Vec<common::procs::RankOutput> {
    let store = host_store();
    let mut env = vec![("OXTRAIN_TEST_STORE_PORT", store.port().to_string())];
    env.extend(extra.iter().cloned());
    spawn_ranks(CHILD, role, world, &env)
}

/// The ranks' entry point (a no-op in the parent's run).
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn child() {
    let Some((role, rank, world)) = child_role() else { return };
    if role == "env" {
        return env_child();
    }
    let port: u16 = std::env::var("OXTRAIN_TEST_STORE_PORT").unwrap().parse().unwrap();
    let store = TcpStore::connect("127.0.0.1", port, Duration::from_secs(30)).unwrap();
    let timeout = Duration::from_secs_f64(
        std::env::var("OXTRAIN_TEST_TIMEOUT").map(|v| v.parse().unwrap()).unwrap_or(30.0),
    );
    let check = std::env::var("OXTRAIN_TEST_CHECK").is_ok();
    let opts = ShmOptions {
        comm: CommOptions { timeout, check },
        chunk_bytes: 1024,
        heap_bytes: 1 << 20,
        name: None,
    };
    let w = shm::connect(rank, world, &store, &opts).unwrap();
    let comm: &dyn Communicator = &w.comm;
    match role.as_str() {
        "ops" => {
            common::check_all_ops(comm, 11 + world);
            common::check_bf16_accumulates_in_f32(comm);
        }
        "die" => {
            let victim = world - 1;
            comm.barrier().unwrap().wait().unwrap();
            let t = Tensor::from_vec(vec![1f32; 1 << 18], 1 << 18, Device::Cpu).unwrap();
            if rank == victim {
                // Abort while the collectives below are running.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    std::process::abort();
                });
            }
            let start = Instant::now();
            loop {
                if let Err(e) = comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait() {
                    eprintln!("RANK-ERROR: {e}");
                    assert!(matches!(e, CommError::PeerFailed { rank: r, .. } if r == victim), "{e}");
                    assert!(e.to_string().contains(&format!("rank {victim}")), "{e}");
                    assert!(start.elapsed() < timeout, "the failure took {:?}", start.elapsed());
                    // Later calls fail at once instead of hanging.
                    assert!(matches!(comm.barrier().unwrap().wait(), Err(CommError::Aborted(_))));
                    return;
                }
                assert!(start.elapsed() < Duration::from_secs(20), "rank {victim} died but nobody noticed");
            }
        }
        "absent" => {
            // The last rank is alive but never calls the barrier.
            if rank == world - 1 {
                std::thread::sleep(timeout * 3);
                return;
            }
            let start = Instant::now();
            let e = comm.barrier().unwrap().wait().unwrap_err();
            eprintln!("RANK-ERROR: {e}");
            assert!(matches!(&e, CommError::Timeout { ranks, .. } if ranks == &vec![world - 1]), "{e}");
            assert!(start.elapsed() < timeout * 2);
        }
        "mismatch" => {
            let len = if rank == 0 { 10 } else { 11 };
            let t = Tensor::from_vec(vec![1f32; len], len, Device::Cpu).unwrap();
            let e = comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap_err();
            eprintln!("RANK-ERROR: {e}");
            let msg = e.to_string();
            assert!(matches!(e, CommError::Mismatch { .. }), "{msg}");
            assert!(msg.contains("rank(s) [0] called all_reduce(float32, 10 elements, op sum)"), "{msg}");
            let others: Vec<usize> = (1..world).collect();
            assert!(
                msg.contains(&format!("rank(s) {others:?} called all_reduce(float32, 11 elements, op sum)")),
                "{msg}"
            );
        }
        "onesided" => one_sided(&w.heap, comm),
        other => panic!("unknown role {other}"),
    }
}

fn one_sided(heap: &shm::ShmHeap, comm: &dyn Communicator) {
    let (me, n) = (heap.rank(), heap.world_size());
    let len = 3000;
    let src = heap.alloc::<f32>(len).unwrap();
    let inbox = heap.alloc::<f32>(len * n).unwrap();
    let arrived = heap.alloc_signals(n).unwrap();
    let counter = heap.alloc::<u64>(1).unwrap();
    let lock = heap.alloc::<i32>(1).unwrap();
    let data = |r: usize| (0..len).map(|i| (r * 100_000 + i) as f32).collect::<Vec<_>>();
    heap.write_local(src, &data(me)).unwrap();
    heap.barrier_all().unwrap();
    for pe in 0..n {
        heap.put_with_signal(
            inbox.slice(me * len..(me + 1) * len),
            src,
            arrived.at(me),
            SignalOp::Set,
            1,
            pe,
        )
        .unwrap();
    }
    for r in 0..n {
        assert_eq!(heap.wait_until(arrived.at(r), Cmp::Eq, 1).unwrap(), 1);
    }
    let mut got = vec![0f32; len * n];
    heap.read_local(inbox, &mut got).unwrap();
    for r in 0..n {
        assert_eq!(&got[r * len..(r + 1) * len], &data(r)[..], "data put by PE {r}");
    }
    // get: read the next PE's source buffer into this PE's inbox.
    let next = (me + 1) % n;
    heap.get(inbox.slice(0..len), src, next).unwrap();
    let mut back = vec![0f32; len];
    heap.read_local(inbox.slice(0..len), &mut back).unwrap();
    assert_eq!(back, data(next));
    // Atomics on PE 0: every PE adds 10 times; exactly one PE wins the compare-swap.
    for _ in 0..10 {
        heap.atomic_fetch_add(counter, 1u64, 0).unwrap();
    }
    let old = heap.atomic_compare_swap(lock, 0i32, me as i32 + 1, 0).unwrap();
    heap.quiet().unwrap();
    heap.barrier_all().unwrap();
    let won = Tensor::from_vec(vec![f32::from(u8::from(old == 0))], 1, Device::Cpu).unwrap();
    comm.all_reduce(&won, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!(won.to_vec::<f32>(), vec![1.0], "compare-swap winners");
    if me == 0 {
        let mut c = [0u64];
        heap.read_local(counter, &mut c).unwrap();
        assert_eq!(c[0], 10 * n as u64);
    }
    heap.barrier_all().unwrap();
}

/// A rank started torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
fn env_child() {
    let pg = oxtrain_comm::init_from_env().unwrap();
    assert_eq!(pg.comm.backend(), "shm");
    let (rank, world) = (pg.env.rank, pg.env.world_size);
    pg.store.set(&format!("hello/{rank}"), format!("rank {rank}").as_bytes()).unwrap();
    let peer = (rank + 1) % world;
    assert_eq!(pg.store.get(&format!("hello/{peer}")).unwrap(), format!("rank {peer}").into_bytes());
    let t = Tensor::from_vec(vec![rank as f32 + 1.0; 7], 7, Device::Cpu).unwrap();
    pg.comm.all_reduce(&t, ReduceOp::Max).unwrap().wait().unwrap();
    assert_eq!(t.to_vec::<f32>(), vec![world as f32; 7]);
    pg.store.barrier(rank, world).unwrap();
}

#[test]
fn every_op_on_2_3_4_processes() {
    for world in [2, 3, 4] {
        assert_all_succeeded(&run("ops", world, &[]));
    }
}

#[test]
fn a_rank_killed_mid_collective_is_named_by_the_others() {
    let world = 3;
    let outs = run("die", world, &[("OXTRAIN_TEST_TIMEOUT", "10".into())]);
    let victim = &outs[world - 1];
    assert!(!victim.success, "the victim was meant to abort");
    assert_all_succeeded(&outs[..world - 1]);
    for o in &outs[..world - 1] {
        assert!(o.stderr.contains("waited for rank 2, which has exited or been killed"), "{}", o.stderr);
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_with_its_name() {
    let outs = run("absent", 2, &[("OXTRAIN_TEST_TIMEOUT", "1".into())]);
    assert_all_succeeded(&outs);
    assert!(outs[0].stderr.contains("waiting for rank(s) [1]"), "{}", outs[0].stderr);
}

#[test]
fn checking_mode_names_mismatched_ranks() {
    let outs = run("mismatch", 3, &[("OXTRAIN_TEST_CHECK", "1".into())]);
    assert_all_succeeded(&outs);
}

#[test]
fn one_sided_put_signal_get_atomics() {
    for world in [2, 3, 4] {
        assert_all_succeeded(&run("onesided", world, &[]));
    }
}

#[test]
fn init_from_torchrun_style_environment() {
    // A free port for rank 0's store.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let world = 2;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args(["--exact", CHILD, "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
                .env("OXTRAIN_TEST_ROLE", "env")
                .env("OXTRAIN_TEST_RANK", rank.to_string())
                .env("OXTRAIN_TEST_WORLD", world.to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("OXTRAIN_COMM_TIMEOUT", "30")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "rank {rank}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
