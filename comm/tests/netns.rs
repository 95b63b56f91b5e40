//! Several hosts on one machine: every "host" a network namespace with its own address on a
//! private /24 (see `netns/harness.rs`), and ranks started in them as on separate machines.
//!
//! - the TCP store's rendezvous across 2 hosts x 2 ranks under torchrun's and Slurm's
//!   variables: RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, the unique-id exchange
//!   that NCCL and NVSHMEM need, each rank's host;
//! - a host cut off mid-run: the others end with the store's timeout error, naming the ranks;
//! - the errors a user meets (a rank that never joins, a wrong address, a firewall), quoted
//!   in docs/multi-node.md;
//! - with `--features mpi` (`netns/mpi.rs`): Open MPI's `mpirun --hostfile` across the
//!   namespaces (its ssh replaced by `scripts/netns/rsh-agent.sh`) running the `mpi`
//!   backend, and a host cut off in the middle of its all-reduces.
//!
//! The tests need root and iproute2; without them they say so and pass, except under
//! `CI=true`, where they fail. Each has a hard time bound: its processes are killed past it.

#[path = "common/mod.rs"]
mod common;
#[cfg(feature = "mpi")]
#[path = "netns/ddp.rs"]
mod ddp;
#[path = "netns/harness.rs"]
mod harness;
#[cfg(feature = "mpi")]
#[path = "netns/mpi.rs"]
mod mpi;
#[path = "netns/procs.rs"]
mod procs;
#[path = "netns/roles.rs"]
mod roles;

use harness::Net;
use procs::{all_output, wait_all, Proc};
use std::time::Duration;

const PORT: &str = "29500";

/// The entry of every rank process: does nothing in a plain test run.
#[test]
#[ignore = "a rank of a multi-process test: its parent runs it"]
fn netns_rank() {
    let Ok(role) = std::env::var(roles::ROLE) else { return };
    match role.as_str() {
        "rendezvous" => roles::rendezvous_role(),
        "store-loop" => roles::store_loop_role(),
        "store-error" => roles::store_error_role(),
        #[cfg(feature = "mpi")]
        "mpi-all-reduce" => mpi::all_reduce_role(),
        #[cfg(feature = "mpi")]
        "mpi-cut-off" => mpi::cut_off_role(),
        #[cfg(feature = "mpi")]
        "ddp" => ddp::ddp_role(),
        other => panic!("unknown {} {other}", roles::ROLE),
    }
}

/// Which launcher's variables a rank gets.
#[derive(Clone, Copy)]
enum Vars {
    Torchrun,
    Slurm,
}

