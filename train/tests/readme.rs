//! The README's two commands. The main one, exactly as written, on the CPU: it must reach 90%
//! validation accuracy. (Slow: a real training run; under the README's test command, which
//! builds with the release profile too, its build is already done.)

mod common;
use std::process::Command;

const MAIN: &str = "cargo run --release -p oxtrain -- train";
/// Release, so that [`MAIN`] run by this test finds its binary built by the same command.
const TESTS: &str = "cargo test --workspace --release";

#[test]
fn the_readme_shows_the_command_this_test_runs() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).unwrap();
    assert!(readme.contains(MAIN), "the README's main command changed: update this test");
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).unwrap();
    assert!(readme.contains(TESTS), "the README's test command changed: update this test");
    let ci = std::fs::read_to_string(common::repo().join(".ci/run")).unwrap();
    let runs_it = ci.lines().any(|line| line.trim() == TESTS);
    assert!(runs_it, ".ci/run no longer runs the README's test command {TESTS:?} on a line of its own");
}

#[test]
fn the_main_command_reaches_90_percent() {
    let mut words = MAIN.split_whitespace();
    assert_eq!(words.next(), Some("cargo"));
    // A fresh start refuses a folder that holds a run (--resume or --overwrite decide): clear
    // the one this command wrote the last time this test ran here.
    let _ = std::fs::remove_dir_all(common::repo().join("runs/oxtrain"));
    let out = Command::new(env!("CARGO"))
        .args(words)
        .current_dir(common::repo())
        // The CPU, as in CI, even when this machine has a GPU.
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = stdout.lines().last().unwrap_or_default();
    let acc: f64 = line
        .split([',', ';'])
        .map(str::trim)
        .find_map(|part| part.strip_prefix("accuracy ").and_then(|a| a.strip_suffix('%')))
        .unwrap_or_else(|| panic!("no accuracy in the summary line {line:?}"))
        .parse()
        .unwrap();
    eprintln!("{line}");
    assert!(acc >= 90.0, "{line}");
}
