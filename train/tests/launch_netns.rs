//! `oxtrain launch --nnodes 2 --node-rank R --master-addr ADDR` across two "hosts", each a
//! network namespace with its own address (comm's harness, `comm/tests/netns/harness.rs`):
//! - the rendezvous through rank 0's TCP store across the hosts gives every worker the right
//!   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE and one unique id (what NCCL and
//!   NVSHMEM exchange; on CPU the check stops there);
//! - a host cut off mid-run (its veth down): the workers on both hosts end with the store's
//!   timeout error, each launcher restarts its workers (`--max-restarts 1`), the host comes
//!   back, and the run goes on from the last step every rank had recorded, to the end.
//!
//! The workers are this test binary again (test `netns_rank`, the role in an environment
//! variable), not `oxtrain train`: across hosts `oxtrain launch` workers meet through the TCP
//! store, as NCCL's and NVSHMEM's do, and on CPU there is no backend they could train over
//! (CPU collectives across hosts are MPI's, whose ranks mpirun or srun start, not this
//! launcher; `comm` has no TCP collectives of its own). Real `oxtrain train` workers across
//! the hosts, cut off mid-run and resumed from their checkpoint, are `mpirun_netns.rs`.
//! The tests need root and iproute2; without them they say so and pass, except under
//! `CI=true`, where they fail.

#![allow(unexpected_cfgs)]

#[allow(dead_code)]
#[path = "../../comm/tests/netns/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../../comm/tests/netns/procs.rs"]
mod procs;

use harness::Net;
use oxtrain_comm::bootstrap::store_from_env;
use oxtrain_comm::{LaunchEnv, TcpStore};
use procs::{all_output, wait_all, Proc};
use std::time::{Duration, Instant};

const ROLE: &str = "OXTRAIN_NETNS_LAUNCH_ROLE";
const STATE: &str = "OXTRAIN_NETNS_LAUNCH_STATE";
/// Steps of the cut-off run's workers.
const STEPS: u64 = 60;

/// The entry of every worker: does nothing in a plain test run.
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn netns_rank() {
    let Ok(role) = std::env::var(ROLE) else { return };
    match role.as_str() {
        "rendezvous" => rendezvous_role(),
        "steps" => steps_role(),
        other => panic!("unknown {ROLE} {other}"),
    }
}

