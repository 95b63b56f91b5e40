//! `checkpoint.on_save_error`: a checkpoint folder on a disk too small for any checkpoint (a
//! 16 KiB tmpfs the test mounts; skipped where it may not mount, failed there under `CI=true`). "stop" (the default) ends the
//! run with the disk-full error; "continue" warns at each failed save and trains to the end
//! with the same losses as a run that never saved.

mod small_disk;
#[path = "resume_support/mod.rs"]
mod support;
use small_disk::SmallDisk;
use support::*;

#[test]
fn a_full_checkpoint_disk_stops_the_run_or_is_trained_through_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let test = "a_full_checkpoint_disk_stops_the_run_or_is_trained_through_as_configured";
    let Some(disk) = SmallDisk::mount_or_skip(test, &d.join("small"), 16 << 10) else { return };
    let ckpt = format!("checkpoint.dir={}", disk.0.display());
    let common = [ckpt.as_str(), "checkpoint.every_steps=4", "checkpoint.at_end=false"];
    run_ok(d, &train_args(d, "reference", &["checkpoint.at_end=false"]), &[]);

    let (status, out) = start(d, &train_args(d, "stop", &common), &[]).finish();
    assert!(!status.success(), "a failed save stops the run by default:\n{out}");
    assert!(out.contains("not enough disk space"), "the error says why:\n{out}");

    let mut args = common.to_vec();
    args.push("checkpoint.on_save_error=continue");
    let out = run_ok(d, &train_args(d, "continue", &args), &[]);
    let warnings = out.lines().filter(|l| l.contains("a checkpoint was not saved")).count();
    assert!(warnings >= 2, "each failed save is a warning ({warnings}):\n{out}");
    assert!(out.contains("not enough disk space"), "the warning says why:\n{out}");
    assert_eq!(losses(&d.join("reference")), losses(&d.join("continue")), "training went on unchanged");
}
