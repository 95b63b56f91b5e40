//! Tests of the hierarchical plans (`hier.rs`) on layouts of up to 8 nodes of 8 GPUs, without
//! a GPU: each plan's launches run on a host model of the one-shot collective kernel
//! (`collectives.cu`).
//!
//! What it models, as the kernel does it: a sender pushes the elements of its input in its
//! `[in_lo, in_hi)` that fall in the receiver's output range (as the sender computes it); a
//! receiver computes each element of its output range from its own input (only inside its
//! `[in_lo, in_hi)`, the part a launch across nodes stages on the heap) and what was pushed to
//! it (taken before anyone writes), combining in team order. What it checks: every element
//! a receiver needs was pushed to it, no read or write leaves a buffer, no output overwrites
//! input the same launch still reads, the members of a team agree on the launch and launch
//! the same grids (windows of the same lengths), and the members' launch sequences on every
//! team line up (else the GPUs would wait forever).

use crate::gpu::CudaView;
use crate::nvshmem::hier::{self, Span};
use crate::nvshmem::kernels::{self, CollArgs};
use crate::nvshmem::team::{layout, Kind};
use crate::nvshmem::windows::launches;
use crate::nvshmem::Stage;
use crate::op::{shard_range, ReduceOp};
use oxtrain_tensor::DType;
use std::collections::BTreeMap;

thread_local! {
    /// Bytes per element of the tensors in the current case (the plans turn element offsets
    /// into addresses with the dtype's size; the model runs them at 4 and at 2 bytes).
    static ESZ: std::cell::Cell<u64> = const { std::cell::Cell::new(4) };
}
fn esz() -> u64 {
    ESZ.with(|e| e.get())
}
const INPUT: u64 = 0x1000_0000;
const OUTPUT: u64 = 0x2000_0000;
const SCRATCH: u64 = 0x3000_0000;
/// Passed where a plan needs no scratch: any use of it is out of bounds.
const NO_SCRATCH: u64 = 0x7000_0000;

/// A PE's memory: buffers by base address; `None` for elements never written.
#[derive(Clone, Default, Debug)]
struct Memory {
    bufs: BTreeMap<u64, Vec<Option<f64>>>,
}

impl Memory {
    fn locate(&self, addr: u64) -> Result<(u64, usize), String> {
        let (&base, buf) =
            self.bufs.range(..=addr).next_back().ok_or(format!("address {addr:#x} in no buffer"))?;
        let off = addr - base;
        if !off.is_multiple_of(esz()) || off / esz() >= buf.len() as u64 {
            return Err(format!(
                "address {addr:#x} outside the buffer at {base:#x} of {} elements",
                buf.len()
            ));
        }
        Ok((base, (off / esz()) as usize))
    }
    fn read(&self, addr: u64) -> Result<Option<f64>, String> {
        let (base, i) = self.locate(addr)?;
        Ok(self.bufs[&base][i])
    }
    fn write(&mut self, addr: u64, v: f64) -> Result<(), String> {
        let (base, i) = self.locate(addr)?;
        self.bufs.get_mut(&base).unwrap()[i] = Some(v);
        Ok(())
    }
}

fn addr(base: u64, i: i64) -> u64 {
    base.wrapping_add((i as u64).wrapping_mul(esz()))
}

/// `ox_out_range`: member p's output range as `a`'s owner sees it.
fn out_range(a: &CollArgs, npes: usize, p: usize) -> (i64, i64) {
    let root = a.root as usize;
    match a.out {
        kernels::OUT_ROOT if p != root => (0, 0),
        kernels::OUT_NOT_ROOT if p == root => (0, 0),
        kernels::OUT_SHARD => {
            let r = shard_range(a.count as usize, npes, p);
            (r.start as i64, r.end as i64)
        }
        _ => (0, a.count),
    }
}

fn owner(count: i64, npes: usize, i: i64) -> usize {
    (0..npes).find(|&p| shard_range(count as usize, npes, p).contains(&(i as usize))).unwrap()
}

fn members(kind: Kind, pe: usize, world: usize, per_node: usize) -> Vec<usize> {
    let (node, rail) = layout(pe, world, per_node);
    match kind {
        Kind::Node => node,
        Kind::Rail => rail,
        Kind::All | Kind::Ll => (0..world).collect(),
    }
}

