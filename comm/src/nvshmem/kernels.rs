//! The collective kernel's argument block and its launch.

use crate::error::Result;
use crate::gpu::cuda_err;
use crate::op::ReduceOp;
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;

pub(crate) const MAX_PES: usize = 8;
pub(crate) const MAX_BLOCKS: u32 = 256;
pub(crate) const THREADS: u32 = 512;

pub(crate) const ONESHOT: i32 = 0;
pub(crate) const TWOSHOT: i32 = 1;
pub(crate) const LL: i32 = 2;
pub(crate) const SYMM: i32 = 4;
pub(crate) const SYMM_PUSH: i32 = 5;
pub(crate) const SRC_REDUCE: i32 = 0;
pub(crate) const SRC_ROOT: i32 = 1;
pub(crate) const SRC_OWNER: i32 = 2;
pub(crate) const OUT_ALL: i32 = 0;
pub(crate) const OUT_ROOT: i32 = 1;
pub(crate) const OUT_NOT_ROOT: i32 = 2;
pub(crate) const OUT_SHARD: i32 = 3;

/// `struct CollArgs` of `collectives.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CollArgs {
    pub in_base: u64,
    pub out_base: u64,
    pub bufs: [u64; MAX_PES],
    pub ready: u64,
    pub done: u64,
    /// This PE's launch counters (`COUNTER_BYTES`; entry.cu and ll.cu), which give each launch
    /// its epoch and staging set on the device.
    pub counters: u64,
    pub slot_bytes: u64,
    pub count: i64,
    pub win_lo: i64,
    pub win_hi: i64,
    pub in_lo: i64,
    pub in_hi: i64,
    pub npes: i32,
    pub me: i32,
    pub mode: i32,
    pub src: i32,
    pub op: i32,
    pub root: i32,
    pub aligned: i32,
    pub out: i32,
    /// Global PE of every team member.
    pub pes: [i32; MAX_PES],
    /// Columns of a signal row (the world size).
    pub sig_stride: i32,
    /// Bit p: member p is on another node, reached by NVSHMEM puts.
    pub put_mask: i32,
    /// The fault record (see fault.rs), as the device sees it.
    pub fault: u64,
    /// How long any wait in the kernel may take.
    pub timeout_ns: u64,
    /// The team (`Kind`), whose launch counter picks the staging set.
    pub kind: i32,
    /// Two-shot windows: leave this window's copy-out (the peers' reduced sub-shards, from the
    /// staging into the output) to the next launch, where it overlaps that window's traffic.
    pub defer_out: i32,
    /// Two-shot windows: the previous window, whose copy-out this launch does (none when
    /// `prev_hi <= prev_lo`), and the grid it ran on (which decides the sub-shards).
    pub prev_lo: i64,
    pub prev_hi: i64,
    pub prev_blocks: i32,
    pub pad: i32,
}

const _: () = assert!(std::mem::size_of::<CollArgs>() == 272);

impl CollArgs {
    /// A one-shot launch over the `len` elements at `ptr`, input and output in place; callers
    /// set the sources and outputs (the window, buffers and team come at enqueue).
    pub fn in_place(ptr: u64, len: usize, op: ReduceOp) -> Self {
        CollArgs {
            in_base: ptr,
            out_base: ptr,
            count: len as i64,
            in_lo: 0,
            in_hi: len as i64,
            op: op as i32,
            mode: ONESHOT,
            ..CollArgs::default()
        }
    }
}

/// Rows of the launch counters: every launch (the epoch), then one per team kind.
pub(crate) const COUNTER_ROWS: usize = 5;
/// Bytes of the launch counters: a u64 per row and block (see `entry.cu`), then a u64 per
/// thread of the largest grid for the low-latency kernel (`ll.cu`).
pub(crate) const COUNTER_BYTES: usize = (COUNTER_ROWS + THREADS as usize) * MAX_BLOCKS as usize * 8;

/// `struct AtomicArgs` of `atomics.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AtomicArgs {
    pub target: u64,
    pub old: u64,
    pub value: u64,
    pub expected: u64,
    pub pe: i32,
    pub kind: i32,
    pub width: i32,
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<AtomicArgs>() == 48);

pub(crate) const ATOMIC_FETCH_ADD: i32 = 0;
pub(crate) const ATOMIC_COMPARE_SWAP: i32 = 1;

/// Launches the one-thread atomic kernel.
///
/// # Safety
/// `args.target` must be a symmetric address of a live heap, `args.old` device memory of
/// `args.width` bytes, and the context of the stream's device current.
pub(crate) unsafe fn launch_atomic(f: Function, args: &AtomicArgs, stream: sys::CUstream) -> Result<()> {
    let mut a = *args;
    let mut params = [&mut a as *mut AtomicArgs as *mut c_void];
    drv::launch_kernel(f.0, (1, 1, 1), (1, 1, 1), 0, stream, &mut params)
        .map_err(|e| cuda_err("launching the nvshmem atomic kernel", format!("{e:?}")))
}

/// Blocks for a window of `elems` elements of `esz` bytes: enough for one 16-byte pack per
/// thread, at most `max_blocks`. Depends only on sizes and options, so it is the same on
/// every PE (blocks pair up across PEs through their signals).
pub(crate) fn blocks_for(elems: usize, esz: usize, max_blocks: u32) -> u32 {
    let packs = (elems * esz).div_ceil(16);
    (packs.div_ceil(THREADS as usize) as u32).clamp(1, max_blocks.clamp(1, MAX_BLOCKS))
}

