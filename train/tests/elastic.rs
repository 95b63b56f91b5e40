//! `oxtrain launch --max-restarts`: a worker SIGKILLed mid-run makes the launcher stop the
//! other, start both again from the latest valid checkpoint, and the run ends with the losses
//! and final weights of a run that was never disturbed.

#[path = "resume_support/mod.rs"]
mod support;
use support::*;

fn launch(port: u16, extra: &[&str], args: Vec<String>) -> Vec<String> {
    let port = port.to_string();
    let mut head = vec!["launch", "--nproc-per-node", "2", "--backend", "shm", "--master-port", &port];
    head.extend(extra);
    head.push("--");
    head.iter().map(|s| s.to_string()).chain(args).collect()
}

#[test]
fn a_killed_worker_is_restarted_from_the_checkpoint_and_the_run_ends_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &launch(29821, &[], train_args(d, "reference", &[])), &[]);

    // Rank 1 stops after a step picked at random between the checkpoint of step 4 and the
    // next one (the seed is printed) and is killed there; rank 0 is then waiting for it inside
    // the next step's all-reduce.
    let kill_after = 5 + seed() % 3;
    let args = train_args(d, "elastic", &["checkpoint.every_steps=4"]);
    let cmd = launch(29822, &["--max-restarts", "2", "--stop-timeout", "1"], args);
    let mut w = start(d, &cmd, &[("OXTRAIN_TEST_HALT_AFTER_STEP", format!("{kill_after}:1"))]);
    let halted = w.wait_for(&format!("halted after step {kill_after}"), 1);
    assert!(halted[0].contains("rank 1"), "{halted:?}");
    sigkill(pid_in(&halted[0]));
    let (status, out) = w.finish();
    assert!(status.success(), "the restarted run finishes ({status}):\n{out}");
    let restart = out.lines().find(|l| l.contains("restart 1 of 2")).unwrap_or_else(|| panic!("{out}"));
    assert!(restart.contains("worker 1 (rank 1) was killed by signal 9"), "{restart}");
    assert!(out.contains("resuming from") && out.contains("step-000004 (step 4, epoch 1)"), "{out}");
    assert!(!out.contains("restart 2 of 2"), "one restart was enough: {out}");
    assert_same_run(&d.join("reference"), &d.join("elastic"));
}

#[test]
fn without_restarts_left_the_launch_fails_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A worker that always fails: the first start and one restart, then the launch gives up.
    let cmd: Vec<String> =
        ["launch", "--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "1", "--", "sh", "-c"]
            .iter()
            .map(|s| s.to_string())
            .chain(["echo start $TORCHELASTIC_RESTART_COUNT; [ $LOCAL_RANK = 0 ] && exit 3; exec sleep 30"
                .to_string()])
            .collect();
    let (status, out) = start(d, &cmd, &[]).finish();
    assert_eq!(status.code(), Some(3), "{out}");
    // Worker 1 may be stopped before its shell prints (a loaded machine), so the launcher's
    // own words say that both were started again.
    assert!(out.lines().any(|l| l == "start 1"), "restarted once: {out}");
    assert!(out.contains("starting all 2 workers again"), "{out}");
    assert!(out.contains("restart 1 of 1"), "{out}");
    assert!(out.contains("after 1 restart(s)"), "{out}");
}

#[test]
fn with_min_nproc_a_lost_worker_stays_lost_and_the_run_goes_on_with_fewer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 112 samples: the checkpoint of step 6 is inside an epoch, at 24 samples per rank (72 in
    // all), which 2 ranks split evenly.
    std::fs::write(d.join("corpus.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    let args = train_args(d, "shrunk", &["checkpoint.every_steps=6", "ddp.shard_optimizer=true"]);
    let head = ["launch", "--nproc-per-node", "3", "--backend", "shm", "--master-port", "29826"];
    let flags = ["--max-restarts", "1", "--min-nproc", "2", "--stop-timeout", "1", "--"];
    let cmd: Vec<String> = head.iter().chain(&flags).map(|s| s.to_string()).chain(args).collect();
    let mut w = start(d, &cmd, &[("OXTRAIN_TEST_HALT_AFTER_STEP", "8:2".into())]);
    let halted = w.wait_for("halted after step 8", 1);
    assert!(halted[0].contains("rank 2"), "{halted:?}");
    sigkill(pid_in(&halted[0]));
    let (status, out) = w.finish();
    assert!(status.success(), "the run goes on with two workers ({status}):\n{out}");
    let restart = out.lines().find(|l| l.contains("restart 1 of 1")).unwrap_or_else(|| panic!("{out}"));
    assert!(restart.contains("worker 2 (rank 2) was killed by signal 9"), "{restart}");
    assert!(restart.contains("continuing with 2 workers (--min-nproc 2)"), "{restart}");
    assert!(out.contains("resuming 3 ranks' checkpoint on 2") && out.contains("step-000006"), "{out}");
    let steps: Vec<u64> = losses(&d.join("shrunk")).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, (1..=STEPS as u64).collect::<Vec<_>>(), "every step logged once");
    let manifest = d.join(format!("shrunk/checkpoints/step-{STEPS:06}/manifest.json"));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    assert_eq!(manifest["world_size"], 2, "the last checkpoint was written by the two workers left");
    assert!(final_weights(&d.join("shrunk")).is_file());
}

#[test]
fn min_nproc_is_refused_where_it_cannot_act() {
    let dir = tempfile::tempdir().unwrap();
    let run = |flags: &[&str]| {
        let cmd: Vec<String> = ["launch", "--nproc-per-node", "2"]
            .iter()
            .chain(flags)
            .chain(&["--", "true"])
            .map(|s| s.to_string())
            .collect();
        let (status, out) = start(dir.path(), &cmd, &[]).finish();
        assert!(!status.success(), "{flags:?}: {out}");
        out
    };
    assert!(run(&["--min-nproc", "3", "--max-restarts", "1"]).contains("between 1 and --nproc-per-node 2"));
    assert!(run(&["--min-nproc", "1"]).contains("give --max-restarts too"));
    let out = run(&["--min-nproc", "1", "--max-restarts", "1", "--nnodes", "2"]);
    assert!(out.contains("use it with one node"), "{out}");
}
