//! Exact resume across a SIGKILL, and a kill inside a write: the test binary re-runs itself as
//! the training process (selected by `OXTRAIN_TEST_ROLE`), so each run has its own default
//! generator and can die for real.

#[path = "checkpoint/run.rs"]
mod run;

use run::{train, Outcome, Plan, STEPS};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROLE: &str = "OXTRAIN_TEST_ROLE";
const DIR: &str = "OXTRAIN_TEST_DIR";
const KILL_AT: &str = "OXTRAIN_TEST_KILL_AT_BYTE";

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oxtrain-ckpt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs this test binary's `test` as `role` on `dir`.
fn child(test: &str, role: &str, dir: &Path, env: &[(&str, String)]) -> Output {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture", "--test-threads=1", "-q"]).env(ROLE, role).env(DIR, dir);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn outcome(out: &Output, what: &str) -> Outcome {
    let stdout = String::from_utf8_lossy(&out.stdout);
    Outcome::parse(&stdout).unwrap_or_else(|| {
        panic!("{what}: no outcome; stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr))
    })
}

fn was_sigkilled(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(libc::SIGKILL)
}

/// Runs the role this process was started for; false in the parent.
fn run_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else { return false };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let half = STEPS / 2;
    let plan = |save_at, die_after_save, die_inside_save, resume| Plan {
        dir: &dir,
        save_at,
        die_after_save,
        die_inside_save,
        resume,
    };
    let outcome = match role.as_str() {
        "uninterrupted" => train(&plan(&[], None, None, false)),
        "die-after-half" => train(&plan(&[half], Some(half), None, false)),
        "die-inside-write" => {
            let at = std::env::var(KILL_AT).unwrap().parse().unwrap();
            train(&plan(&[3], None, Some((7, at)), false))
        }
        "resume" => train(&plan(&[], None, None, true)),
        "preempt" => preempt(&dir),
        other => panic!("unknown role {other}"),
    };
    outcome.print();
    true
}

#[test]
fn resume_after_sigkill_is_bit_identical() {
    if run_role() {
        return;
    }
    let test = "resume_after_sigkill_is_bit_identical";
    let dir = fresh_dir("sigkill");
    let full = outcome(&child(test, "uninterrupted", &dir, &[]), "the uninterrupted run");
    assert_eq!(full.losses.len(), STEPS as usize);

    let died = child(test, "die-after-half", &dir, &[]);
    assert!(was_sigkilled(&died), "the first run should have been SIGKILLed: {:?}", died.status);
    let before = outcome(&died, "the run killed after its checkpoint");
    let resumed_out = child(test, "resume", &dir, &[]);
    let resumed = outcome(&resumed_out, "the resumed run");
    let stderr = String::from_utf8_lossy(&resumed_out.stderr);
    assert!(stderr.contains("resuming from") && stderr.contains("step-000005"), "{stderr}");

    let half = (STEPS / 2) as usize;
    assert_eq!(before.losses, full.losses[..half], "losses before the kill");
    assert_eq!(resumed.first_step, STEPS / 2);
    assert_eq!(resumed.losses, full.losses[half..], "every loss after the resume, bit for bit");
    assert_eq!(resumed.weights, full.weights, "the final weights, bit for bit");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_kill_inside_a_write_falls_back_to_the_previous_checkpoint() {
    if run_role() {
        return;
    }
    let test = "a_kill_inside_a_write_falls_back_to_the_previous_checkpoint";
    // The uninterrupted run's checkpoint at step 3 has the same file sizes (to a few bytes of
    // JSON) as the one at step 7 that the dying run writes: pick a byte inside it.
    let dir = fresh_dir("mid-write");
    let full_dir = fresh_dir("mid-write-reference");
    let full = outcome(&child(test, "uninterrupted", &full_dir, &[]), "the uninterrupted run");
    let sized = child(test, "die-after-half", &full_dir, &[]);
    assert!(was_sigkilled(&sized));
    let manifest = oxtrain::checkpoint::verify_checkpoint(&full_dir.join("step-000005")).unwrap().unwrap();
    let total: u64 = manifest.files.iter().map(|f| f.bytes).sum::<u64>() - 16;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let at = 1 + seed % total;
    println!("killing the writer at byte {at} of about {total} (seed {seed})");

    let died = child(test, "die-inside-write", &dir, &[(KILL_AT, at.to_string())]);
    let stdout = String::from_utf8_lossy(&died.stdout);
    assert!(!stdout.contains("WRITE COMPLETED"), "the write finished before byte {at}");
    assert!(was_sigkilled(&died), "{:?}\n{}", died.status, String::from_utf8_lossy(&died.stderr));
    let partial: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".step-000007.tmp-"))
        .collect();
    assert_eq!(partial.len(), 1, "the unfinished write should be left as a temporary directory");

    let found = oxtrain::checkpoint::latest_valid(&dir).unwrap();
    assert_eq!(found.step(), Some(3), "{found}");
    let report = found.to_string();
    assert!(report.contains("skipped checkpoint") && report.contains("partial"), "{report}");

    let resumed_out = child(test, "resume", &dir, &[]);
    let resumed = outcome(&resumed_out, "the run resumed from step 3");
    let stderr = String::from_utf8_lossy(&resumed_out.stderr);
    assert!(stderr.contains("skipped checkpoint") && stderr.contains("step-000003"), "{stderr}");
    assert_eq!(resumed.losses, full.losses[3..], "losses after resuming from the older checkpoint");
    assert_eq!(resumed.weights, full.weights);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(full_dir);
}

/// Steps until SIGTERM arrives, then saves, waits for the write and exits 0, as a trainer
/// preempted by Slurm should.
fn preempt(dir: &Path) -> ! {
    use oxtrain::checkpoint::{CheckpointConfig, Checkpointer, SavePolicy, SaveReason, SaveTriggers};
    let model = oxtrain_nn::Linear::new(4, 2, oxtrain_tensor::Device::Cpu).unwrap();
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(dir)).unwrap();
    let mut policy =
        SavePolicy::new(SaveTriggers { every_steps: None, every: None, at_end: true, on_signal: true })
            .unwrap();
    for step in 1..=20_000 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        if step == 3 {
            println!("READY");
        }
        if policy.due(step) == Some(SaveReason::Signal) {
            let snap = ckpt.snapshot(step, 0).unwrap().model(&model).unwrap();
            ckpt.save(snap).unwrap();
            ckpt.finish().unwrap();
            eprintln!("saved step {step} after SIGTERM");
            std::process::exit(0);
        }
    }
    std::process::exit(2)
}

#[test]
fn sigterm_saves_and_exits_zero() {
    if run_role() {
        return;
    }
    use std::io::BufRead;
    let dir = fresh_dir("preempt");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigterm_saves_and_exits_zero", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, "preempt")
        .env(DIR, &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap() == "READY"), "the child never got going");
    // SAFETY: signals the child this test started, by its pid.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let status = c.wait().unwrap();
    assert!(status.success(), "a preempted run should save and exit 0, got {status:?}");
    let found = oxtrain::checkpoint::latest_valid(&dir).unwrap();
    assert!(found.step().is_some_and(|s| s >= 3), "{found}");
    let _ = std::fs::remove_dir_all(dir);
}
