//! Open MPI across the namespaces: `mpirun --hostfile` inside host 0 starts the ranks of
//! host 1 through `scripts/netns/rsh-agent.sh` (Open MPI's `plm_rsh_agent`, where a cluster
//! has ssh), and the ranks talk over the hosts' links with Open MPI's TCP transport (shared
//! memory between the ranks of one host). The backend is chosen by `init_from_env` as a user's
//! program would: ranks on several hosts, no OXTRAIN_COMM_BACKEND, built with `mpi`.

use super::harness::Net;
use super::procs::{wait_all, Proc};
use super::{common, roles};
use oxtrain_comm::{Communicator, Launcher, ReduceOp};
use oxtrain_tensor::{Device, Tensor};
use std::time::{Duration, Instant};

/// A hostfile in the temporary folder, removed when dropped.
pub(super) struct Hostfile(std::path::PathBuf);

impl Drop for Hostfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `mpirun -np 4` over 2 hosts of 2 slots, started inside host 0, running `role`, with
/// `extra` variables passed to every rank.
pub(super) fn mpirun(net: &Net, role: &str, timeout_s: &str, extra: &[(&str, &str)]) -> (Proc, Hostfile) {
    let path = std::env::temp_dir().join(format!("{}-hostfile", net.hosts[0].ns));
    let text: String = net.hosts.iter().map(|h| format!("{} slots=2\n", h.addr)).collect();
    std::fs::write(&path, text).expect("writing the hostfile");
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/netns/rsh-agent.sh");
    let exe = std::env::current_exe().unwrap();
    let subnet = "10.77.0.0/24";
    let mut cmd = net.command(0, "mpirun");
    cmd.args(["--allow-run-as-root", "--hostfile", path.to_str().unwrap(), "-np", "4"])
        .args(["--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1"])
        // TCP between hosts on their own subnet only, shared memory within a host.
        .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"])
        .args(["--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet])
        .args(["-x", roles::ROLE, "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OXTRAIN_COMM_TIMEOUT"])
        .arg(exe)
        .args(["--exact", "netns_rank", "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
        .env("OXTRAIN_NETNS_HOSTS", net.host_map())
        .env(roles::ROLE, role)
        .env("MASTER_ADDR", &net.hosts[0].addr)
        .env("MASTER_PORT", super::PORT)
        .env("OXTRAIN_COMM_TIMEOUT", timeout_s)
        .env_remove("OXTRAIN_COMM_BACKEND");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    (Proc::spawn("mpirun", cmd), Hostfile(path))
}

/// The rest of the first line holding `needle`, from `needle` on. mpirun forwards each rank's
/// output in chunks, not lines, so one rank's line may follow another rank's unfinished one
/// (libtest's `-q` prints a `.` with no newline when a rank's test passes).
fn from_needle<'a>(out: &'a str, needle: &str) -> Option<&'a str> {
    out.lines().find_map(|l| l.find(needle).map(|at| &l[at..]))
}

/// Role `mpi-all-reduce`: the process group from Open MPI's variables, the store across
/// hosts, every collective against its reference, and a 4 MiB all-reduce.
pub fn all_reduce_role() {
    let pg = oxtrain_comm::init_from_env().unwrap();
    assert_eq!((pg.comm.backend(), pg.env.launcher), ("mpi", Launcher::OpenMpi));
    let line = roles::rendezvous(&pg.store, &pg.env);
    let comm: &dyn Communicator = &*pg.comm;
    common::check_all_ops(comm, 40);
    let (rank, world) = (comm.rank(), comm.world_size());
    let n = 1 << 20;
    let t = Tensor::from_vec(
        (0..n).map(|i| common::value(rank, i, 7) as f32).collect::<Vec<_>>(),
        n,
        Device::Cpu,
    )
    .unwrap();
    comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
    let got = t.to_f64_vec();
    for (i, g) in got.iter().enumerate() {
        let want: f64 = (0..world).map(|r| common::value(r, i, 7)).sum();
        assert_eq!(*g, want, "rank {rank}: element {i} of the 4 MiB all_reduce");
    }
    println!("MPI-OK {line}");
    roles::leave(&pg.store, &pg.env);
}

/// Role `mpi-cut-off`: all-reduces every 20 ms until one fails; prints its error.
pub fn cut_off_role() {
    let pg = oxtrain_comm::init_from_env().unwrap();
    let comm: &dyn Communicator = &*pg.comm;
    let (rank, world) = (comm.rank(), comm.world_size());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut steps = 0;
    while Instant::now() < deadline {
        let t = Tensor::from_vec(vec![1f32; 1 << 16], 1 << 16, Device::Cpu).unwrap();
        let start = Instant::now();
        match comm.all_reduce(&t, ReduceOp::Sum).and_then(|w| w.wait()) {
            Ok(()) => assert_eq!(t.to_f64_vec()[0], world as f64),
            Err(e) => {
                println!("CUT-OFF rank {rank} after {:.2}s: {e}", start.elapsed().as_secs_f64());
                return;
            }
        }
        steps += 1;
        if steps == 1 {
            println!("READY {rank}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("rank {rank}: no all_reduce failed within 60 s");
}

#[test]
fn mpi_all_reduce_2_hosts_x_2_ranks_with_mpirun_hostfile() {
    if !super::harness::available("mpi_all_reduce_2_hosts_x_2_ranks_with_mpirun_hostfile") {
        return;
    }
    let net = Net::new(2);
    let before = net.eth0_bytes(1);
    let (job, _hostfile) = mpirun(&net, "mpi-all-reduce", "30", &[]);
    let ended = wait_all(vec![job], Duration::from_secs(90));
    let out = &ended[0].output;
    assert!(ended[0].success, "mpirun failed:\n{out}");
    for r in 0..4 {
        let head = format!(
            "MPI-OK RANK {r} WORLD 4 LOCAL_RANK {} LOCAL_WORLD 2 HOST {} LAUNCHER OpenMpi ID ",
            r % 2,
            net.hosts[r / 2].ns
        );
        assert!(from_needle(out, &head).is_some(), "no line {head:?} in:\n{out}");
    }
    // The 4 MiB all-reduce alone moves megabytes over host 1's link.
    let after = net.eth0_bytes(1);
    assert!(
        after.0 - before.0 > 4 << 20 && after.1 - before.1 > 4 << 20,
        "host 1's eth0: {before:?} -> {after:?}"
    );
}

/// Host 1 is cut off between all-reduces: the ranks of host 0 end with the mpi backend's
/// timeout error (3 s) naming ranks 2 and 3. (mpirun itself then waits for host 1's daemon,
/// which it cannot reach: the test ends it, as a scheduler's job limit would.)
#[test]
fn mpi_a_host_cut_off_mid_run_times_out_the_others() {
    if !super::harness::available("mpi_a_host_cut_off_mid_run_times_out_the_others") {
        return;
    }
    let net = Net::new(2);
    let (job, _hostfile) = mpirun(&net, "mpi-cut-off", "3", &[]);
    for r in 0..4 {
        assert!(
            job.wait_for(&format!("READY {r}"), Duration::from_secs(60)),
            "rank {r} not ready:\n{}",
            job.output()
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    net.cut(1);
    let cut = Instant::now();
    for r in 0..2 {
        let found = job.wait_for(&format!("CUT-OFF rank {r} "), Duration::from_secs(15));
        assert!(found, "rank {r} did not end within 15 s of the cut:\n{}", job.output());
    }
    let took = cut.elapsed();
    let out = job.output();
    let _ = wait_all(vec![job], Duration::from_secs(2));
    for r in 0..2 {
        let line = from_needle(&out, &format!("CUT-OFF rank {r} "))
            .unwrap_or_else(|| panic!("no CUT-OFF line for rank {r} in:\n{out}"));
        eprintln!("{line}");
        let msg = line.split_once(": ").unwrap().1;
        let head = format!("all_reduce: rank {r} timed out after 3s waiting for rank(s) [2, 3]; ");
        assert!(msg.starts_with(&head), "expected {head:?} at the start of: {msg}");
        assert!(msg.contains("OXTRAIN_COMM_TIMEOUT"), "{msg}");
    }
    // The timeout, the half second the ranks listen for each other's reports, and slack.
    assert!(took < Duration::from_secs(3 + 4), "host 0's ranks ended {took:?} after the cut");
}
