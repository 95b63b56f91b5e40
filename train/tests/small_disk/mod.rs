//! A small tmpfs mounted for one test, for the disk-full tests. Mounting needs root (or
//! CAP_SYS_ADMIN); where it cannot mount the test is skipped with the reason, except under
//! `CI=true`, where it fails, so that a CI that cannot run the test says so.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a folder, unmounted and its folder removed when dropped.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` at `dir` (created if absent); None, with the reason printed,
    /// where this process may not mount (not root, a container without CAP_SYS_ADMIN).
    /// Panics under `CI=true` instead of returning None.
    pub fn mount_or_skip(test: &str, dir: &Path, bytes: usize) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).unwrap();
        let why = match Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
        {
            Ok(out) if out.status.success() => return Some(SmallDisk(dir.to_path_buf())),
            Ok(out) => String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("").to_string(),
            Err(e) => format!("cannot run `mount`: {e}"),
        };
        let why = format!("cannot mount a small tmpfs at {} (needs root): {why}", dir.display());
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("{test}: CI=true but the disk-full test cannot run: {why}");
        }
        eprintln!("SKIPPED {test}: {why}");
        None
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