fn timeout() -> Duration {
    let s = std::env::var("OXTRAIN_COMM_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(20.0);
    Duration::from_secs_f64(s)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// Rank 0 hosts the store, so it leaves last: the others say they are done, rank 0 waits.
fn leave(store: &TcpStore, env: &LaunchEnv, tag: &str) {
    if env.rank != 0 {
        store.set(&format!("{tag}/left/{}", env.rank), b"1").unwrap();
    } else {
        let keys: Vec<String> = (1..env.world_size).map(|r| format!("{tag}/left/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys, store.timeout()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Where the launcher put this worker, checked against the hosts every rank reports through
/// the store, and rank 0's unique id as every rank received it.
fn rendezvous_role() {
    let env = LaunchEnv::from_env().unwrap();
    let store = store_from_env(&env, timeout()).unwrap();
    let (rank, world) = (env.rank, env.world_size);
    let key = "oxtrain/nccl/0/unique_id";
    let id = if rank == 0 {
        let id: Vec<u8> = std::fs::read("/proc/sys/kernel/random/uuid").unwrap();
        store.set(key, &id).unwrap();
        id
    } else {
        store.get(key).unwrap()
    };
    let host = host_name();
    store.set(&format!("test/host/{rank}"), host.as_bytes()).unwrap();
    store.barrier(rank, world).unwrap();
    let hosts: Vec<String> = (0..world)
        .map(|r| String::from_utf8_lossy(&store.get(&format!("test/host/{r}")).unwrap()).into_owned())
        .collect();
    let local: Vec<usize> = (0..world).filter(|&r| hosts[r] == host).collect();
    println!(
        "RANK {rank} WORLD {world} LOCAL_RANK {} LOCAL_WORLD {} HOST {host} SAME_HOST {local:?} ID {}",
        env.local_rank,
        env.local_world_size,
        String::from_utf8_lossy(&id).trim()
    );
    leave(&store, &env, "test");
}

/// A run of "steps", each a wait for every rank's key of that step (for
/// `OXTRAIN_COMM_TIMEOUT`, as a collective waits), each rank recording its step in a file (its
/// checkpoint). A (re)started worker joins with a long timeout, as torchrun's rendezvous does,
/// so that the hosts' launchers need not restart at the same moment, and goes on from the
/// last step that every rank recorded.
fn steps_role() {
    let env = LaunchEnv::from_env().unwrap();
    let (rank, world) = (env.rank, env.world_size);
    let restart = std::env::var("TORCHELASTIC_RESTART_COUNT").unwrap_or_default();
    let file = std::path::PathBuf::from(std::env::var(STATE).unwrap()).join(format!("rank-{rank}.step"));
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        println!("FAILED rank {rank} ({what}): {e}");
        std::process::exit(1)
    };
    let keys = |tag: &str| -> Vec<String> { (0..world).map(|r| format!("{tag}/{r}")).collect() };
    let join = Duration::from_secs(30);
    let store = store_from_env(&env, join).unwrap_or_else(|e| fail("joining", &e));
    let mine: u64 = std::fs::read_to_string(&file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    store.set(&format!("start/{rank}"), mine.to_string().as_bytes()).unwrap_or_else(|e| fail("start", &e));
    let start = keys("start");
    store
        .wait(&start.iter().map(String::as_str).collect::<Vec<_>>(), join)
        .unwrap_or_else(|e| fail("start", &e));
    let mut step = start
        .iter()
        .map(|k| String::from_utf8_lossy(&store.get(k).unwrap()).parse::<u64>().unwrap())
        .min()
        .unwrap();
    println!("START rank {rank} restart {restart} at step {step}");
    while step < STEPS {
        let tag = format!("step/{}", step + 1);
        let what = format!("step {}", step + 1);
        store.set(&format!("{tag}/{rank}"), b"1").unwrap_or_else(|e| fail(&what, &e));
        let all = keys(&tag);
        store
            .wait(&all.iter().map(String::as_str).collect::<Vec<_>>(), timeout())
            .unwrap_or_else(|e| fail(&what, &e));
        step += 1;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, step.to_string()).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        println!("STEP rank {rank} {step}");
        std::thread::sleep(Duration::from_millis(50));
    }
    leave(&store, &env, "steps");
    println!("DONE rank {rank} at step {step}");
}

/// `oxtrain launch` on host `host` of `net` (2 nodes x 2 workers), its workers in `role`.
fn launcher(net: &Net, host: usize, role: &str, extra: &[&str], env: &[(&str, String)]) -> Proc {
    let mut cmd = net.command(host, env!("CARGO_BIN_EXE_oxtrain"));
    let node_rank = host.to_string();
    let args = [
        "launch",
        "--nnodes",
        "2",
        "--node-rank",
        &node_rank,
        "--nproc-per-node",
        "2",
        "--master-addr",
        &net.hosts[0].addr,
        "--master-port",
        "29500",
    ];
    cmd.args(args).args(extra).arg("--").arg(std::env::current_exe().unwrap());
    cmd.args(["--exact", "netns_rank", "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
        .env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(&format!("launcher on host {host}"), cmd)
}

#[test]
fn launch_across_two_hosts_gives_every_worker_its_place() {
    if !harness::available("launch_across_two_hosts_gives_every_worker_its_place") {
        return;
    }
    let net = Net::new(2);
    let procs: Vec<Proc> = (0..2).map(|h| launcher(&net, h, "rendezvous", &[], &[])).collect();
    let ended = wait_all(procs, Duration::from_secs(60));
    let all = all_output(&ended);
    assert!(ended.iter().all(|e| e.success), "{all}");
    // Two workers share the launcher's stdout: a worker's line can land after the test
    // harness's "test result: " of the other (written in two pieces), so a line is found by
    // where "RANK " starts, not by its first column.
    let lines: Vec<&str> = all.lines().filter_map(|l| l.find("RANK ").map(|i| &l[i..])).collect();
    assert_eq!(lines.len(), 4, "{all}");
    let ids: std::collections::BTreeSet<&str> =
        lines.iter().map(|l| l.split(" ID ").nth(1).unwrap()).collect();
    assert_eq!(ids.len(), 1, "one unique id for all: {all}");
    for (h, e) in ended.iter().enumerate() {
        for local in 0..2 {
            let rank = 2 * h + local;
            let want = format!(
                "RANK {rank} WORLD 4 LOCAL_RANK {local} LOCAL_WORLD 2 HOST {} SAME_HOST [{}, {}]",
                net.hosts[h].ns,
                2 * h,
                2 * h + 1
            );
            assert!(e.output.lines().any(|l| l.contains(&want)), "{want}\n{all}");
        }
    }
}

#[test]
fn a_host_cut_off_mid_run_is_restarted_and_the_run_ends() {
    if !harness::available("a_host_cut_off_mid_run_is_restarted_and_the_run_ends") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let net = Net::new(2);
    let env = [(STATE, state.path().display().to_string()), ("OXTRAIN_COMM_TIMEOUT", "2".to_string())];
    let extra = ["--max-restarts", "1", "--stop-timeout", "1"];
    let procs: Vec<Proc> = (0..2).map(|h| launcher(&net, h, "steps", &extra, &env)).collect();
    assert!(procs[1].wait_for("STEP rank 3 10\n", Duration::from_secs(60)), "{}", procs[1].output());
    net.cut(1);
    let cut = Instant::now();
    // Host 1's workers time out, its launcher restarts them; they try to reach rank 0 again
    // (for the store's timeout) while the host comes back.
    assert!(procs[1].wait_for("restart 1 of 1", Duration::from_secs(30)), "{}", procs[1].output());
    let out = std::process::Command::new("ip")
        .args(["-n", &net.hosts[1].ns, "link", "set", "eth0", "up"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    println!("host 1 back {:.1} s after the cut", cut.elapsed().as_secs_f64());
    let ended = wait_all(procs, Duration::from_secs(90));
    let all = all_output(&ended);
    assert!(ended.iter().all(|e| e.success), "{all}");
    for rank in 0..4 {
        assert!(all.contains(&format!("DONE rank {rank} at step {STEPS}")), "rank {rank}: {all}");
        let restarted = format!("START rank {rank} restart 1 at step ");
        let from: u64 = all
            .lines()
            .find_map(|l| l.strip_prefix(&restarted))
            .unwrap_or_else(|| panic!("rank {rank} was not restarted: {all}"))
            .parse()
            .unwrap();
        assert!((10..STEPS).contains(&from), "rank {rank} went on from step {from}: {all}");
    }
    assert!(all.contains("FAILED rank"), "the cut ended workers with an error: {all}");
    for e in &ended {
        assert!(e.output.contains("restart 1 of 1: starting all 2 workers again"), "{}", e.output);
    }
}
