//! Write-behind: a file that starts the disk writing each window of bytes as soon as it is in
//! the page cache, so the final fsync waits only for the last window.
//!
//! A plain `write` then `fsync` (what `dd conv=fsync` does) runs in two phases: copying into
//! the page cache, then flushing it all. Asking the kernel to start writeback of every full
//! window (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait) overlaps the two, so
//! a checkpoint takes about the longer of the two instead of their sum. Durability still comes
//! from the `sync_all` at the end: the hint only starts work earlier, and its errors are left
//! to that fsync to report.

use std::fs::File;
use std::io::Write;

/// Bytes between writeback starts: large enough for the disk's requests, small enough that
/// the first starts early.
const WINDOW: u64 = 8 << 20;

pub(crate) struct WriteBehind {
    pub file: File,
    written: u64,
    /// Everything before this offset has had its writeback started.
    started: u64,
}

impl WriteBehind {
    pub fn new(file: File) -> WriteBehind {
        WriteBehind { file, written: 0, started: 0 }
    }

    #[cfg(target_os = "linux")]
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        let len = self.written - self.started;
        // SAFETY: a valid open descriptor and a byte range of it; the call only schedules I/O.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                self.started as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.started = self.written;
    }

    #[cfg(not(target_os = "linux"))]
    fn start_writeback(&mut self) {
        self.started = self.written;
    }
}

impl Write for WriteBehind {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WINDOW {
            self.start_writeback();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}