/// Blocks for the low-latency all-reduce: one 8-byte line per thread, at most `max_blocks`.
/// `max_blocks` stays fixed for a communicator's life: the kernel's per-thread launch counters
/// (ll.cu) rely on line k always going to the same thread.
pub(crate) fn ll_blocks(elems: usize, esz: usize, max_blocks: u32) -> u32 {
    let lines = (elems * esz).div_ceil(8);
    (lines.div_ceil(THREADS as usize) as u32).clamp(1, max_blocks.clamp(1, MAX_BLOCKS))
}

/// A loaded kernel function (a plain driver handle).
#[derive(Clone, Copy)]
pub(crate) struct Function(pub sys::CUfunction);
// SAFETY: function handles are process-wide and immutable once loaded.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// The collective kernels of one dtype, one per algorithm family (see entry.cu: apart, each is
/// register-allocated for its own code).
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    /// One-shot, two-shot (also of symmetric buffers), and the non-reducing ops and barrier.
    pub coll: Function,
    pub ll: Function,
    pub symm: Function,
}

impl Kernels {
    /// The kernel that runs `mode`.
    pub fn for_mode(&self, mode: i32) -> Function {
        match mode {
            LL => self.ll,
            SYMM => self.symm,
            _ => self.coll,
        }
    }

    pub fn all(&self) -> [Function; 3] {
        [self.coll, self.ll, self.symm]
    }
}

/// Launches `f` with `args` on `stream`; `dependent`: with programmatic dependent launch
/// (sm_90+, see `entry.cu`), so it may be scheduled while the previous collective finishes.
///
/// # Safety
/// Every address in `args` must be valid for the accesses the kernel makes (see
/// `collectives.cu`), and the context of the stream's device must be current.
pub(crate) unsafe fn launch(
    f: Function,
    blocks: u32,
    args: &CollArgs,
    stream: sys::CUstream,
    dependent: bool,
) -> Result<()> {
    let mut a = *args;
    let mut params = [&mut a as *mut CollArgs as *mut c_void];
    if !dependent {
        return drv::launch_kernel(f.0, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params)
            .map_err(|e| cuda_err("launching the nvshmem collective kernel", format!("{e:?}")));
    }
    // SAFETY: a plain-old-data union, zeroed then given the one field the attribute reads.
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: THREADS,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    sys::cuLaunchKernelEx(&config, f.0, params.as_mut_ptr(), std::ptr::null_mut())
        .result()
        .map_err(|e| cuda_err("launching the nvshmem collective kernel", format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the host allocates and passes must be the ones the kernels index with.
    #[test]
    fn launch_counter_layout_matches_the_kernels() {
        let src = super::super::device_code::SOURCE;
        let define = |name: &str| {
            src.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} is not defined in the kernel source"))
                .split("//")
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(define("OX_MAX_BLOCKS"), MAX_BLOCKS.to_string());
        assert_eq!(define("OX_THREADS"), THREADS.to_string());
        // The low-latency counters follow COUNTER_ROWS rows of one column per block.
        assert_eq!(define("OX_LL_COUNTER_BASE"), format!("({COUNTER_ROWS} * OX_MAX_BLOCKS)"));
        // One u64 per thread of the largest grid after them.
        assert_eq!(COUNTER_BYTES, (COUNTER_ROWS * MAX_BLOCKS as usize + (MAX_BLOCKS * THREADS) as usize) * 8);
        let size = format!("static_assert(sizeof(CollArgs) == {}", std::mem::size_of::<CollArgs>());
        assert!(src.contains(&size), "the kernels' CollArgs must be the Rust side's size: {size}");
    }

    /// The low-latency kernel's per-thread launch counters (ll.cu) need every line of a window
    /// handled by the same thread in every launch that has it, whatever the message size: the
    /// thread that takes line k is k mod (blocks x THREADS).
    #[test]
    fn a_low_latency_line_always_goes_to_the_same_thread() {
        for esz in [2usize, 4] {
            for max_blocks in [1u32, 32, 128, 132] {
                let thread = |elems: usize, line: usize| {
                    let blocks = ll_blocks(elems, esz, max_blocks) as usize;
                    line % (blocks * THREADS as usize)
                };
                let sizes = [1usize, 7, 1000, 4096, 70_000, 300_000, 1 << 20];
                for &a in &sizes {
                    for &b in &sizes {
                        let lines = |elems: usize| (elems * esz).div_ceil(8);
                        for line in (0..lines(a).min(lines(b))).step_by(97) {
                            assert_eq!(
                                thread(a, line),
                                thread(b, line),
                                "esz {esz}, cap {max_blocks}, line {line}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn block_counts_grow_with_size_up_to_the_cap() {
        assert_eq!(blocks_for(0, 4, 32), 1);
        assert_eq!(blocks_for(2048, 4, 32), 1); // 512 packs
        assert_eq!(blocks_for(2049, 4, 32), 2);
        assert_eq!(blocks_for(1 << 26, 2, 32), 32);
        assert_eq!(blocks_for(1 << 26, 2, 1000), MAX_BLOCKS);
    }

    #[test]
    fn ll_block_counts() {
        assert_eq!(ll_blocks(1, 4, 32), 1);
        assert_eq!(ll_blocks(1024, 4, 32), 1); // 512 lines
        assert_eq!(ll_blocks(1025, 4, 32), 2);
        assert_eq!(ll_blocks(1 << 20, 4, 32), 32);
    }
}
