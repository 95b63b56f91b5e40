//! The memory ranks share: a header, one slot per rank (pid, state, phase counters), the
//! collective staging buffers and the symmetric heap.
//!
//! The same layout lives in a POSIX shared-memory segment (backend `shm`, processes) or in
//! one heap allocation (backend `local`, threads), so both run the same collective code.

use crate::error::{CommError, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) const MAGIC: u64 = 0x6f78_7472_6e63_6d31; // "oxtrncm1"
pub(crate) const VERSION: u32 = 1;
const PAGE: usize = 4096;
const SLOT_BYTES: usize = 256;

/// Rank states (0: not attached yet), published in each slot so that peers fail fast
/// instead of timing out.
pub(crate) const STATE_ATTACHED: u32 = 1;
pub(crate) const STATE_EXITED: u32 = 2;
pub(crate) const STATE_ABORTED: u32 = 3;

#[repr(C)]
pub(crate) struct Header {
    /// Written last by the creator (release), so a reader that sees it sees the rest.
    pub magic: AtomicU64,
    pub version: u32,
    pub world: u32,
    pub chunk_bytes: u64,
    pub heap_bytes: u64,
    /// The creating process: a segment whose creator is gone was left by a crashed run.
    pub creator_pid: u32,
    pub _pad: u32,
    pub run_id: u64,
}

/// One rank's control words, each counter on its own cache line.
#[repr(C, align(64))]
pub(crate) struct Slot {
    pub pid: AtomicU32,
    pub state: AtomicU32,
    _p0: [u8; 56],
    /// Collective phases this rank has reached (only ever grows).
    pub phase: AtomicU64,
    /// Ranks sleeping on `phase` (so the publisher knows to wake them).
    pub phase_waiters: AtomicU32,
    _p1: [u8; 52],
    /// The one-sided heap's barrier, separate from the collectives' worker thread.
    pub heap_phase: AtomicU64,
    pub heap_waiters: AtomicU32,
    _p2: [u8; 52],
    /// Ranks sleeping on one of this rank's heap signal words.
    pub signal_waiters: AtomicU32,
    _p3: [u8; 60],
}

const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);

/// Where everything is, for a world size and buffer sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentLayout {
    pub world: usize,
    /// Bytes of one staging buffer (each rank has two, used alternately).
    pub chunk_bytes: usize,
    /// Bytes of one rank's symmetric heap.
    pub heap_bytes: usize,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl SegmentLayout {
    pub fn slots_offset(&self) -> usize {
        PAGE
    }
    pub fn data_offset(&self) -> usize {
        align_up(PAGE + self.world * SLOT_BYTES, PAGE)
    }
    pub fn heap_offset(&self) -> usize {
        align_up(self.data_offset() + self.world * 2 * self.chunk_bytes, PAGE)
    }
    pub fn total_bytes(&self) -> usize {
        align_up(self.heap_offset() + self.world * self.heap_bytes, PAGE)
    }
}

/// Owner of the mapped bytes.
enum Backing {
    Heap(std::alloc::Layout),
    Mmap,
}

/// A mapped region with the segment layout.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    backing: Backing,
    pub layout: SegmentLayout,
    /// Whether peers are processes (check their pids) or threads of this one.
    pub processes: bool,
    pub backend: &'static str,
}

// SAFETY: the region is shared memory accessed through atomics and raw copies that the
// collective protocol orders; the pointer itself is valid until drop.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// A zeroed region in this process, for ranks that are threads.
    pub fn in_process(layout: SegmentLayout) -> Segment {
        let alloc = std::alloc::Layout::from_size_align(layout.total_bytes(), PAGE).expect("segment layout");
        // SAFETY: non-zero size (the header page is always there).
        let base = unsafe { std::alloc::alloc_zeroed(alloc) };
        assert!(!base.is_null(), "local communicator: out of memory allocating {} bytes", alloc.size());
        let seg = Segment {
            base,
            len: alloc.size(),
            backing: Backing::Heap(alloc),
            layout,
            processes: false,
            backend: "local",
        };
        seg.init_header(0);
        seg
    }

    /// Wraps a mapping made by the shm module.
    ///
    /// # Safety
    /// `base` must be a `MAP_SHARED` mapping of `len >= layout.total_bytes()` bytes.
    pub unsafe fn from_mmap(base: *mut u8, len: usize, layout: SegmentLayout) -> Segment {
        Segment { base, len, backing: Backing::Mmap, layout, processes: true, backend: "shm" }
    }

    pub fn init_header(&self, run_id: u64) {
        // SAFETY: the header page is inside the region and nobody reads it before `magic`.
        unsafe {
            let h = self.base as *mut Header;
            (*h).version = VERSION;
            (*h).world = self.layout.world as u32;
            (*h).chunk_bytes = self.layout.chunk_bytes as u64;
            (*h).heap_bytes = self.layout.heap_bytes as u64;
            (*h).creator_pid = std::process::id();
            (*h).run_id = run_id;
        }
        self.header().magic.store(MAGIC, Ordering::Release);
    }

    /// Pretends another process made this segment (tests of stale-segment handling).
    #[cfg(test)]
    pub fn set_creator_pid(&self, pid: u32) {
        // SAFETY: the header is in the region; tests call this with no concurrent reader.
        unsafe { (*(self.base as *mut Header)).creator_pid = pid };
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header is at the start of the region, which is page aligned.
        unsafe { &*(self.base as *const Header) }
    }

    pub fn slot(&self, rank: usize) -> &Slot {
        assert!(rank < self.layout.world);
        // SAFETY: slots lie inside the region, 64-byte aligned.
        unsafe { &*(self.base.add(self.layout.slots_offset() + rank * SLOT_BYTES) as *const Slot) }
    }

    /// Staging buffer `which` (0 or 1) of `rank`.
    pub fn staging(&self, rank: usize, which: usize) -> *mut u8 {
        let l = &self.layout;
        assert!(rank < l.world && which < 2);
        // SAFETY: in bounds by the layout.
        unsafe { self.base.add(l.data_offset() + (rank * 2 + which) * l.chunk_bytes) }
    }

    /// Start of `rank`'s symmetric heap.
    pub fn heap(&self, rank: usize) -> *mut u8 {
        let l = &self.layout;
        assert!(rank < l.world);
        // SAFETY: in bounds by the layout.
        unsafe { self.base.add(l.heap_offset() + rank * l.heap_bytes) }
    }

    /// Why `rank` can no longer take part, or `None` while it is alive and attached.
    pub fn peer_failure(&self, rank: usize) -> Option<String> {
        let slot = self.slot(rank);
        let pid = slot.pid.load(Ordering::Acquire);
        match slot.state.load(Ordering::Acquire) {
            STATE_EXITED => {
                return Some(format!(
                    "left the communicator (dropped it) before this call finished (pid {pid})"
                ))
            }
            STATE_ABORTED => {
                return Some(format!("gave up after an error of its own (pid {pid}); see that rank's error"))
            }
            _ => {}
        }
        if self.processes && pid != 0 && !pid_alive(pid) {
            return Some(format!("has exited or been killed (pid {pid} is gone)"));
        }
        None
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `in_process` with this layout.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.base, layout) },
            // SAFETY: mapped by the shm module with this length.
            Backing::Mmap => unsafe {
                libc::munmap(self.base as *mut libc::c_void, self.len);
            },
        }
    }
}