/// One launch on the team `team` (global PEs), member i passing `args[i]`.
fn launch(team: &[usize], args: &[CollArgs], mems: &mut [Memory]) -> Result<(), String> {
    let npes = team.len();
    if npes > kernels::MAX_PES {
        return Err(format!("a team of {npes} PEs; the kernels take {}", kernels::MAX_PES));
    }
    let a0 = &args[0];
    for (m, a) in args.iter().enumerate() {
        let same = a.mode == kernels::ONESHOT
            && a.count == a0.count
            && a.src == a0.src
            && a.out == a0.out
            && a.op == a0.op
            && a.root == a0.root;
        if !same {
            return Err(format!("team {team:?}: member {m} passed {a:?}, member 0 {a0:?}"));
        }
    }
    let before: Vec<Memory> = team.iter().map(|&pe| mems[pe].clone()).collect();
    for q in 0..npes {
        let a = &args[q];
        let (lo, hi) = out_range(a, npes, q);
        // The output may only replace the input element by element, in place.
        let reads_own = hi > lo
            && match a.src {
                kernels::SRC_ROOT => a.root as usize == q,
                kernels::SRC_OWNER => (lo..hi).any(|i| owner(a.count, npes, i) == q),
                _ => true,
            };
        let overlap =
            addr(a.out_base, lo) < addr(a.in_base, hi) && addr(a.in_base, lo) < addr(a.out_base, hi);
        if reads_own && a.out_base != a.in_base && overlap {
            return Err(format!("PE {}: output overlaps the input it reads at another offset", team[q]));
        }
        for i in lo..hi {
            let sources: Vec<usize> = match a.src {
                kernels::SRC_REDUCE => (0..npes).collect(),
                kernels::SRC_ROOT => vec![a.root as usize],
                _ => vec![owner(a.count, npes, i)],
            };
            let mut acc: Option<f64> = None;
            for p in sources {
                let ap = &args[p];
                // Launches whose puts cross nodes see only the part [in_lo, in_hi) of their
                // own input (copied to the heap, windows::through_heap), so no PE reads past it.
                if p == q && !(ap.in_lo..ap.in_hi).contains(&i) {
                    return Err(format!("PE {} reads its own element {i} outside its input part", team[q]));
                }
                if p != q {
                    let (plo, phi) = out_range(ap, npes, q);
                    let sent = i >= ap.in_lo.max(plo) && i < ap.in_hi.min(phi);
                    if !sent {
                        return Err(format!(
                            "PE {} needs element {i} from PE {}, which never sent it",
                            team[q], team[p]
                        ));
                    }
                }
                let v = before[p]
                    .read(addr(ap.in_base, i))?
                    .ok_or(format!("PE {} reads element {i} of PE {}, never written", team[q], team[p]))?;
                acc = Some(match (acc, a.op) {
                    (None, _) => v,
                    (Some(x), o) if o == ReduceOp::Max as i32 => x.max(v),
                    (Some(x), o) if o == ReduceOp::Min as i32 => x.min(v),
                    (Some(x), _) => x + v,
                });
            }
            let mut v = acc.unwrap();
            if a.src == kernels::SRC_REDUCE && a.op == ReduceOp::Avg as i32 {
                v /= npes as f64;
            }
            mems[team[q]].write(addr(a.out_base, i), v)?;
        }
    }
    // Every sender reads all it pushes, used or not: it must lie in its buffers.
    for (p, ap) in args.iter().enumerate() {
        for q in (0..npes).filter(|&q| q != p) {
            let (lo, hi) = out_range(ap, npes, q);
            for i in ap.in_lo.max(lo)..ap.in_hi.min(hi) {
                before[p].read(addr(ap.in_base, i))?;
            }
        }
    }
    Ok(())
}

/// Elements per staging slot in the model: small, so stages run in several windows and the
/// parts of different nodes and rails often need different numbers of them.
const SLOT_ELEMS: usize = 7;

fn span(rank: usize, world: usize, per_node: usize) -> Span {
    Span { rank, world, per_node, slot_bytes: SLOT_ELEMS * esz() as usize }
}

/// The lengths of a stage's windows, launch by launch, as `NvshmemCommunicator::enqueue`
/// makes them (padded to the stage's launches).
fn window_lengths(s: &Stage) -> Vec<usize> {
    crate::nvshmem::windows::padded(s.args.count as usize, SLOT_ELEMS, false, s.launches)
        .map(|w| w.hi - w.lo)
        .collect()
}

