//! The README's main command, exactly as written, on the CPU: it must reach 90% validation
//! accuracy. (Slow: a release build and a real training run; CI runs it like any test.)

mod common;
use std::process::Command;

const MAIN: &str = "cargo run --release -p oxtrain -- train";

#[test]
fn the_readme_shows_the_command_this_test_runs() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).unwrap();
    assert!(readme.contains(MAIN), "the README's main command changed: update this test");
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