/// Starts global rank `rank` on host `host` of `net` in `role`, with `per_host` ranks per host
/// and `world` in all, as the launcher `vars` would (block placement: host h holds ranks
/// h*per_host..), with rank 0's address as MASTER_ADDR and `extra` variables on top.
fn start_rank(
    net: &Net,
    role: &str,
    vars: Vars,
    (host, local, per_host, world): (usize, usize, usize, usize),
    extra: &[(&str, &str)],
) -> Proc {
    let rank = host * per_host + local;
    let exe = std::env::current_exe().unwrap();
    let mut cmd = net.command(host, exe.to_str().unwrap());
    cmd.args(["--exact", "netns_rank", "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
        .env(roles::ROLE, role)
        .env("MASTER_ADDR", &net.hosts[0].addr)
        .env("MASTER_PORT", PORT)
        .env("OXTRAIN_COMM_TIMEOUT", "20");
    // The test's own launcher variables must not leak in (a CI under Slurm, say).
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"]
    {
        cmd.env_remove(k);
    }
    let s = |x: usize| x.to_string();
    match vars {
        Vars::Torchrun => {
            cmd.env("RANK", s(rank)).env("WORLD_SIZE", s(world));
            cmd.env("LOCAL_RANK", s(local)).env("LOCAL_WORLD_SIZE", s(per_host));
        }
        Vars::Slurm => {
            // What srun sets for `--nodes 2 --ntasks-per-node 2` (block distribution).
            cmd.env("SLURM_PROCID", s(rank)).env("SLURM_NTASKS", s(world)).env("SLURM_LOCALID", s(local));
            cmd.env("SLURM_NODEID", s(host)).env("SLURM_NNODES", s(world / per_host));
            cmd.env("SLURM_STEP_TASKS_PER_NODE", format!("{per_host}(x{})", world / per_host));
        }
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Proc::spawn(&format!("rank {rank} on {}", net.hosts[host].ns), cmd)
}

/// The 2 x 2 rendezvous under `vars`; checks every rank's line against where it was started.
fn rendezvous_2x2(test: &str, vars: Vars, launcher: &str) {
    if !harness::available(test) {
        return;
    }
    let net = Net::new(2);
    let before = net.eth0_bytes(1);
    let procs: Vec<Proc> =
        (0..4).map(|r| start_rank(&net, "rendezvous", vars, (r / 2, r % 2, 2, 4), &[])).collect();
    let ended = wait_all(procs, Duration::from_secs(60));
    let text = all_output(&ended);
    let mut ids = vec![];
    for (r, e) in ended.iter().enumerate() {
        assert!(e.success, "rank {r} failed:\n{text}");
        let line =
            e.output.lines().find(|l| l.starts_with("RANK ")).unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        let head = format!(
            "RANK {r} WORLD 4 LOCAL_RANK {} LOCAL_WORLD 2 HOST {} LAUNCHER {launcher} ID ",
            r % 2,
            net.hosts[r / 2].ns
        );
        assert!(line.starts_with(&head), "rank {r}: expected {head:?}, got {line:?}");
        ids.push(line[head.len()..].to_string());
        #[cfg(not(feature = "mpi"))]
        assert!(
            e.output.contains("INIT-ERROR bootstrap: 4 ranks over several hosts need a network backend"),
            "rank {r}:\n{text}"
        );
    }
    assert_eq!(ids[0].len(), 256, "{text}");
    assert!(ids.iter().all(|id| *id == ids[0]), "the unique ids differ: {ids:?}");
    // Ranks 2 and 3 reached rank 0's store over host 1's link, not by loopback.
    let after = net.eth0_bytes(1);
    assert!(
        after.0 > before.0 && after.1 > before.1,
        "host 1's eth0 moved no bytes: {before:?} -> {after:?}"
    );
}

#[test]
fn store_rendezvous_2_hosts_x_2_ranks_torchrun_variables() {
    rendezvous_2x2("store_rendezvous_2_hosts_x_2_ranks_torchrun_variables", Vars::Torchrun, "Torchrun");
}

#[test]
fn store_rendezvous_2_hosts_x_2_ranks_srun_variables() {
    rendezvous_2x2("store_rendezvous_2_hosts_x_2_ranks_srun_variables", Vars::Slurm, "Slurm");
}

/// The ranks on the first host must end with the store's timeout error, naming only ranks of
/// the host cut off, within the timeout (3 s) of the cut; the cut-off host's ranks must end
/// too, with an error that says they lost rank 0's store (their requests fail once the read
/// limit passes).
#[test]
fn a_host_cut_off_mid_run_ends_the_others_with_a_timeout_error() {
    if !harness::available("a_host_cut_off_mid_run_ends_the_others_with_a_timeout_error") {
        return;
    }
    let net = Net::new(2);
    let timeout = [("OXTRAIN_COMM_TIMEOUT", "3")];
    let procs: Vec<Proc> = (0..4)
        .map(|r| start_rank(&net, "store-loop", Vars::Torchrun, (r / 2, r % 2, 2, 4), &timeout))
        .collect();
    for p in &procs {
        assert!(p.wait_for("READY", Duration::from_secs(30)), "{} never got ready:\n{}", p.name, p.output());
    }
    // Mid-run: the ranks have been through barriers for a while.
    std::thread::sleep(Duration::from_millis(300));
    net.cut(1);
    // Host 1's ranks end when their requests' read limit (the timeout plus 10 s) passes.
    let ended = wait_all(procs, Duration::from_secs(45));
    let text = all_output(&ended);
    // Rank 0 (it hosts the store) times out naming ranks of host 1 only. Rank 1 does the same,
    // or, when rank 0 has already exited on its error, loses the store; host 1's ranks lose it.
    let timed_out = |r: usize, msg: &str| -> bool {
        let waited = format!(": rank {r} timed out after 3s waiting for rank(s) [");
        if !(msg.starts_with("store barrier #") && msg.contains(&waited)) {
            return false;
        }
        let named = msg.split_once("rank(s) [").unwrap().1.split_once(']').unwrap().0;
        assert!(
            !named.is_empty() && named.split(", ").all(|n| n == "2" || n == "3"),
            "named [{named}]: {msg}"
        );
        assert!(msg.contains("never reached the barrier"), "{msg}");
        true
    };
    for (r, e) in ended.iter().enumerate() {
        assert!(!e.killed, "rank {r} hung:\n{text}");
        let line =
            e.output.lines().find(|l| l.starts_with("FAILED")).unwrap_or_else(|| panic!("rank {r}:\n{text}"));
        eprintln!("{line}");
        assert!(line.starts_with(&format!("FAILED rank {r} after ")), "{line}");
        let msg = line.split_once(": ").unwrap().1;
        let lost = msg.contains("(rank 0, which hosts the store, may have exited)");
        match r {
            0 => assert!(timed_out(0, msg), "rank 0: {msg}"),
            1 => assert!(timed_out(1, msg) || lost, "rank 1: {msg}"),
            _ => assert!(lost, "rank {r}: {msg}"),
        }
    }
    // Host 0's ranks ended within the timeout of the cut, plus the time to find who is
    // missing; rank 0's failing barrier did wait the timeout.
    for (r, e) in ended[..2].iter().enumerate() {
        assert!(e.after < Duration::from_secs(6), "rank {r} ended {:?} after the cut", e.after);
    }
    let took: f64 =
        ended[0].output.split("after ").nth(1).and_then(|t| t.split('s').next()?.parse().ok()).unwrap();
    assert!(took >= 3.0, "rank 0's failing barrier took only {took} s");
}

/// The errors of docs/multi-node.md's troubleshooting table, each produced for real (2 s
/// timeouts, all at once on separate ports):
/// - a rank that never joins (rank 3 of 4 never started): the others' barrier names it;
/// - MASTER_ADDR=127.0.0.1 on two hosts: the second host's ranks find no store on their own
///   loopback, and rank 0 names them;
/// - MASTER_ADDR on no network of the host (a wrong interface's address): no route;
/// - a firewall that drops the store's packets (host 2's frames to rank 0 go to an address
///   nobody has, so its connection attempts are never answered): connection timed out.
#[test]
fn the_errors_a_user_meets_say_what_is_wrong() {
    if !harness::available("the_errors_a_user_meets_say_what_is_wrong") {
        return;
    }
    let net = Net::new(3);
    // Host 2's firewall: rank 0's address resolves to a hardware address no host has.
    let out = std::process::Command::new("ip")
        .args(["-n", &net.hosts[2].ns, "neigh", "replace", &net.hosts[0].addr])
        .args(["lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "permanent"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ip neigh: {}", String::from_utf8_lossy(&out.stderr));
    let t = ("OXTRAIN_COMM_TIMEOUT", "2");
    let mut procs = vec![];
    // A rank that never joins: ranks 0-2 of 4.
    for r in 0..3 {
        procs.push(start_rank(&net, "store-error", Vars::Torchrun, (r / 2, r % 2, 2, 4), &[t]));
    }
    // Loopback as MASTER_ADDR across hosts, port 29501.
    let lo = [t, ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29501")];
    for r in 0..4 {
        procs.push(start_rank(&net, "store-error", Vars::Torchrun, (r / 2, r % 2, 2, 4), &lo));
    }
    // An address on no network of host 1; rank 0's store behind host 2's firewall.
    let unrouted = [t, ("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
    let mut other_net = unrouted.to_vec();
    other_net.push(("MASTER_ADDR", "10.78.0.1"));
    procs.push(start_rank(&net, "store-error", Vars::Torchrun, (1, 0, 1, 2), &other_net));
    procs.push(start_rank(&net, "store-error", Vars::Torchrun, (2, 0, 1, 3), &unrouted));
    let ended = wait_all(procs, Duration::from_secs(40));
    let text = all_output(&ended);
    let error = |i: usize| -> String {
        let e = &ended[i];
        assert!(!e.killed, "{} hung:\n{text}", e.name);
        let line = e
            .output
            .lines()
            .find(|l| l.starts_with("ERROR"))
            .unwrap_or_else(|| panic!("{}:\n{text}", e.name));
        eprintln!("{}: {line}", e.name);
        line.split_once(": ").unwrap().1.to_string()
    };
    for (i, r) in (0..3).enumerate() {
        let msg = error(i);
        let want = format!("store barrier #0: rank {r} timed out after 2s waiting for rank(s) [3]; those ranks never reached the barrier");
        assert!(msg.starts_with(&want), "expected {want:?} at the start of {msg:?}");
    }
    for r in 0..4 {
        let msg = error(3 + r);
        if r < 2 {
            assert!(msg.contains("waiting for rank(s) [2, 3]"), "{msg}");
        } else {
            let want = "bootstrap: could not reach the store of rank 0 at 127.0.0.1:29501 within 2s (Connection refused";
            assert!(
                msg.starts_with(want) && msg.contains("MASTER_ADDR/MASTER_PORT"),
                "expected {want:?} in {msg:?}"
            );
        }
    }
    let msg = error(7);
    assert!(msg.contains("at 10.78.0.1:29500") && msg.contains("Network is unreachable"), "{msg}");
    let msg = error(8);
    assert!(msg.contains(&format!("at {}:29500", net.hosts[0].addr)) && msg.contains("timed out"), "{msg}");
}
