//! Collectives through the shared segment.
//!
//! Each rank stages its input in its own buffer of the segment; after a phase barrier every
//! rank reduces its own shard straight out of all ranks' buffers (reduce-scatter) and, after
//! a second barrier, copies every shard out (all-gather). Two staging buffers alternate, so
//! writing step k+2 waits on nothing more than step k+1's first barrier. Barriers are
//! per-rank phase counters in the segment (release/acquire), with futex sleeps when a rank
//! waits long.

use super::segment::{publish, wait_word, Attachment, Segment, WaitFor, STATE_ABORTED};
use crate::element::{reduce_into, ReduceElement};
use crate::engine::CpuEngine;
use crate::error::Result;
use crate::op::{shard_range, ReduceOp};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct ShmEngine {
    seg: Arc<Segment>,
    _attached: Arc<Attachment>,
    rank: usize,
    world: usize,
    phase: u64,
    /// Staging buffer of the next step (alternates across steps and across calls).
    next_buf: usize,
    timeout: Duration,
    peers: Vec<usize>,
    /// Name of the running call, for errors.
    op: &'static str,
    calls: u64,
}

impl ShmEngine {
    pub fn new(attached: Arc<Attachment>, timeout: Duration) -> ShmEngine {
        let (seg, rank) = (attached.seg.clone(), attached.rank);
        let world = seg.layout.world;
        let phase = seg.slot(rank).phase.load(Ordering::Acquire);
        let peers = (0..world).filter(|&r| r != rank).collect();
        ShmEngine {
            seg,
            _attached: attached,
            rank,
            world,
            phase,
            next_buf: 0,
            timeout,
            peers,
            op: "",
            calls: 0,
        }
    }

    fn begin(&mut self, op: &'static str) {
        self.op = op;
        self.calls += 1;
    }

    /// Publishes this rank's next phase and waits until every peer has reached it.
    fn sync(&mut self) -> Result<()> {
        self.phase += 1;
        let target = self.phase;
        let me = self.seg.slot(self.rank);
        publish(&me.phase, &me.phase_waiters, target);
        let op = format!("{} (call #{} on {})", self.op, self.calls, self.seg.backend);
        for &r in &self.peers {
            let slot = self.seg.slot(r);
            let w =
                WaitFor { op: &op, me: self.rank, peers: std::slice::from_ref(&r), timeout: self.timeout };
            let seg = &self.seg;
            wait_word(
                seg,
                &slot.phase,
                &slot.phase_waiters,
                |v| v >= target,
                &w,
                || {
                    (0..seg.layout.world)
                        .filter(|&q| seg.slot(q).phase.load(Ordering::Acquire) < target)
                        .collect()
                },
            )?;
        }
        Ok(())
    }

    fn take_buf(&mut self) -> usize {
        let b = self.next_buf;
        self.next_buf ^= 1;
        b
    }

    /// Elements of `T` per rank per step in the reduce family.
    fn sub_elems<T>(&self) -> usize {
        (self.seg.layout.chunk_bytes / self.world / std::mem::size_of::<T>()).max(1)
    }

