//! Process-level resume: a run killed (SIGKILL) after a checkpoint, or stopped by SIGTERM,
//! or killed in the middle of writing a checkpoint, continues with `--resume` to the very
//! losses and final weights of a run that never stopped; the same under `oxtrain launch` with
//! two shm ranks. And `oxtrain export` of what such a run saved.

#[path = "resume_support/mod.rs"]
mod support;
use support::*;

#[test]
fn sigkill_after_a_checkpoint_then_resume_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let every = format!("checkpoint.every_steps={}", STEPS / 2);
    run_ok(d, &train_args(d, "reference", &[&every]), &[]);

    // Killed at step 8, two steps after the checkpoint of step 6 was committed.
    let args = train_args(d, "killed", &[&every]);
    let mut w = start(d, &args, &[("OXTRAIN_TEST_HALT_AFTER_STEP", "8".into())]);
    let halted = w.wait_for("halted after step 8", 1);
    assert!(d.join("killed/checkpoints/step-000006/manifest.json").is_file());
    sigkill(pid_in(&halted[0]));
    let (status, _) = w.finish();
    assert!(!status.success());

    let mut resume = args.clone();
    resume.push("--resume".into());
    let out = run_ok(d, &resume, &[]);
    assert!(out.contains("resuming from") && out.contains("step-000006 (step 6, epoch 1)"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("killed"));

    // Resumed once more, from the end: nothing to train, said so, and no made-up throughput
    // (units trained before the stop over this process's seconds) or NaN loss.
    let out = run_ok(d, &resume, &[]);
    assert!(out.contains(&format!("the checkpoint of step {STEPS} is the end of this run")), "{out}");
    assert!(out.contains("nothing left to train (raise train.epochs or train.steps"), "{out}");
    assert!(!out.contains("NaN") && !out.contains("/s,"), "{out}");
}

#[test]
fn sigterm_saves_exits_0_and_the_run_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &train_args(d, "reference", &[]), &[]);

    // No periodic checkpoint: the only one is the save that SIGTERM asks for.
    let args = train_args(d, "preempted", &[]);
    let mut w = start(d, &args, &[("OXTRAIN_TEST_HALT_AFTER_STEP", "5".into())]);
    let halted = w.wait_for("halted after step 5", 1);
    // SAFETY: kill(2) on the child this test started.
    assert_eq!(unsafe { libc::kill(pid_in(&halted[0]), libc::SIGTERM) }, 0);
    let (status, out) = w.finish();
    assert!(status.success(), "a preempted run exits 0: {status}\n{out}");
    assert!(out.contains("stopped after 6 steps: SIGTERM/SIGINT: saved the checkpoint of step 6"), "{out}");
    let hint = format!("continue with `oxtrain {} --resume`", args.join(" "));
    assert!(out.contains(&hint), "the message says how to go on: {out}");
    assert!(!support::final_weights(&d.join("preempted")).exists(), "a stopped run has no final model");

    let out = run_ok(d, &[args, vec!["--resume=latest".into()]].concat(), &[]);
    assert!(out.contains("step-000006 (step 6, epoch 1)"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("preempted"));
}