/// Runs every PE's stages to the end: a team launches when each of its members has a stage on
/// it next. Each stage counts as its launches (one per window, or its padded count): the
/// members of a team must then be at the same launch count (the kernel's epoch) and make as
/// many launches, and every PE must end at the same count. An error when the plans cannot all
/// finish (the GPUs would hang).
fn run(world: usize, per_node: usize, mems: &mut [Memory], plans: Vec<Vec<Stage>>) -> Result<(), String> {
    let mut next = vec![0usize; world];
    let mut epoch = vec![0usize; world];
    loop {
        let mut progressed = false;
        for pe in 0..world {
            let Some(stage) = plans[pe].get(next[pe]) else { continue };
            let team = members(stage.kind, pe, world, per_node);
            if team.iter().all(|&m| plans[m].get(next[m]).is_some_and(|s| s.kind == stage.kind)) {
                let stages: Vec<&Stage> = team.iter().map(|&m| &plans[m][next[m]]).collect();
                let counts: Vec<(usize, usize)> = team
                    .iter()
                    .zip(&stages)
                    .map(|(&m, s)| (epoch[m], launches(s.args.count as usize, SLOT_ELEMS).max(s.launches)))
                    .collect();
                if counts.iter().any(|c| *c != counts[0]) {
                    return Err(format!(
                        "team {team:?} out of step: (launches so far, launches of this stage) {counts:?}"
                    ));
                }
                // The kernel's block b waits for block b of every member, and a launch's grid
                // follows its window's length (kernels::blocks_for): the members' windows must
                // match launch by launch, or some block would wait for one that does not exist.
                let grids: Vec<Vec<usize>> = stages.iter().map(|s| window_lengths(s)).collect();
                if grids.iter().any(|g| *g != grids[0]) {
                    return Err(format!("team {team:?} launches different grids: window lengths {grids:?}"));
                }
                let args: Vec<CollArgs> = stages.iter().map(|s| s.args).collect();
                launch(&team, &args, mems)?;
                for &m in &team {
                    next[m] += 1;
                    epoch[m] += counts[0].1;
                }
                progressed = true;
            }
        }
        if (0..world).all(|pe| next[pe] == plans[pe].len()) {
            // The next collective's launches must find every PE at the same count too.
            if epoch.iter().any(|&e| e != epoch[0]) {
                return Err(format!("the PEs end out of step: launches {epoch:?}"));
            }
            return Ok(());
        }
        if !progressed {
            let stuck: Vec<_> = (0..world).map(|pe| plans[pe].get(next[pe]).map(|s| s.kind)).collect();
            return Err(format!("the plans hang; each PE's next stage: {stuck:?}"));
        }
    }
}

fn view(ptr: u64, len: usize) -> CudaView {
    let dtype = if esz() == 2 { DType::BF16 } else { DType::F32 };
    CudaView { ptr, len, dtype }
}

fn buffer(vals: &[f64]) -> Vec<Option<f64>> {
    vals.iter().map(|&v| Some(v)).collect()
}

fn combine(op: ReduceOp, xs: impl Iterator<Item = f64>, n: usize) -> f64 {
    let xs: Vec<f64> = xs.collect();
    match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
        ReduceOp::Max => xs.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::Min => xs.iter().cloned().fold(f64::MAX, f64::min),
    }
}

fn close(got: Option<f64>, want: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() <= 1e-9 * want.abs().max(1.0))
}

/// Small integers, whose sums are exact in any order.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.below(101) as f64 - 50.0).collect()
    }
}

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// Every layout the backend takes across nodes (2-8 nodes of 1-8 PEs), with lengths below,
/// at and above the world size, in f32 and bf16.
fn layouts() -> impl Iterator<Item = (usize, usize, usize)> {
    let cases = (1..=8).flat_map(|per_node| {
        (2..=8).flat_map(move |nodes| {
            let world = per_node * nodes;
            [1, world - 1, world, 2 * world + 3, 97]
                .into_iter()
                .filter(|&l| l > 0)
                .map(move |len| (world, per_node, len))
        })
    });
    // Every case with 4-byte elements, then with 2-byte ones (set for the case's thread).
    [4u64, 2].into_iter().flat_map(move |bytes| cases.clone().inspect(move |_| ESZ.with(|e| e.set(bytes))))
}

#[test]
fn all_reduce_across_nodes_matches_the_reference() {
    let mut rng = Rng(0x9e37_79b9);
    for (world, per_node, len) in layouts() {
        let op = OPS[rng.below(4)];
        let inputs: Vec<Vec<f64>> = (0..world).map(|_| rng.values(len)).collect();
        let mut mems: Vec<Memory> =
            inputs.iter().map(|x| Memory { bufs: [(INPUT, buffer(x))].into() }).collect();
        let plans =
            (0..world).map(|rank| hier::all_reduce(&span(rank, world, per_node), &view(INPUT, len), op));
        run(world, per_node, &mut mems, plans.collect())
            .unwrap_or_else(|e| panic!("{world}/{per_node}/{len}: {e}"));
        for (pe, m) in mems.iter().enumerate() {
            for i in 0..len {
                let want = combine(op, inputs.iter().map(|x| x[i]), world);
                assert!(close(m.bufs[&INPUT][i], want), "{op:?} {world}/{per_node} len {len}: PE {pe} [{i}]");
            }
        }
    }
}