    /// The reduce family. `mode`: all ranks get the result, only `root` does, or each rank
    /// gets its shard (written to `shard_out`).
    fn reduce_family<T: ReduceElement>(
        &mut self,
        input: *const T,
        len: usize,
        output: *mut T,
        op: ReduceOp,
        mode: Mode,
    ) -> Result<()> {
        let (world, me) = (self.world, self.rank);
        let s = self.sub_elems::<T>();
        let shards: Vec<_> = (0..world).map(|r| shard_range(len, world, r)).collect();
        let steps = shards.iter().map(|r| r.len().div_ceil(s)).max().unwrap_or(0);
        let esz = std::mem::size_of::<T>();
        for k in 0..steps {
            let b = self.take_buf();
            let part = |r: usize| {
                let sh = &shards[r];
                let lo = (sh.start + k * s).min(sh.end);
                lo..(lo + s).min(sh.end)
            };
            let mine = self.seg.staging(me, b) as *mut T;
            for r in 0..world {
                let p = part(r);
                // SAFETY: the input holds `len` elements; sub-slot r holds `s` elements.
                unsafe { std::ptr::copy_nonoverlapping(input.add(p.start), mine.add(r * s), p.len()) };
            }
            self.sync()?;
            let my = part(me);
            let sources: Vec<*const T> =
                (0..world).map(|q| unsafe { (self.seg.staging(q, b) as *const T).add(me * s) }).collect();
            let dest = match mode {
                Mode::Shard => unsafe { output.add(my.start - shards[me].start) },
                // SAFETY: only this rank reads or writes its own shard's sub-slot in this step.
                _ => unsafe { mine.add(me * s) },
            };
            unsafe { reduce_into(&sources, dest, my.len(), op) };
            if mode == Mode::Shard {
                continue;
            }
            self.sync()?;
            if mode == Mode::All || mode == Mode::Root(me) {
                for r in 0..world {
                    let p = part(r);
                    let src = unsafe { (self.seg.staging(r, b) as *const T).add(r * s) };
                    unsafe { std::ptr::copy_nonoverlapping(src, output.add(p.start), p.len()) };
                }
            }
        }
        let _ = esz;
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    All,
    Root(usize),
    Shard,
}

impl CpuEngine for ShmEngine {
    fn all_reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.begin("all_reduce");
        let p = data.as_mut_ptr();
        self.reduce_family(p, data.len(), p, op, Mode::All)
    }

    fn reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.begin("reduce");
        let p = data.as_mut_ptr();
        self.reduce_family(p, data.len(), p, op, Mode::Root(root))
    }

    fn reduce_scatter<T: ReduceElement>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.begin("reduce_scatter");
        debug_assert_eq!(output.len(), shard_range(input.len(), self.world, self.rank).len());
        self.reduce_family(input.as_ptr(), input.len(), output.as_mut_ptr(), op, Mode::Shard)
    }

    fn all_gather(&mut self, input: &[u8], output: &mut [u8], elem_size: usize) -> Result<()> {
        self.begin("all_gather");
        let (world, me) = (self.world, self.rank);
        let total = output.len() / elem_size;
        let step = (self.seg.layout.chunk_bytes / elem_size).max(1) * elem_size;
        let parts: Vec<_> = (0..world)
            .map(|r| {
                let s = shard_range(total, world, r);
                s.start * elem_size..s.end * elem_size
            })
            .collect();
        debug_assert_eq!(input.len(), parts[me].len());
        let steps = parts.iter().map(|p| p.len().div_ceil(step)).max().unwrap_or(0);
        for k in 0..steps {
            let b = self.take_buf();
            let lo = (k * step).min(input.len());
            let n = step.min(input.len() - lo);
            // SAFETY: the staging buffer holds chunk_bytes >= step bytes.
            unsafe { std::ptr::copy_nonoverlapping(input.as_ptr().add(lo), self.seg.staging(me, b), n) };
            self.sync()?;
            for (r, p) in parts.iter().enumerate() {
                let lo = (k * step).min(p.len());
                let n = step.min(p.len() - lo);
                let dst = &mut output[p.start + lo..p.start + lo + n];
                unsafe { std::ptr::copy_nonoverlapping(self.seg.staging(r, b), dst.as_mut_ptr(), n) };
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()> {
        self.begin("broadcast");
        let step = self.seg.layout.chunk_bytes;
        for (k, chunk) in data.chunks_mut(step).enumerate() {
            let _ = k;
            let b = self.take_buf();
            let buf = self.seg.staging(root, b);
            if self.rank == root {
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), buf, chunk.len()) };
            }
            self.sync()?;
            if self.rank != root {
                unsafe { std::ptr::copy_nonoverlapping(buf, chunk.as_mut_ptr(), chunk.len()) };
            }
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.begin("barrier");
        self.sync()
    }

    fn abort(&mut self) {
        self.seg.slot(self.rank).state.store(STATE_ABORTED, Ordering::Release);
    }

    fn leave(&mut self) {
        // The attachment marks the exit when the last handle of this rank goes.
    }
}
