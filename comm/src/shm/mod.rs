//! Backend `shm`: processes of one host share a POSIX shared-memory segment (`shm_open` +
//! `mmap`) that holds the collectives' staging buffers, the phase counters they synchronise
//! with, and the symmetric heap.
//!
//! Rank 0 creates the segment, named after the job's store port, and publishes its name
//! and a run id through the store; the others map it; once all are attached rank 0 unlinks
//! the name, so the memory goes away with the last process even after a crash. A segment
//! that a crashed run left behind (its creator's pid is gone) is removed and replaced.

mod collectives;
mod heap;
mod options;
mod segment;

pub use heap::ShmHeap;
pub use options::ShmOptions;

use crate::bootstrap::TcpStore;
use crate::communicator::CpuCommunicator;
use crate::error::{CommError, Result};
use collectives::ShmEngine;
pub(crate) use segment::{pid_alive, Attachment, Segment, SegmentLayout, MAGIC, VERSION};
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl ShmOptions {
    pub(crate) fn layout(&self, world: usize) -> SegmentLayout {
        // At least a cache line per rank per step, a multiple of 64 bytes.
        let chunk = self.chunk_bytes.max(64 * world).div_ceil(64) * 64;
        SegmentLayout { world, chunk_bytes: chunk, heap_bytes: self.heap_bytes.div_ceil(4096) * 4096 }
    }
}

/// One rank's view of a group on one host: collectives and the symmetric heap.
pub struct ShmWorld {
    pub comm: CpuCommunicator,
    pub heap: ShmHeap,
}

impl ShmWorld {
    pub(crate) fn attach(seg: Arc<Segment>, rank: usize, opts: &ShmOptions) -> Result<ShmWorld> {
        let world = seg.layout.world;
        let backend = seg.backend;
        let attached = Attachment::attach(seg, rank);
        let heap = ShmHeap::new(attached.clone(), opts.comm.timeout);
        let timeout = opts.comm.timeout;
        let comm = CpuCommunicator::spawn(rank, world, backend, &opts.comm, move || {
            Ok(ShmEngine::new(attached, timeout))
        })?;
        Ok(ShmWorld { comm, heap })
    }
}

/// Store keys under which rank 0 publishes the segment.
const KEY_NAME: &str = "oxtrain/shm/name";
const KEY_RUN: &str = "oxtrain/shm/run_id";

/// Joins (rank 0: creates) the segment of this job. Every rank must be on this host.
pub fn connect(rank: usize, world: usize, store: &TcpStore, opts: &ShmOptions) -> Result<ShmWorld> {
    assert!(rank < world, "shm::connect: rank {rank} out of range for world size {world}");
    let layout = opts.layout(world);
    let seg = if rank == 0 {
        let name = opts.name.clone().unwrap_or_else(|| format!("oxtrain-comm-p{}", store.port()));
        sweep_stale_segments();
        let run_id = fresh_run_id();
        let seg = create(&name, layout, run_id)?;
        store.set(KEY_NAME, name.as_bytes())?;
        store.set(KEY_RUN, &run_id.to_le_bytes())?;
        let seg = Arc::new(seg);
        let w = ShmWorld::attach(seg, rank, opts)?;
        let attached = store.barrier(rank, world);
        // Attached or not, the name has served its purpose: the mappings keep the memory.
        let _ = unlink(&name);
        attached?;
        return Ok(w);
    } else {
        let name = String::from_utf8_lossy(&store.get(KEY_NAME)?).into_owned();
        let run = store.get(KEY_RUN)?;
        let run_id = u64::from_le_bytes(run[..8].try_into().unwrap_or([0; 8]));
        Arc::new(open(&name, layout, run_id)?)
    };
    let w = ShmWorld::attach(seg, rank, opts)?;
    store.barrier(rank, world)?;
    Ok(w)
}

fn fresh_run_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = t ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    // splitmix64 finaliser: distinct runs started in the same nanosecond by different pids differ.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn c_name(name: &str) -> CString {
    let n = if name.starts_with('/') { name.to_string() } else { format!("/{name}") };
    CString::new(n).expect("segment name without NUL bytes")
}

fn unlink(name: &str) -> std::io::Result<()> {
    let c = c_name(name);
    // SAFETY: a valid C string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn map(fd: libc::c_int, len: usize, what: &str) -> Result<*mut u8> {
    // SAFETY: mapping a shared-memory file descriptor we own.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(CommError::io(
            format!("shm: mapping {what} ({len} bytes)"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(p as *mut u8)
}

/// What the header of an existing segment says about its creator, when it has one.
fn creator_of(name: &str) -> Option<(u64, u32)> {
    let c = c_name(name);
    // SAFETY: plain POSIX calls on a fd we close.
    unsafe {
        let fd = libc::shm_open(c.as_ptr(), libc::O_RDONLY, 0);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let ok = libc::fstat(fd, &mut st) == 0 && st.st_size as usize >= 4096;
        let mut out = None;
        if ok {
            let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd, 0);
            if p != libc::MAP_FAILED {
                let h = &*(p as *const segment::Header);
                out = Some((h.magic.load(Ordering::Acquire), h.creator_pid));
                libc::munmap(p, 4096);
            }
        }
        libc::close(fd);
        out
    }
}

/// Removes `oxtrain-comm-*` segments whose creating process is gone (left by crashed runs
/// before their ranks had all attached).
pub fn sweep_stale_segments() -> usize {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return 0 };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("oxtrain-comm-") {
            continue;
        }
        let stale = match creator_of(&name) {
            Some((MAGIC, pid)) => !pid_alive(pid),
            // Never finished initialising: stale once it is old enough not to be in creation.
            _ => entry
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| t.elapsed().unwrap_or_default().as_secs() > 60)
                .unwrap_or(false),
        };
        if stale && unlink(&name).is_ok() {
            removed += 1;
        }
    }
    removed
}