#[test]
fn broadcast_across_nodes_matches_the_reference() {
    let mut rng = Rng(0x1234_5678);
    for (world, per_node, len) in layouts() {
        let root = rng.below(world);
        let inputs: Vec<Vec<f64>> = (0..world).map(|_| rng.values(len)).collect();
        let mut mems: Vec<Memory> =
            inputs.iter().map(|x| Memory { bufs: [(INPUT, buffer(x))].into() }).collect();
        let plans =
            (0..world).map(|rank| hier::broadcast(&span(rank, world, per_node), &view(INPUT, len), root));
        run(world, per_node, &mut mems, plans.collect())
            .unwrap_or_else(|e| panic!("{world}/{per_node}/{len}: {e}"));
        for (pe, m) in mems.iter().enumerate() {
            assert_eq!(
                m.bufs[&INPUT],
                buffer(&inputs[root]),
                "{world}/{per_node} len {len} root {root}: PE {pe}"
            );
        }
    }
}

#[test]
fn reduce_across_nodes_matches_the_reference_and_leaves_the_others_alone() {
    let mut rng = Rng(0xdead_beef);
    for (world, per_node, len) in layouts() {
        let (root, op) = (rng.below(world), OPS[rng.below(4)]);
        let inputs: Vec<Vec<f64>> = (0..world).map(|_| rng.values(len)).collect();
        let mut mems = Vec::new();
        let mut plans = Vec::new();
        for (rank, x) in inputs.iter().enumerate() {
            let s = span(rank, world, per_node);
            let mut m = Memory { bufs: [(INPUT, buffer(x))].into() };
            let need = hier::reduce_scratch(&s, len, root);
            if need > 0 {
                m.bufs.insert(SCRATCH, vec![None; need]);
            }
            mems.push(m);
            plans.push(hier::reduce(
                &s,
                &view(INPUT, len),
                root,
                op,
                if need > 0 { SCRATCH } else { NO_SCRATCH },
            ));
        }
        run(world, per_node, &mut mems, plans).unwrap_or_else(|e| panic!("{world}/{per_node}/{len}: {e}"));
        for (pe, m) in mems.iter().enumerate() {
            for i in 0..len {
                let want =
                    if pe == root { combine(op, inputs.iter().map(|x| x[i]), world) } else { inputs[pe][i] };
                assert!(
                    close(m.bufs[&INPUT][i], want),
                    "{op:?} {world}/{per_node} len {len} root {root}: PE {pe} [{i}]"
                );
            }
        }
    }
}

#[test]
fn all_gather_across_nodes_matches_the_reference() {
    let mut rng = Rng(0x0bad_cafe);
    for (world, per_node, len) in layouts() {
        let whole = rng.values(len);
        let mut mems = Vec::new();
        let mut plans = Vec::new();
        for rank in 0..world {
            let shard = shard_range(len, world, rank);
            let bufs = [(INPUT, buffer(&whole[shard.clone()])), (OUTPUT, vec![None; len])];
            mems.push(Memory { bufs: bufs.into() });
            let s = span(rank, world, per_node);
            plans.push(hier::all_gather(&s, &view(OUTPUT, len), &view(INPUT, shard.len())));
        }
        run(world, per_node, &mut mems, plans).unwrap_or_else(|e| panic!("{world}/{per_node}/{len}: {e}"));
        for (pe, m) in mems.iter().enumerate() {
            assert_eq!(m.bufs[&OUTPUT], buffer(&whole), "{world}/{per_node} len {len}: PE {pe}");
        }
    }
}