#[test]
fn killed_inside_a_checkpoint_write_resumes_from_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &train_args(d, "reference", &[]), &[]);

    // Checkpoints at steps 4 and 8; the write of step 8 stops at a random fraction of its
    // bytes (at the latest just before its manifest) and the process is killed there.
    let fraction = unit_from(seed());
    println!("pausing the write of step 8 at {fraction:.3} of its bytes");
    let args = train_args(d, "torn", &["checkpoint.every_steps=4"]);
    let mut w = start(d, &args, &[("OXTRAIN_TEST_PAUSE_CHECKPOINT", format!("8:{fraction}"))]);
    let paused = w.wait_for("paused writing the checkpoint of step 8", 1);
    sigkill(pid_in(&paused[0]));
    w.finish();
    let ckpts = d.join("torn/checkpoints");
    assert!(!ckpts.join("step-000008").exists(), "the torn write was not committed");

    let out = run_ok(d, &[args, vec!["--resume".into()]].concat(), &[]);
    let skipped =
        out.lines().find(|l| l.starts_with("skipped checkpoint")).unwrap_or_else(|| panic!("{out}"));
    assert!(skipped.contains(".step-000008.tmp-") && skipped.contains("partial"), "{skipped}");
    assert!(out.contains("step-000004 (step 4, epoch 1)"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("torn"));
    // The new writer cleared the torn temporary directory and saved step 8 afresh.
    let names: Vec<String> =
        std::fs::read_dir(&ckpts).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert!(!names.iter().any(|n| n.contains(".tmp-")), "{names:?}");
    assert!(ckpts.join("step-000008/manifest.json").is_file(), "{names:?}");
}

#[test]
fn resume_of_a_corrupt_checkpoint_names_the_file_and_latest_with_none_starts_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // resume = "latest" in an empty folder: a fresh start, said so.
    let args = train_args(d, "run", &["checkpoint.every_steps=6"]);
    let out = run_ok(d, &[args.clone(), vec!["--resume".into()]].concat(), &[]);
    assert!(out.contains("no complete checkpoint in") && out.contains("starting from step 0"), "{out}");

    // Resuming with another config goes on, but says what differs.
    let out = run_ok(d, &[args.clone(), vec!["optim.lr=0.001".into(), "--resume".into()]].concat(), &[]);
    assert!(out.contains("step-000012 (step 12, epoch 2)"), "{out}");
    assert!(out.contains("note: this run's config differs from the checkpoint's in optim.lr;"), "{out}");

    // Every committed checkpoint corrupt: refused, naming each file, never a silent restart.
    for step in ["step-000006", "step-000012"] {
        let f = d.join("run/checkpoints").join(step).join("optimizer.safetensors");
        let mut bytes = std::fs::read(&f).unwrap();
        let i = bytes.len() / 2;
        bytes[i] ^= 0x40;
        std::fs::write(&f, bytes).unwrap();
    }
    let (status, out) = start(d, &[args.clone(), vec!["--resume".into()]].concat(), &[]).finish();
    assert!(!status.success(), "{out}");
    assert!(out.contains("step-000012") && out.contains("optimizer.safetensors"), "{out}");
    assert!(out.contains("no valid checkpoint in"), "{out}");

    // A named directory that does not exist.
    let (status, out) = start(d, &[args, vec!["--resume".into(), "nowhere".into()]].concat(), &[]).finish();
    assert!(!status.success() && out.contains("nowhere"), "{out}");
}

/// `oxtrain launch` of `args` as 2 shm ranks on `port`.
fn shm_launch(port: u16, args: Vec<String>) -> Vec<String> {
    let head =
        ["launch", "--nproc-per-node", "2", "--backend", "shm", "--master-port", &port.to_string(), "--"];
    head.iter().map(|s| s.to_string()).chain(args).collect()
}

#[test]
fn two_shm_ranks_killed_after_a_checkpoint_resume_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let every = format!("checkpoint.every_steps={}", STEPS / 2);
    run_ok(d, &shm_launch(29811, train_args(d, "reference", &[&every])), &[]);

    let args = train_args(d, "killed", &[&every]);
    let mut w = start(d, &shm_launch(29812, args.clone()), &[("OXTRAIN_TEST_HALT_AFTER_STEP", "8".into())]);
    let halted = w.wait_for("halted after step 8", 2);
    let ckpts = d.join("killed/checkpoints");
    assert!(
        ckpts.join("step-000006/manifest.json").is_file()
            && ckpts.join("step-000006.rank-1/rank-1.json").is_file()
    );
    for line in &halted {
        sigkill(pid_in(line));
    }
    let (status, _) = w.finish();
    assert!(!status.success(), "the launcher reports its killed workers");

    let out = run_ok(d, &shm_launch(29813, [args, vec!["--resume".into()]].concat()), &[]);
    assert!(out.contains("DDP rank 0 of 2 (shm)") && out.contains("step-000006 (step 6, epoch 2)"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("killed"));

    // The same checkpoint with one rank: taken, its data position re-dealt to one rank
    // (train/tests/reshard.rs follows such runs step by step).
    let one = train_args(d, "killed", &[&every, "checkpoint.resume=latest"]);
    let out = run_ok(d, &one, &[]);
    assert!(out.contains("resuming 2 ranks' checkpoint on 1"), "{out}");
}

