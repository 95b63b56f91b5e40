//! The ordinary mistakes of a new user are errors that say what is allowed, not panics and not
//! a quiet run to a bad result.

mod common;
use common::oxtrain;

fn refused(args: &[&str], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let r = oxtrain(dir.path(), args);
    assert_eq!(r.code, Some(2), "{args:?}: {}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(expect), "{args:?}: {}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

#[test]
fn impossible_values_are_refused_before_training() {
    refused(
        &["train", "data.batch_size=0"],
        "`data.batch_size` = 0 is not allowed: a batch needs at least one sample",
    );
    refused(&["train", "train.epochs=0"], "`train.epochs` = 0 is not allowed");
    for lr in ["-1", "nan", "1000"] {
        refused(
            &["train", &format!("optim.lr={lr}")],
            "the learning rate must be a finite number in (0, 10]",
        );
    }
    refused(
        &["train", "train.epoch=3"],
        "unknown key `epoch` in section [train] (the command line `train.epoch=3`); did you mean `epochs`?",
    );
    refused(&["train", "model.name=resnet51"], "(did you mean \"resnet50\"?)");
    refused(&["config", "--print", "data.batch_size=-2"], "`data.batch_size` = -2 is not allowed");
}

#[test]
fn a_batch_larger_than_the_data_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache").display().to_string();
    let r = oxtrain(
        dir.path(),
        &[
            "train",
            &format!("data.cache={cache}"),
            "data.classes=2",
            "data.per_class=4",
            "data.image_size=16",
        ],
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains("data.batch_size = 64 on 1 process(es) needs 64 training images per step"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("lower data.batch_size to at most 8"), "{}", r.stderr);
}

#[test]
fn config_print_shows_every_default_and_the_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let r = oxtrain(dir.path(), &["config", "--print", "optim.lr=0.05"]);
    r.ok();
    for section in [
        "[model]",
        "[data]",
        "[optim]",
        "[schedule]",
        "[precision]",
        "[train]",
        "[ddp]",
        "[checkpoint]",
        "[log]",
    ] {
        assert!(r.stdout.contains(section), "{section} missing:\n{}", r.stdout);
    }
    assert!(r.stdout.contains("lr = 0.05") && r.stdout.contains("bucket_cap_mb = 25.0"), "{}", r.stdout);
}

#[test]
fn every_command_says_what_it_does_with_an_example() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in ["train", "eval", "launch", "config"] {
        let r = oxtrain(dir.path(), &[cmd, "--help"]);
        r.ok();
        assert!(
            r.stdout.contains("Examples:") && r.stdout.contains(&format!("oxtrain {cmd}")),
            "{cmd}:\n{}",
            r.stdout
        );
    }
}
