//! Real `oxtrain train` DDP workers across two "hosts", each a network namespace with its own
//! address (comm's harness, `comm/tests/netns/harness.rs`): `mpirun --hostfile` inside host 0
//! starts 2 ranks on each host (host 1's through `scripts/netns/rsh-agent.sh`, Open MPI's
//! `plm_rsh_agent`), and the gradients cross the hosts' link over the `mpi` backend, which
//! `oxtrain train` picks by itself for CPU ranks on several hosts.
//!
//! Host 1 is cut off (its veth down) between two steps: the ranks of host 0 end with the mpi
//! backend's timeout error naming ranks 2 and 3 within `OXTRAIN_COMM_TIMEOUT`, the job ends,
//! host 1 comes back, and the job is started again with `checkpoint.resume=latest`: it goes
//! on from the last checkpoint and ends with the losses and final weights of an undisturbed
//! run, bit for bit.
//!
//! The restart is the job script's (a Slurm requeue, a retry loop: docs/multi-node.md), not
//! `oxtrain launch --max-restarts`: MPI ranks are started by mpirun, which restarts nothing,
//! and `oxtrain launch` cannot start MPI ranks (MPI forms its world from mpirun's daemons, not
//! from torchrun's variables). The launcher's restart across hosts is tested in
//! `launch_netns.rs`, with workers that meet through the TCP store as NCCL's do.
//!
//! Needs `--features mpi`, root, iproute2 and Open MPI; without root or iproute2 it says so
//! and passes, except under `CI=true`, where it fails.

#![cfg(feature = "mpi")]

#[allow(dead_code)]
#[path = "../../comm/tests/netns/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../../comm/tests/netns/procs.rs"]
mod procs;
#[path = "resume_support/mod.rs"]
mod support;

use harness::Net;
use procs::{all_output, wait_all, Proc};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{assert_same_run, pid_in, train_args};

/// The communicator's timeout of every rank, in seconds.
const TIMEOUT_S: u64 = 3;
/// Every rank holds after this step (its checkpoint committed) until the test lets it go.
const HALT_AFTER: usize = 8;