/// A rank's presence in the segment: attached while any of its handles (communicator,
/// heap) lives; dropping the last one marks it as having left, so peers stop waiting.
pub(crate) struct Attachment {
    pub seg: Arc<Segment>,
    pub rank: usize,
}

impl Attachment {
    pub fn attach(seg: Arc<Segment>, rank: usize) -> Arc<Attachment> {
        let slot = seg.slot(rank);
        slot.pid.store(std::process::id(), Ordering::Release);
        slot.state.store(STATE_ATTACHED, Ordering::Release);
        Arc::new(Attachment { seg, rank })
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let _ = self.seg.slot(self.rank).state.compare_exchange(
            STATE_ATTACHED,
            STATE_EXITED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// Whether a process of this host is running: it exists and is not a zombie (a killed
/// child that its parent has not reaped yet still answers `kill(pid, 0)`).
pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z') | Some('X')),
            None => true,
        },
        Err(_) => true,
    }
}

/// The low 32 bits of a counter, as the futex word (little-endian hosts).
fn low_word(word: &AtomicU64) -> *const u32 {
    word.as_ptr() as *const u32
}

/// Sleeps while `*word` still has low half `expected`, at most `timeout`.
pub(crate) fn futex_wait(word: &AtomicU64, expected: u64, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared (non-private) futex on a valid word; spurious returns are fine.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_word(word),
            libc::FUTEX_WAIT,
            expected as u32,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every sleeper on `word`.
pub(crate) fn futex_wake(word: &AtomicU64) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(libc::SYS_futex, low_word(word), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Stores `value` and wakes sleepers if there are any (Dekker pairing with [`wait_word`]).
pub(crate) fn publish(word: &AtomicU64, waiters: &AtomicU32, value: u64) {
    word.store(value, Ordering::SeqCst);
    if waiters.load(Ordering::SeqCst) > 0 {
        futex_wake(word);
    }
}

/// What a wait is for, to name it in errors.
pub(crate) struct WaitFor<'a> {
    pub op: &'a str,
    pub me: usize,
    /// Ranks whose failure makes the wait hopeless.
    pub peers: &'a [usize],
    pub timeout: std::time::Duration,
}

/// Waits until `done(word)` holds: spins briefly, then sleeps on the futex; every few
/// milliseconds checks that the watched peers are alive, and gives up at the timeout.
pub(crate) fn wait_word(
    seg: &Segment,
    word: &AtomicU64,
    waiters: &AtomicU32,
    done: impl Fn(u64) -> bool,
    w: &WaitFor<'_>,
    missing: impl Fn() -> Vec<usize>,
) -> Result<u64> {
    use std::time::{Duration, Instant};
    for i in 0..256 {
        let v = word.load(Ordering::Acquire);
        if done(v) {
            return Ok(v);
        }
        if i < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let start = Instant::now();
    loop {
        waiters.fetch_add(1, Ordering::SeqCst);
        let v = word.load(Ordering::SeqCst);
        if !done(v) {
            futex_wait(word, v, Duration::from_millis(2));
        }
        waiters.fetch_sub(1, Ordering::SeqCst);
        let v = word.load(Ordering::Acquire);
        if done(v) {
            return Ok(v);
        }
        for &r in w.peers {
            if let Some(detail) = seg.peer_failure(r) {
                return Err(CommError::PeerFailed { op: w.op.to_string(), me: w.me, rank: r, detail });
            }
        }
        if start.elapsed() > w.timeout {
            return Err(CommError::Timeout {
                op: w.op.to_string(),
                me: w.me,
                ranks: missing(),
                timeout: w.timeout,
                hint:
                    "they are alive but never reached this call: do all ranks call the same collectives in \
                       the same order with the same sizes? (OXTRAIN_COMM_CHECK=1 checks that)"
                        .into(),
            });
        }
    }
}
