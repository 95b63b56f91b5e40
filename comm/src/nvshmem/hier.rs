//! Collectives across nodes as stages on the node and rail teams (`team.rs`), each stage a
//! one-shot launch of the collective kernel. NVLink stores carry the node stages; NVSHMEM's
//! puts, which its proxy moves between nodes, carry the rail stages. A node's traffic to
//! another node then crosses once per rail instead of once per pair of PEs, and no team has
//! more than 8 members, so layouts up to 8 nodes of 8 GPUs are taken.
//!
//! - all_reduce: reduce-scatter in the node, all-reduce of the shard over the rail,
//!   all-gather in the node.
//! - broadcast: over the root's rail, then in every node from the root's local rank.
//! - reduce: in every node to the root's local rank, then over that rail to the root.
//! - all_gather: in every node into the node's region of the output (its ranks' shards, which
//!   are contiguous), then every region broadcast over the rails from its node.
//! - reduce_scatter: every node's region reduced over the rails to that node, then a
//!   reduce-scatter of the region in the node.
//!
//! A stage list is built by every PE for itself, and every PE must make the same launches:
//! the members of a team wait for each other's launches on it, and a launch's epoch (the value
//! its signals carry) is the PE's count of launches (entry.cu). So a rail that a stage does not
//! need runs it empty, and a stage whose windows differ between nodes or rails (their parts
//! differ by an element or so) pads every PE to the most windows (`windows::padded`).
//!
//! Partial results are rounded to the tensor's dtype between stages (as NCCL's rings do), and
//! `Avg` averages each stage (every node has as many PEs, so the mean of the node means is the
//! mean). Rail launches put from a heap copy of their input (`windows::through_heap`). The
//! tests run the plans through a model of the kernel (`tests/hier_plans.rs`) on every layout.

use super::kernels::{self, CollArgs};
use super::team::Kind;
use super::windows::launches;
use super::Stage;
use crate::gpu::CudaView;
use crate::op::{shard_range, ReduceOp};
use std::ops::Range;

/// Where this PE sits: `per_node` PEs per node, numbered node by node; the node and rail
/// teams' staging slots hold `slot_bytes`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub rank: usize,
    pub world: usize,
    pub per_node: usize,
    pub slot_bytes: usize,
}

impl Span {
    fn node(&self) -> usize {
        self.rank / self.per_node
    }
    fn local(&self) -> usize {
        self.rank % self.per_node
    }
    fn nodes(&self) -> usize {
        self.world / self.per_node
    }
    /// Node `n`'s ranks' shards of `len` elements, which lie next to each other; each rank's
    /// shard is its node-local rank's shard of the region (`shard_range` gives the remainder
    /// to the lowest ranks, globally and in the region alike).
    fn region(&self, len: usize, n: usize) -> Range<usize> {
        let first = shard_range(len, self.world, n * self.per_node).start;
        first..shard_range(len, self.world, (n + 1) * self.per_node - 1).end
    }
    /// Launches of a stage over `len` elements of `v`'s dtype.
    fn launches(&self, len: usize, v: &CudaView) -> usize {
        launches(len, self.slot_bytes / v.dtype.size_in_bytes())
    }
    /// Launches of a node stage over each node's region: the most any node needs (node 0's
    /// region is the largest, as the lowest ranks take the remainder).
    fn region_launches(&self, len: usize, v: &CudaView) -> usize {
        self.launches(self.region(len, 0).len(), v)
    }
}

fn stage(args: CollArgs, kind: Kind, launches: usize) -> Stage {
    Stage { args, kind, launches }
}

/// A stage of `launches` empty launches: a team that takes no part in a step still makes them.
fn idle(kind: Kind, launches: usize) -> Stage {
    stage(CollArgs::in_place(0, 0, ReduceOp::Sum), kind, launches)
}

fn at(v: &CudaView, elems: usize) -> u64 {
    v.ptr.wrapping_add((elems * v.dtype.size_in_bytes()) as u64)
}

/// An address `elems` elements before `ptr`: kernels index tensors by the element's index in
/// the whole, so a tensor holding a part starting at `elems` is passed shifted back.
fn before(ptr: u64, elems: usize, v: &CudaView) -> u64 {
    ptr.wrapping_sub((elems * v.dtype.size_in_bytes()) as u64)
}

pub(crate) fn all_reduce(s: &Span, v: &CudaView, op: ReduceOp) -> Vec<Stage> {
    let shard = shard_range(v.len, s.per_node, s.local());
    let whole = s.launches(v.len, v);
    let mut stages = Vec::with_capacity(3);
    if s.per_node > 1 {
        let mut rs = CollArgs::in_place(v.ptr, v.len, op);
        rs.src = kernels::SRC_REDUCE;
        rs.out = kernels::OUT_SHARD;
        stages.push(stage(rs, Kind::Node, whole));
    }
    if s.nodes() > 1 {
        let mut ar = CollArgs::in_place(at(v, shard.start), shard.len(), op);
        ar.src = kernels::SRC_REDUCE;
        ar.out = kernels::OUT_ALL;
        // Local rank 0's shard is the largest.
        stages.push(stage(ar, Kind::Rail, s.launches(shard_range(v.len, s.per_node, 0).len(), v)));
    }
    if s.per_node > 1 {
        let mut ag = CollArgs::in_place(v.ptr, v.len, ReduceOp::Sum);
        ag.in_lo = shard.start as i64;
        ag.in_hi = shard.end as i64;
        ag.src = kernels::SRC_OWNER;
        ag.out = kernels::OUT_ALL;
        stages.push(stage(ag, Kind::Node, whole));
    }
    stages
}