#[test]
fn reduce_scatter_across_nodes_matches_the_reference_and_keeps_the_input() {
    let mut rng = Rng(0x5eed_5eed);
    for (world, per_node, len) in layouts() {
        let op = OPS[rng.below(4)];
        let inputs: Vec<Vec<f64>> = (0..world).map(|_| rng.values(len)).collect();
        let mut mems = Vec::new();
        let mut plans = Vec::new();
        for (rank, x) in inputs.iter().enumerate() {
            let s = span(rank, world, per_node);
            let shard = shard_range(len, world, rank);
            let mut m = Memory { bufs: [(INPUT, buffer(x)), (OUTPUT, vec![None; shard.len()])].into() };
            let need = hier::reduce_scatter_scratch(&s, len);
            if need > 0 {
                m.bufs.insert(SCRATCH, vec![None; need]);
            }
            mems.push(m);
            let scratch = if need > 0 { SCRATCH } else { NO_SCRATCH };
            plans.push(hier::reduce_scatter(&s, &view(OUTPUT, shard.len()), &view(INPUT, len), op, scratch));
        }
        run(world, per_node, &mut mems, plans).unwrap_or_else(|e| panic!("{world}/{per_node}/{len}: {e}"));
        for (pe, m) in mems.iter().enumerate() {
            assert_eq!(
                m.bufs[&INPUT],
                buffer(&inputs[pe]),
                "{world}/{per_node} len {len}: PE {pe}'s input changed"
            );
            for (k, i) in shard_range(len, world, pe).enumerate() {
                let want = combine(op, inputs.iter().map(|x| x[i]), world);
                assert!(
                    close(m.bufs[&OUTPUT][k], want),
                    "{op:?} {world}/{per_node} len {len}: PE {pe} [{i}]"
                );
            }
        }
    }
}

#[test]
fn the_barrier_finishes_on_every_layout() {
    for (world, per_node, _) in layouts().filter(|l| l.2 == 1) {
        let mut mems = vec![Memory::default(); world];
        run(world, per_node, &mut mems, vec![hier::barrier(); world]).unwrap();
    }
}

// The model must be able to fail: plans that hang, that get out of step, or that leave a
// receiver without its data.
#[test]
fn the_model_catches_plans_that_hang_or_lose_data() {
    let (world, per_node, len) = (8, 4, 16);
    let mems = || -> Vec<Memory> {
        (0..world).map(|_| Memory { bufs: [(INPUT, vec![Some(1.0); len])].into() }).collect()
    };
    let broadcast_without = |who: usize, stage: usize| -> Vec<Vec<Stage>> {
        (0..world)
            .map(|rank| {
                let mut p = hier::broadcast(&span(rank, world, per_node), &view(INPUT, len), 1);
                if rank == who {
                    p.remove(stage);
                }
                p
            })
            .collect()
    };
    // A PE that leaves out its node's last stage: the node waits for it forever.
    assert!(run(world, per_node, &mut mems(), broadcast_without(5, 1)).unwrap_err().contains("hang"));
    // One that leaves out the rail stage joins its node's stage launches early.
    assert!(run(world, per_node, &mut mems(), broadcast_without(5, 0)).unwrap_err().contains("out of step"));
    // Without padding, the node stages of all_gather take as many windows as each node's region
    // needs: nodes whose regions need fewer are behind at the next rail stage.
    let unpadded = |rank: usize, world: usize, per_node: usize, len: usize| -> Vec<Stage> {
        let s = span(rank, world, per_node);
        let shard = shard_range(len, world, rank).len();
        let mut p = hier::all_gather(&s, &view(OUTPUT, len), &view(INPUT, shard));
        p.iter_mut().for_each(|st| st.launches = 0);
        p
    };
    let out_of_step = layouts().filter(|&(world, per_node, len)| {
        let mut mems: Vec<Memory> = (0..world)
            .map(|r| {
                let shard = vec![Some(1.0); shard_range(len, world, r).len()];
                Memory { bufs: [(INPUT, shard), (OUTPUT, vec![None; len])].into() }
            })
            .collect();
        let plans = (0..world).map(|r| unpadded(r, world, per_node, len)).collect();
        run(world, per_node, &mut mems, plans).is_err_and(|e| e.contains("out of step"))
    });
    assert!(out_of_step.count() > 0);
    // A sender that keeps part of its input back.
    let plans = (0..world)
        .map(|rank| {
            let mut p = hier::all_reduce(&span(rank, world, per_node), &view(INPUT, len), ReduceOp::Sum);
            if rank == 2 {
                p[0].args.in_hi = 3;
            }
            p
        })
        .collect();
    assert!(run(world, per_node, &mut mems(), plans).unwrap_err().contains("never sent"));
    // A rail member that takes one element less in the rail stage: as many launches, but its
    // last window (so its last grid) is shorter than its peers'.
    let plans = (0..world)
        .map(|rank| {
            let mut p = hier::all_reduce(&span(rank, world, per_node), &view(INPUT, len), ReduceOp::Sum);
            if rank == 1 {
                p[1].args.count -= 1;
            }
            p
        })
        .collect();
    assert!(run(world, per_node, &mut mems(), plans).unwrap_err().contains("different grids"));
}