/// ZeRO-1 (`ddp.shard_optimizer`): each rank saves its own shard of the optimizer state in its
/// part, and a run killed after a checkpoint resumes bit-identical to the undisturbed one.
#[test]
fn zero_1_ranks_save_their_shards_and_resume_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let every = format!("checkpoint.every_steps={}", STEPS / 2);
    let zero = "ddp.shard_optimizer=true";
    let out = run_ok(d, &shm_launch(29821, train_args(d, "reference", &[&every, zero])), &[]);
    assert!(out.contains("ZeRO-1"), "the start line says the optimizer is sharded: {out}");

    let args = train_args(d, "killed", &[&every, zero]);
    let mut w = start(d, &shm_launch(29822, args.clone()), &[("OXTRAIN_TEST_HALT_AFTER_STEP", "8".into())]);
    let halted = w.wait_for("halted after step 8", 2);
    let ckpts = d.join("killed/checkpoints");
    for part in ["step-000006", "step-000006.rank-1"] {
        assert!(ckpts.join(part).join("optimizer.safetensors").is_file(), "{part} holds its rank's shard");
    }
    for line in &halted {
        sigkill(pid_in(line));
    }
    let (status, _) = w.finish();
    assert!(!status.success(), "the launcher reports its killed workers");
    let out = run_ok(d, &shm_launch(29823, [args, vec!["--resume".into()]].concat()), &[]);
    assert!(out.contains("step-000006 (step 6, epoch 2)"), "{out}");
    assert_same_run(&d.join("reference"), &d.join("killed"));
}