/// The arguments of a broadcast from team member `root` (the others send nothing).
fn broadcast_args(ptr: u64, len: usize, root: usize, me: usize) -> CollArgs {
    let mut a = CollArgs::in_place(ptr, len, ReduceOp::Sum);
    if me != root {
        a.in_hi = 0;
    }
    a.src = kernels::SRC_ROOT;
    a.out = kernels::OUT_NOT_ROOT;
    a.root = root as i32;
    a
}

pub(crate) fn broadcast(s: &Span, v: &CudaView, root: usize) -> Vec<Stage> {
    let (root_node, root_local) = (root / s.per_node, root % s.per_node);
    let n = s.launches(v.len, v);
    let mut stages = Vec::with_capacity(2);
    // Only the root's rail crosses nodes; the other rails idle meanwhile.
    stages.push(if s.local() == root_local {
        stage(broadcast_args(v.ptr, v.len, root_node, s.node()), Kind::Rail, n)
    } else {
        idle(Kind::Rail, n)
    });
    if s.per_node > 1 {
        stages.push(stage(broadcast_args(v.ptr, v.len, root_local, s.local()), Kind::Node, n));
    }
    stages
}

/// Elements of scratch `reduce` needs on this PE: the node's partial result, held by the
/// PEs of the root's rail other than the root (whose tensor must stay as it was).
pub(crate) fn reduce_scratch(s: &Span, len: usize, root: usize) -> usize {
    let on_rail = s.local() == root % s.per_node && s.rank != root;
    if s.per_node > 1 && on_rail {
        len
    } else {
        0
    }
}

/// `scratch`: at least `reduce_scratch` elements.
pub(crate) fn reduce(s: &Span, v: &CudaView, root: usize, op: ReduceOp, scratch: u64) -> Vec<Stage> {
    let (root_node, root_local) = (root / s.per_node, root % s.per_node);
    let n = s.launches(v.len, v);
    let reduce_stage = |input: u64, output: u64, root: usize, kind: Kind| {
        let mut a = CollArgs::in_place(input, v.len, op);
        a.out_base = output;
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_ROOT;
        a.root = root as i32;
        stage(a, kind, n)
    };
    // Where this PE's node partial goes: the root's tensor, or scratch on the rest of its rail.
    let partial = if reduce_scratch(s, v.len, root) > 0 { scratch } else { v.ptr };
    let mut stages = Vec::with_capacity(2);
    if s.per_node > 1 {
        stages.push(reduce_stage(v.ptr, partial, root_local, Kind::Node));
    }
    stages.push(if s.local() == root_local {
        reduce_stage(partial, v.ptr, root_node, Kind::Rail)
    } else {
        idle(Kind::Rail, n)
    });
    stages
}

pub(crate) fn all_gather(s: &Span, out: &CudaView, input: &CudaView) -> Vec<Stage> {
    let mine = s.region(out.len, s.node());
    let mut stages = Vec::with_capacity(1 + s.nodes());
    if s.per_node > 1 {
        // The node's region as a tensor of its own, sharded over the node's PEs.
        let shard = shard_range(mine.len(), s.per_node, s.local());
        let mut a = CollArgs::in_place(at(out, mine.start), mine.len(), ReduceOp::Sum);
        a.in_base = before(input.ptr, shard.start, input);
        a.in_lo = shard.start as i64;
        a.in_hi = shard.end as i64;
        a.src = kernels::SRC_OWNER;
        a.out = kernels::OUT_ALL;
        stages.push(stage(a, Kind::Node, s.region_launches(out.len, out)));
    }
    for n in 0..s.nodes() {
        let region = s.region(out.len, n);
        let mut a = broadcast_args(at(out, region.start), region.len(), n, s.node());
        if s.per_node == 1 {
            // No node stage put the root's shard into its output: it copies it there itself.
            a.out = kernels::OUT_ALL;
            if n == s.node() {
                a.in_base = input.ptr;
            }
        }
        stages.push(stage(a, Kind::Rail, s.launches(region.len(), out)));
    }
    stages
}

/// Elements of scratch `reduce_scatter` needs on this PE: the node's region reduced over
/// the rail, before the node splits it.
pub(crate) fn reduce_scatter_scratch(s: &Span, len: usize) -> usize {
    if s.per_node > 1 {
        s.region(len, s.node()).len()
    } else {
        0
    }
}

/// `out` holds this rank's shard of `input`; `scratch`: at least `reduce_scatter_scratch`
/// elements.
pub(crate) fn reduce_scatter(
    s: &Span,
    out: &CudaView,
    input: &CudaView,
    op: ReduceOp,
    scratch: u64,
) -> Vec<Stage> {
    let mine = s.region(input.len, s.node());
    // With one PE per node the region is this rank's shard: the rail stage writes the output.
    let region_out = if s.per_node > 1 { scratch } else { out.ptr };
    let mut stages = Vec::with_capacity(s.nodes() + 1);
    for n in 0..s.nodes() {
        let region = s.region(input.len, n);
        let mut a = CollArgs::in_place(at(input, region.start), region.len(), op);
        a.out_base = if n == s.node() { region_out } else { a.in_base };
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_ROOT;
        a.root = n as i32;
        stages.push(stage(a, Kind::Rail, s.launches(region.len(), input)));
    }
    if s.per_node > 1 {
        let shard = shard_range(mine.len(), s.per_node, s.local());
        let mut a = CollArgs::in_place(scratch, mine.len(), op);
        a.out_base = before(out.ptr, shard.start, out);
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_SHARD;
        stages.push(stage(a, Kind::Node, s.region_launches(input.len, input)));
    }
    stages
}

/// The barrier across nodes: the node, the rail, the node again (every PE has then heard,
/// through its node, from every rail).
pub(crate) fn barrier() -> Vec<Stage> {
    vec![idle(Kind::Node, 1), idle(Kind::Rail, 1), idle(Kind::Node, 1)]
}