fn create(name: &str, layout: SegmentLayout, run_id: u64) -> Result<Segment> {
    let c = c_name(name);
    let len = layout.total_bytes();
    let mut replaced = false;
    let fd = loop {
        // SAFETY: a valid C string.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd >= 0 {
            break fd;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EEXIST) || replaced {
            return Err(CommError::io(format!("shm: creating segment /dev/shm/{name}"), err));
        }
        match creator_of(name) {
            Some((MAGIC, pid)) if pid_alive(pid) && pid != std::process::id() => {
                return Err(CommError::Segment {
                    segment: format!("/dev/shm/{name}"),
                    problem: format!(
                        "belongs to a running process (pid {pid}): another job uses the same MASTER_PORT or \
                         OXTRAIN_SHM_NAME; pick another one"
                    ),
                })
            }
            // Left by a crashed run (its creator is gone) or never initialised: replace it.
            _ => {
                let _ = unlink(name);
                replaced = true;
            }
        }
    };
    let setup = || -> Result<*mut u8> {
        // posix_fallocate reserves the pages now: an over-full /dev/shm is an error here
        // rather than a SIGBUS in the middle of a collective.
        let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        if rc != 0 {
            return Err(CommError::io(
                format!("shm: reserving {len} bytes in /dev/shm for {name} (is /dev/shm big enough? smaller OXTRAIN_SHM_HEAP_BYTES / OXTRAIN_SHM_CHUNK_BYTES help)"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        map(fd, len, name)
    };
    let mapped = setup();
    unsafe { libc::close(fd) };
    let base = match mapped {
        Ok(b) => b,
        Err(e) => {
            let _ = unlink(name);
            return Err(e);
        }
    };
    // SAFETY: a fresh MAP_SHARED mapping of `len` bytes, zero-filled by the kernel.
    let seg = unsafe { Segment::from_mmap(base, len, layout) };
    seg.init_header(run_id);
    Ok(seg)
}

fn open(name: &str, layout: SegmentLayout, run_id: u64) -> Result<Segment> {
    let c = c_name(name);
    // SAFETY: a valid C string.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(CommError::io(
            format!("shm: opening segment /dev/shm/{name} made by rank 0 (are all ranks on one host? use the mpi backend across hosts)"),
            std::io::Error::last_os_error(),
        ));
    }
    let len = layout.total_bytes();
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let size_ok = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_size as usize == len;
    let mapped = if size_ok {
        map(fd, len, name)
    } else {
        Err(CommError::Segment {
            segment: name.to_string(),
            problem: format!(
                "has {} bytes, this rank expects {len}: ranks disagree on the world size or on \
                 OXTRAIN_SHM_CHUNK_BYTES / OXTRAIN_SHM_HEAP_BYTES",
                st.st_size
            ),
        })
    };
    unsafe { libc::close(fd) };
    let seg = unsafe { Segment::from_mmap(mapped?, len, layout) };
    let h = seg.header();
    if h.magic.load(Ordering::Acquire) != MAGIC || h.version != VERSION || h.run_id != run_id {
        return Err(CommError::Segment {
            segment: name.to_string(),
            problem:
                "is not the one rank 0 just made (run id or version differ); a stale segment of another run \
                      is in the way"
                    .into(),
        });
    }
    Ok(seg)
}

/// A group of `world` ranks that are threads of this process (backend `local`, for tests):
/// the same collectives as `shm`, in one heap allocation. Move each world to its thread.
pub fn local_group(world: usize, opts: &ShmOptions) -> Result<Vec<ShmWorld>> {
    assert!(world > 0, "local_group: the world size must be at least 1");
    let seg = Arc::new(Segment::in_process(opts.layout(world)));
    (0..world).map(|r| ShmWorld::attach(seg.clone(), r, opts)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sweep_stale_segments` removes every dead creator's segment, including the one the other
    /// test makes on purpose: the two take turns.
    static SEGMENT_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_segment_left_by_a_dead_process_is_replaced() {
        let _turn = SEGMENT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("oxtrain-comm-test-{}", fresh_run_id());
        let layout = SegmentLayout { world: 2, chunk_bytes: 4096, heap_bytes: 4096 };
        // A child process creates a segment and exits without removing it, as a crash would.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let seg = create(&name, layout, 1).unwrap();
        seg.set_creator_pid(dead_pid);
        drop(seg);
        assert_eq!(creator_of(&name), Some((MAGIC, dead_pid)));
        // The next run sees the dead creator and replaces the segment.
        let seg = create(&name, layout, 2).unwrap();
        assert_eq!(seg.header().run_id, 2);
        assert_eq!(seg.header().creator_pid, std::process::id());
        // A segment whose creator is alive (here: our parent) is never taken over.
        seg.set_creator_pid(unsafe { libc::getppid() } as u32);
        let err = create(&name, layout, 3).err().expect("a live creator's segment was replaced").to_string();
        assert!(err.contains("belongs to a running process"), "{err}");
        unlink(&name).unwrap();
    }

    #[test]
    fn sweep_removes_only_dead_creators() {
        let _turn = SEGMENT_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("oxtrain-comm-test-{}", fresh_run_id());
        let layout = SegmentLayout { world: 1, chunk_bytes: 4096, heap_bytes: 4096 };
        let seg = create(&name, layout, 1).unwrap();
        sweep_stale_segments();
        assert!(creator_of(&name).is_some(), "a live creator's segment was swept");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        seg.set_creator_pid(dead_pid);
        sweep_stale_segments();
        assert!(creator_of(&name).is_none(), "a dead creator's segment was kept");
    }
}
