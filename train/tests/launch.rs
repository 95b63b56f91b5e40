//! `oxtrain launch` with workers that report their variables, fail, or wait for a signal.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn oxtrain() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxtrain"))
}

#[test]
fn workers_get_torchruns_variables() {
    let out = oxtrain()
        .args(["launch", "--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--master-port", "29612", "--"])
        .args(["sh", "-c", "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE group=$GROUP_RANK role=$ROLE_RANK/$ROLE_WORLD_SIZE at=$MASTER_ADDR:$MASTER_PORT"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    let want: Vec<String> = (0..3)
        .map(|l| format!("rank={} world=6 local={l}/3 group=1 role={}/6 at=127.0.0.1:29612", 3 + l, 3 + l))
        .collect();
    assert_eq!(lines, want);
}

#[test]
fn a_failing_worker_stops_the_others_with_a_message() {
    let start = Instant::now();
    let out = oxtrain()
        .args(["launch", "--nproc-per-node", "2", "--stop-timeout", "5", "--"])
        .args(["sh", "-c", "if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 60"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("worker 1 (rank 1) exited with status 3; stopping the other workers"), "{err}");
    // Rank 0 would sleep a minute: it was stopped, not waited for.
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
}

#[test]
fn sigterm_is_forwarded_to_every_worker() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'echo $RANK > \"$OUT/term-$RANK\"; exit 0' TERM; echo $RANK > \"$OUT/up-$RANK\"; while :; do sleep 0.1; done";
    let mut child = oxtrain()
        .args(["launch", "--nproc-per-node", "2", "--"])
        .args(["sh", "-c", script])
        .env("OUT", dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let up = |r: usize| dir.path().join(format!("up-{r}")).exists();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(up(0) && up(1)) {
        assert!(Instant::now() < deadline, "workers did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling the launcher we started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("stopped by signal 15: forwarded it to every worker; all exited"), "{err}");
    for r in 0..2 {
        assert!(dir.path().join(format!("term-{r}")).exists(), "worker {r} did not get SIGTERM");
    }
}

#[test]
fn launch_usage_errors_say_what_to_do() {
    let out = oxtrain().args(["launch", "--nproc-per-node", "0", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nproc-per-node must be at least 1"));
    let out =
        oxtrain().args(["launch", "--nproc-per-node", "1", "--", "no-such-program-xyz"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start worker 0 (no-such-program-xyz)"));
}