#[test]
fn export_writes_the_model_of_a_checkpoint_for_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &train_args(d, "run", &["checkpoint.every_steps=6"]), &[]);
    let ckpts = d.join("run/checkpoints");
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .current_dir(d)
        .args(["export", "--checkpoint", "run/checkpoints/step-000006", "--out", "out/model.safetensors"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{stdout}{}", String::from_utf8_lossy(&r.stderr));
    assert!(stdout.contains("(step 6)"), "{stdout}");
    let exported = std::fs::read(d.join("out/model.safetensors")).unwrap();
    assert_eq!(exported, std::fs::read(ckpts.join("step-000006/model.safetensors")).unwrap());
    let names: Vec<String> = oxtrain_tensor::safetensors::load_all(d.join("out/model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.iter().any(|n| n == "transformer.wte.weight"), "Hugging Face's GPT-2 names: {names:?}");

    // A checkpoints folder: its newest valid checkpoint; one flipped byte is refused by name.
    let f = ckpts.join("step-000012/model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let i = bytes.len() - 3;
    bytes[i] ^= 1;
    std::fs::write(&f, bytes).unwrap();
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .current_dir(d)
        .args(["export", "--checkpoint", "run/checkpoints/step-000012", "--out", "bad.safetensors"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("model.safetensors"), "{err}");
    assert!(!d.join("bad.safetensors").exists());
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .current_dir(d)
        .args(["export", "--checkpoint", "run/checkpoints", "--out", "newest.safetensors"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success() && stdout.contains("step-000006 (step 6)"), "{stdout}");

    // A run's folder is looked into; a model folder and a missing one get a message of their own.
    let export = |from: &str| {
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
            .current_dir(d)
            .args(["export", "--checkpoint", from, "--out", "x.safetensors"])
            .output()
            .unwrap();
        (
            r.status.success(),
            String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr),
        )
    };
    let (ok, out) = export("run");
    assert!(ok && out.contains("step-000006 (step 6)"), "{out}");
    // The final model folder has a manifest (the checkpoints' writer made it): it exports
    // after its checksums check out.
    let (ok, out) = export("run/checkpoints/final");
    assert!(ok && out.contains("final (step 12)"), "{out}");
    // One written before it had a manifest is a model folder, not a checkpoint: said so.
    std::fs::remove_file(d.join("run/checkpoints/final/manifest.json")).unwrap();
    let (ok, out) = export("run/checkpoints/final");
    assert!(!ok && out.contains("it is a model folder") && !out.contains("--resume"), "{out}");
    let (ok, out) = export("nowhere");
    assert!(!ok && out.contains("nowhere") && out.contains("does not exist"), "{out}");

    let help = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
        .args(["export", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--checkpoint") && help.contains("Examples:"), "{help}");
}

#[test]
fn the_checkpoint_section_shows_its_defaults_and_refuses_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let oxtrain = |args: &[&str]| {
        let r = std::process::Command::new(env!("CARGO_BIN_EXE_oxtrain"))
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap();
        (
            r.status.success(),
            String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr),
        )
    };
    let (ok, out) = oxtrain(&["config", "--print"]);
    assert!(ok, "{out}");
    let section = out.split("[checkpoint]").nth(1).unwrap_or_else(|| panic!("{out}"));
    for key in [
        "dir = \"\"",
        "every_steps = 0",
        "every_minutes = 0.0",
        "keep_last = 3",
        "keep_every = 0",
        "resume = \"\"",
    ] {
        assert!(section.contains(key), "{key} in {section}");
    }
    let (ok, out) = oxtrain(&["config", "--print", "checkpoint.resume=latest", "checkpoint.every_steps=100"]);
    assert!(ok && out.contains("resume = \"latest\"") && out.contains("every_steps = 100"), "{out}");
    for (bad, says) in [
        ("checkpoint.keep_lst=2", "did you mean `keep_last`"),
        ("checkpoint.every_minutes=-1", "checkpoint.every_minutes"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last"),
        ("checkpoint.every_steps=-5", "checkpoint.every_steps"),
    ] {
        let (ok, out) = oxtrain(&["config", "--print", bad]);
        assert!(!ok && out.contains(says), "{bad}: {out}");
    }
}

#[test]
fn a_resnet_with_loader_workers_and_augmentation_resumes_bit_identical() {
    // The state a GPT-2 does not have: batch-norm running statistics, random flips, and
    // loader threads that read ahead of the step the checkpoint is taken at.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = |name: &str| -> Vec<String> {
        [
            "train".to_string(),
            format!("data.cache={}", d.join("cache").display()),
            "data.classes=2".into(),
            "data.per_class=16".into(),
            "data.image_size=16".into(),
            "data.batch_size=8".into(),
            "data.workers=2".into(),
            "data.hflip=0.5".into(),
            "optim.name=sgd".into(),
            "train.steps=6".into(),
            "train.device=cpu".into(),
            "checkpoint.every_steps=3".into(),
            "checkpoint.keep_last=1".into(),
            "log.every_steps=1".into(),
            "log.progress=lines".into(),
            "log.plots=false".into(),
            format!("log.dir={}", d.join(name).display()),
        ]
        .into()
    };
    run_ok(d, &args("reference"), &[]);
    let mut w = start(d, &args("killed"), &[("OXTRAIN_TEST_HALT_AFTER_STEP", "4".into())]);
    let halted = w.wait_for("halted after step 4", 1);
    sigkill(pid_in(&halted[0]));
    w.finish();
    let out = run_ok(d, &[args("killed"), vec!["--resume".into()]].concat(), &[]);
    assert!(out.contains("step-000003 (step 3, epoch 1)"), "{out}");
    let (a, b) = (losses(&d.join("reference")), losses(&d.join("killed")));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b, "the losses differ (step, f64 bits)");
    let weights = |run: &str| std::fs::read(final_weights(&d.join(run))).unwrap();
    assert!(weights("reference") == weights("killed"), "the final weights (with BN statistics) differ");
}

#[test]
fn sigterm_to_the_launcher_saves_one_step_on_both_ranks_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &shm_launch(29831, train_args(d, "reference", &[])), &[]);

    // Only rank 1 waits after step 5; rank 0 is then inside step 6. The launcher passes
    // SIGTERM on to both; they agree to save step 6 (or 7) together and exit 0.
    let args = train_args(d, "preempted", &[]);
    let mut w = start(d, &shm_launch(29832, args.clone()), &[("OXTRAIN_TEST_HALT_AFTER_STEP", "5:1".into())]);
    w.wait_for("halted after step 5", 1);
    // SAFETY: kill(2) on the launcher this test started.
    assert_eq!(unsafe { libc::kill(w.child.id() as i32, libc::SIGTERM) }, 0);
    let (status, out) = w.finish();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "the launcher reports the signal: {out}");
    assert!(out.contains("all exited"), "every worker exited on its own: {out}");
    let stopped = out.lines().find(|l| l.starts_with("stopped after ")).unwrap_or_else(|| panic!("{out}"));
    let step: u64 = stopped["stopped after ".len()..].split(' ').next().unwrap().parse().unwrap();
    let ckpts = d.join("preempted/checkpoints");
    let part = |name: String| ckpts.join(name).join("manifest.json").is_file();
    assert!(part(format!("step-{step:06}")) && part(format!("step-{step:06}.rank-1")), "{out}");

    // The hint is the command that continues the run: the launcher's, with --resume added
    // (a lone `oxtrain train --resume` refuses a checkpoint of two ranks). Run as printed, on
    // another port.
    let hint = stopped.split("continue with `").nth(1).and_then(|h| h.strip_suffix('`'));
    let hint = hint.unwrap_or_else(|| panic!("no command in {stopped:?}"));
    let words: Vec<String> = hint.split(' ').map(String::from).collect();
    assert_eq!(words[..3], ["oxtrain", "launch", "--nproc-per-node"], "{hint}");
    assert_eq!(words.last().unwrap(), "--resume", "{hint}");
    let again: Vec<String> = words[1..].iter().map(|w| w.replace("29832", "29833")).collect();
    let out = run_ok(d, &again, &[]);
    assert!(out.contains(&format!("step-{step:06} (step {step},")), "{out}");
    assert_same_run(&d.join("reference"), &d.join("preempted"));
}

#[test]
fn timed_saves_under_ddp_are_of_the_same_step_on_every_rank() {
    // Every 3 ms by each rank's own clock: without the vote over ranks, rank 0 and rank 1
    // would save at different steps and no checkpoint would have both parts.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = train_args(d, "timed", &["checkpoint.every_minutes=0.00005", "checkpoint.keep_last=100"]);
    let head = ["launch", "--nproc-per-node", "2", "--backend", "shm", "--master-port", "29841", "--"];
    run_ok(d, &head.iter().map(|s| s.to_string()).chain(args).collect::<Vec<_>>(), &[]);
    let ckpts = d.join("timed/checkpoints");
    let mut steps = vec![];
    for e in std::fs::read_dir(&ckpts).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(step) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) {
            steps.push(step);
            let dir = ckpts.join(&name);
            let m = oxtrain::checkpoint::verify_checkpoint(&dir).unwrap();
            assert!(m.is_ok(), "{name}: {:?}", m.err());
        }
    }
    assert!(steps.contains(&(STEPS as u64)), "the end is saved: {steps:?}");
    assert!(steps.len() >= 3, "timed saves besides the end: {steps:?}");
    let found = oxtrain::checkpoint::latest_valid(&ckpts).unwrap();
    assert_eq!(found.step(), Some(STEPS as u64));
    assert!(found.skipped.is_empty(), "{found}");
}
