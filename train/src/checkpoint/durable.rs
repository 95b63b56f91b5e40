//! Writing one file's bytes to disk, durably and fast.
//!
//! - Page-aligned memory (a checkpoint's file images) goes to the device with O_DIRECT: the
//!   device reads our memory, and the copy into the page cache, the page cache's bookkeeping
//!   and its later writeback (most of a buffered write's CPU time) never happen. Large
//!   requests from two threads keep several in flight.
//! - Everything else (small files, the last partial block, file systems that refuse O_DIRECT)
//!   goes through the page cache with write-behind: writeback of each window starts as soon as
//!   it is written (`sync_file_range`, which does not wait), so the final fsync waits only for
//!   the last window instead of the whole file.
//!
//! Either way the file is fsynced at the end. That, not O_DIRECT, is what makes it durable:
//! O_DIRECT leaves the device's write cache and the file's size and extents unflushed, which
//! is exactly what the fsync flushes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The alignment O_DIRECT needs of offsets, lengths and memory (a page: enough for any
/// common device's logical block).
const DIRECT_ALIGN: usize = super::image::ALIGN;
/// Files smaller than this are written through the page cache: O_DIRECT gains nothing there.
const DIRECT_MIN: usize = 1 << 20;
/// Bytes per O_DIRECT request: the kernel splits it into the device's largest requests and
/// keeps them all in flight.
const DIRECT_PIECE: usize = 16 << 20;
/// Threads writing one file's O_DIRECT pieces side by side, so one's request is in flight
/// while the other's is being submitted.
const DIRECT_THREADS: usize = 2;
/// Bytes between write-behind starts on the buffered path: large enough for the disk's
/// requests, small enough that the first starts early.
const WINDOW: usize = 8 << 20;

/// Writes `bytes` as the whole content of the empty file `file` and fsyncs it. `report` is
/// called with the number of bytes written so far, from the writing threads.
pub(crate) fn write_durably(file: &File, bytes: &[u8], report: &(dyn Fn(u64) + Sync)) -> io::Result<()> {
    let aligned = bytes.as_ptr().align_offset(DIRECT_ALIGN) == 0;
    let body = bytes.len() / DIRECT_ALIGN * DIRECT_ALIGN;
    let mut done = 0;
    if aligned && bytes.len() >= DIRECT_MIN && set_direct(file, true).is_ok() {
        preallocate(file, bytes.len() as u64)?;
        match write_direct(file, &bytes[..body], report) {
            Ok(()) => done = body,
            // A file system that accepted the flag but not the requests: start over through
            // the page cache (rewriting what did reach the file is harmless).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
        set_direct(file, false)?;
    }
    write_buffered(file, bytes, done, report)?;
    file.sync_all()
}

/// Writes `bytes` at offset 0 with O_DIRECT, in `DIRECT_PIECE` requests, on `DIRECT_THREADS`
/// threads taking pieces in turn. `bytes` and its length are `DIRECT_ALIGN`-aligned.
fn write_direct(file: &File, bytes: &[u8], report: &(dyn Fn(u64) + Sync)) -> io::Result<()> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let written = AtomicU64::new(0);
    let work = || -> io::Result<()> {
        loop {
            let start = next.fetch_add(DIRECT_PIECE, Ordering::Relaxed);
            if start >= bytes.len() {
                return Ok(());
            }
            let piece = &bytes[start..bytes.len().min(start + DIRECT_PIECE)];
            file.write_all_at(piece, start as u64)?;
            report(written.fetch_add(piece.len() as u64, Ordering::Relaxed) + piece.len() as u64);
        }
    };
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..DIRECT_THREADS).map(|_| s.spawn(work)).collect();
        let mine = work();
        helpers.into_iter().map(|h| h.join().expect("an O_DIRECT writer panicked")).fold(mine, Result::and)
    })
}

/// Writes `bytes[from..]` at offset `from` through the page cache, with write-behind.
fn write_buffered(file: &File, bytes: &[u8], from: usize, report: &(dyn Fn(u64) + Sync)) -> io::Result<()> {
    let mut at = from;
    while at < bytes.len() {
        let end = bytes.len().min(at + WINDOW);
        file.write_all_at(&bytes[at..end], at as u64)?;
        start_writeback(file, at, end - at);
        at = end;
        report(at as u64);
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a valid open descriptor with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on { flags | libc::O_DIRECT } else { flags & !libc::O_DIRECT };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn set_direct(_file: &File, _on: bool) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Reserves the file's blocks before the O_DIRECT writes: they then land inside the file's
/// size and may run side by side (writes that extend a file are serialised). A full disk is
/// an error now; a file system without fallocate is simply not preallocated.
#[cfg(target_os = "linux")]
fn preallocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and a byte range; the call only allocates blocks.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSPC) {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn preallocate(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}

/// Starts writeback of a byte range without waiting; its errors are left to the final fsync.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: usize, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor and a byte range of it; the call only schedules I/O.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::image::AlignedBuf;

    /// Bytes that differ from block to block, so a piece written at the wrong offset shows.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    fn written_back(bytes: &[u8]) -> (Vec<u8>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create_new(&path).unwrap();
        let reported = std::sync::atomic::AtomicU64::new(0);
        write_durably(&file, bytes, &|n| {
            reported.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
        })
        .unwrap();
        (std::fs::read(&path).unwrap(), reported.into_inner())
    }

    #[test]
    fn aligned_memory_of_an_odd_length_is_written_exactly() {
        // Several O_DIRECT pieces, then a tail shorter than a block through the page cache.
        let len = 2 * DIRECT_PIECE + 5 * DIRECT_ALIGN + 17;
        let expected = pattern(len);
        let mut buf = AlignedBuf::new(len);
        buf.as_mut_slice()[..len].copy_from_slice(&expected);
        let (back, reported) = written_back(&buf.as_slice()[..len]);
        assert!(back == expected, "the file differs from the bytes written");
        assert_eq!(reported, len as u64, "progress reaches the whole file");
    }

    #[test]
    fn unaligned_and_small_bytes_go_through_the_page_cache() {
        let expected = pattern(DIRECT_MIN + 3 * DIRECT_ALIGN + 1);
        // One byte into a Vec: not page-aligned, so O_DIRECT is not tried.
        let (back, reported) = written_back(&expected[1..]);
        assert!(back == expected[1..], "the file differs from the bytes written");
        assert_eq!(reported, expected.len() as u64 - 1);
        assert_eq!(written_back(b"{}").0, b"{}");
        assert_eq!(written_back(b"").0, b"");
    }
}