/// `mpirun -np 4` over 2 hosts of 2 slots, started inside host 0, each rank `oxtrain ARGS`
/// with `env` (passed on to the ranks of both hosts), each rank's output also in its own
/// files under `dir/LABEL` (see [`rank_text`]).
fn mpirun(net: &Net, dir: &Path, label: &str, args: &[String], env: &[(&str, String)]) -> Proc {
    let hostfile = dir.join("hostfile");
    let text: String = net.hosts.iter().map(|h| format!("{} slots=2\n", h.addr)).collect();
    std::fs::write(&hostfile, text).unwrap();
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/netns/rsh-agent.sh");
    let subnet = "10.77.0.0/24";
    let mut cmd = net.command(0, "mpirun");
    cmd.args(["--allow-run-as-root", "--hostfile", hostfile.to_str().unwrap(), "-np", "4"])
        .args(["--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1"])
        .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"])
        .args(["--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet])
        .args(["--wdir", dir.to_str().unwrap()])
        .args(["--output-filename", dir.join(label).to_str().unwrap()])
        .env("OXTRAIN_NETNS_HOSTS", net.host_map())
        .env("MASTER_ADDR", &net.hosts[0].addr)
        .env("MASTER_PORT", "29500")
        .env("OXTRAIN_COMM_TIMEOUT", TIMEOUT_S.to_string())
        .env("RAYON_NUM_THREADS", "1");
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "OXTRAIN_COMM_BACKEND", "OXTRAIN_TEST_HALT_AFTER_STEP"] {
        cmd.env_remove(k);
    }
    let mut names = vec!["MASTER_ADDR", "MASTER_PORT", "OXTRAIN_COMM_TIMEOUT", "RAYON_NUM_THREADS"];
    for (k, v) in env {
        cmd.env(k, v);
        names.push(k);
    }
    for k in names {
        cmd.args(["-x", k]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_oxtrain")).args(args);
    Proc::spawn("mpirun", cmd)
}

fn mpirun_available() -> bool {
    let found =
        std::process::Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found && std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true but mpirun (Open MPI) is not installed");
    }
    if !found {
        eprintln!("SKIPPED: mpirun (Open MPI) is not installed");
    }
    found
}

/// What rank `rank` of the job `label` has printed so far (stdout, then stderr), from the
/// files of mpirun's `--output-filename` (`LABEL/<job>/rank.R/`): whole, where mpirun's
/// forwarded output interleaves the ranks' writes (an unbuffered stderr line is several).
fn rank_text(dir: &Path, label: &str, rank: usize) -> String {
    let Ok(jobs) = std::fs::read_dir(dir.join(label)) else { return String::new() };
    let mut text = String::new();
    for job in jobs.flatten() {
        for stream in ["stdout", "stderr"] {
            let path = job.path().join(format!("rank.{rank}")).join(stream);
            text.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    text
}

/// The pid of the rank whose hook said "rank R (pid P) halted after step HALT_AFTER", if it has.
fn halted_pid(text: &str) -> Option<i32> {
    let line = text.lines().find(|l| l.ends_with(&format!(") halted after step {HALT_AFTER}")))?;
    pid_in(line).into()
}

#[test]
fn a_host_cut_off_mid_training_times_out_and_the_job_resumes_from_its_checkpoint() {
    if !harness::available("a_host_cut_off_mid_training_times_out_and_the_job_resumes_from_its_checkpoint")
        || !mpirun_available()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let net = Net::new(2);
    let every = format!("checkpoint.every_steps={}", HALT_AFTER / 2);
    let finish = |job: Proc, what: &str| {
        let ended = wait_all(vec![job], Duration::from_secs(60));
        assert!(ended[0].success, "{what} failed:\n{}", all_output(&ended));
        ended.into_iter().next().unwrap().output
    };

    // The undisturbed run: the same 2 hosts x 2 ranks, the same checkpoints.
    let out = finish(
        mpirun(&net, d, "reference-out", &train_args(d, "reference", &[&every]), &[]),
        "the undisturbed run",
    );
    assert!(out.contains("DDP rank 0 of 4 (mpi)"), "the ranks chose the mpi backend:\n{out}");

    // Every rank holds after step HALT_AFTER (the checkpoint of that step written); host 1 is
    // cut off; SIGTERM lets the ranks go on into the next step, whose gradient all-reduce
    // cannot reach the other host. (SIGTERM would also save and stop the run after that
    // step; the step never ends.)
    let args = train_args(d, "cut", &[&every]);
    let job = mpirun(&net, d, "cut-out", &args, &[("OXTRAIN_TEST_HALT_AFTER_STEP", HALT_AFTER.to_string())]);
    let halted = || -> Vec<i32> { (0..4).filter_map(|r| halted_pid(&rank_text(d, "cut-out", r))).collect() };
    let deadline = Instant::now() + Duration::from_secs(60);
    while halted().len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = halted();
    assert_eq!(pids.len(), 4, "every rank halts after step {HALT_AFTER}:\n{}", job.output());
    net.cut(1);
    let cut = Instant::now();
    for pid in pids {
        // SAFETY: kill(2) on a rank of this test's job, halted and alive.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    // Each rank of host 0 ends with the trainer's error, the mpi backend's timeout naming
    // the ranks of host 1, and what to tune.
    let error_of = |r: usize| {
        rank_text(d, "cut-out", r)
            .lines()
            .find(|l| l.starts_with("oxtrain train: communication: "))
            .map(String::from)
    };
    let deadline = cut + Duration::from_secs(TIMEOUT_S + 15);
    while (0..2).any(|r| error_of(r).is_none()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = cut.elapsed();
    for r in 0..2 {
        let error = error_of(r).unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", job.output()));
        println!("rank {r}: {error}");
        let step = format!("oxtrain train: communication: DDP backward of step {} (epoch ", HALT_AFTER + 1);
        let timeout =
            format!("all_reduce: rank {r} timed out after {TIMEOUT_S}s waiting for rank(s) [2, 3]; ");
        assert!(error.starts_with(&step) && error.contains(&timeout), "rank {r}: {error}");
        assert!(error.contains("OXTRAIN_COMM_TIMEOUT"), "the error says what to tune: {error}");
    }
    // The timeout, the half second the ranks listen for each other's reports, and slack for
    // a loaded machine.
    assert!(took < Duration::from_secs(TIMEOUT_S + 5), "host 0's ranks ended {took:?} after the cut");

    // Host 1 comes back; mpirun then hears from its daemon that the job's ranks have ended.
    let up = std::process::Command::new("ip")
        .args(["-n", &net.hosts[1].ns, "link", "set", "eth0", "up"])
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    println!("host 1 back {:.1} s after the cut", cut.elapsed().as_secs_f64());
    let ended = wait_all(vec![job], Duration::from_secs(30));
    assert!(!ended[0].killed, "mpirun did not end after host 1 came back:\n{}", ended[0].output);
    assert!(!ended[0].success, "the cut job must fail:\n{}", ended[0].output);
    println!("the cut job ended {:.1} s after the cut", cut.elapsed().as_secs_f64());

    // The job again, as its script would start it: from the latest valid checkpoint.
    let mut again = args.clone();
    again.push("checkpoint.resume=latest".into());
    let out = finish(mpirun(&net, d, "resumed-out", &again, &[]), "the resumed run");
    let want = format!("step-{HALT_AFTER:06} (step {HALT_AFTER}, epoch ");
    let said = rank_text(d, "resumed-out", 0);
    assert!(said.lines().any(|l| l.contains("resuming from ") && l.contains(&want)), "{want}:\n{out}");
    assert_same_run(&d.join("reference"), &d.join("cut"));
}
