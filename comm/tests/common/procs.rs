//! Multi-process tests: the test binary re-runs itself as each rank, selected by
//! `OXTRAIN_TEST_ROLE`; the parent hosts the store and collects the ranks' results.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct RankOutput {
    pub rank: usize,
    pub success: bool,
    pub stderr: String,
}

/// Runs `world` ranks of `role` (test function `child_test`) and returns how each ended.
pub fn spawn_ranks(child_test: &str, role: &str, world: usize, env: &[(&str, String)]) -> Vec<RankOutput> {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let mut c = Command::new(&exe);
            c.args(["--exact", child_test, "--nocapture", "--include-ignored", "--test-threads=1", "-q"])
                .env("OXTRAIN_TEST_ROLE", role)
                .env("OXTRAIN_TEST_RANK", rank.to_string())
                .env("OXTRAIN_TEST_WORLD", world.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    children
        .into_iter()
        .enumerate()
        .map(|(rank, mut child)| {
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let out = child.wait_with_output().unwrap();
            RankOutput {
                rank,
                success: out.status.success(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        })
        .collect()
}

/// The role, rank and world of this process, when it is a child.
pub fn child_role() -> Option<(String, usize, usize)> {
    let role = std::env::var("OXTRAIN_TEST_ROLE").ok()?;
    let num = |k: &str| std::env::var(k).unwrap().parse().unwrap();
    Some((role, num("OXTRAIN_TEST_RANK"), num("OXTRAIN_TEST_WORLD")))
}

pub fn assert_all_succeeded(outs: &[RankOutput]) {
    for o in outs {
        assert!(o.success, "rank {} failed:\n{}", o.rank, o.stderr);
    }
}
