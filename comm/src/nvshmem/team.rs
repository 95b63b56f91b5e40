//! Teams: the groups of PEs one collective launch runs over, each with staging sets of its own.
//!
//! - `All` (one node only): every PE, for every op.
//! - `Ll` (one node only): every PE, for the low-latency all-reduce's flagged lines.
//! - `Node` and `Rail` (several nodes only): the PEs of this node (stores over NVLink), and the
//!   PEs of every node with this PE's local rank (NVSHMEM puts, which its proxy carries between
//!   nodes). Every op runs as stages on these two (`hier.rs`).
//!
//! Why each kind has its own staging and its own launch count (whose parity picks the set): the
//! kernels reuse a set two launches later, which is safe because the launch in between saw a
//! signal from every member of the team, raised only once that member had finished the launch
//! before. That holds only when consecutive launches over a set involve the same members.

use super::host::{self, Api};
use super::kernels::MAX_PES;
use crate::error::{CommError, Result};
use crate::gpu::cuda_err;
use cudarc::driver::result as drv;
use std::ffi::c_void;

/// Which team (and staging) a launch uses; also the index of its launch counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    All = 0,
    Ll = 1,
    Node = 2,
    Rail = 3,
}

pub(crate) struct Team {
    /// Global PEs, ascending.
    pub members: Vec<usize>,
    /// This PE's index in `members`.
    pub me: usize,
    /// `members` as the kernels take them.
    pub pes: [i32; MAX_PES],
    /// Bit i: member i is on another node (reached by puts).
    pub put_mask: i32,
    /// Symmetric base of the two sets (parity 0 then 1).
    base: u64,
    /// For a team whose members are on other nodes: a slot's worth of heap that launches copy
    /// their input into before putting it (`windows::through_heap`); 0 otherwise.
    pub source: u64,
    /// Per parity, every member's set as seen here (nvshmem_ptr; 0 for members reached by puts).
    pub sets: [[u64; MAX_PES]; 2],
    pub slot_bytes: usize,
}

impl Team {
    /// Allocates two staging sets of one slot per member (collective: every PE calls this
    /// with the same sizes in the same order) and looks up the members' addresses. `remote(pe)`
    /// says whether `pe` is on another node.
    ///
    /// # Safety
    /// NVSHMEM is initialised and this GPU's context is current.
    pub unsafe fn new(
        api: &Api,
        rank: usize,
        members: Vec<usize>,
        remote: impl Fn(usize) -> bool,
        slot_bytes: usize,
    ) -> Result<Team> {
        assert!(members.len() <= MAX_PES, "a team has at most {MAX_PES} members");
        let me = members.iter().position(|&p| p == rank).expect("a team holds its own PE");
        let set_bytes = slot_bytes * members.len();
        let base = (api.malloc)(2 * set_bytes) as u64;
        if base == 0 {
            return Err(CommError::Unsupported(format!(
                "nvshmem: nvshmem_malloc of {} MiB of staging failed: raise NVSHMEM_SYMMETRIC_SIZE or lower \
                 OXTRAIN_NVSHMEM_CHUNK_BYTES and OXTRAIN_NVSHMEM_LL_MAX_BYTES",
                (2 * set_bytes) >> 20
            )));
        }
        // Zeroed: the low-latency flags must not match an epoch before they are written.
        drv::memset_d8_sync(base, 0, 2 * set_bytes)
            .map_err(|e| cuda_err("zeroing staging", format!("{e:?}")))?;
        let mut sets = [[0u64; MAX_PES]; 2];
        let mut put_mask = 0;
        for (parity, row) in sets.iter_mut().enumerate() {
            let set = base + (parity * set_bytes) as u64;
            for (i, &pe) in members.iter().enumerate() {
                if pe != rank && remote(pe) {
                    put_mask |= 1 << i;
                    continue;
                }
                let a = (api.ptr)(set as *const c_void, pe as i32) as u64;
                if a == 0 {
                    return Err(CommError::Unsupported(format!(
                        "nvshmem: PE {pe}'s memory is not reachable by load/store from PE {rank} (nvshmem_ptr is null) \
                         though both are on one node: the GPUs of a node need peer access (NVLink); set \
                         OXTRAIN_NVSHMEM_RANKS_PER_NODE (or LOCAL_WORLD_SIZE) to the GPUs per node"
                    )));
                }
                row[i] = a;
            }
        }
        let mut pes = [0i32; MAX_PES];
        for (slot, &pe) in pes.iter_mut().zip(&members) {
            *slot = pe as i32;
        }
        // Collective like the sets: every PE's team has members on other nodes, or none has.
        let mut source = 0;
        if put_mask != 0 {
            source = (api.malloc)(slot_bytes) as u64;
            if source == 0 {
                (api.free)(base as *mut c_void);
                return Err(CommError::Unsupported(format!(
                    "nvshmem: nvshmem_malloc of {} MiB for puts between nodes failed: raise NVSHMEM_SYMMETRIC_SIZE",
                    slot_bytes >> 20
                )));
            }
        }
        Ok(Team { members, me, pes, put_mask, base, source, sets, slot_bytes })
    }

    /// Frees the staging (collective, in the order of allocation).
    ///
    /// # Safety
    /// No kernel uses the staging any more.
    pub unsafe fn free(&self, api: &host::Api) {
        (api.free)(self.base as *mut c_void);
        if self.source != 0 {
            (api.free)(self.source as *mut c_void);
        }
    }
}

/// The node layout of `world` PEs with `per_node` per node, numbered node by node (torchrun's
/// and mpirun's default): (this node's members, this rail's members).
pub(crate) fn layout(rank: usize, world: usize, per_node: usize) -> (Vec<usize>, Vec<usize>) {
    let node = rank / per_node;
    let local = rank % per_node;
    (
        (node * per_node..(node + 1) * per_node).collect(),
        (0..world / per_node).map(|n| n * per_node + local).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::layout;

    #[test]
    fn nodes_and_rails_follow_node_major_numbering() {
        // 2 nodes of 4: rank 6 is local rank 2 of node 1.
        assert_eq!(layout(6, 8, 4), (vec![4, 5, 6, 7], vec![2, 6]));
        assert_eq!(layout(0, 8, 4), (vec![0, 1, 2, 3], vec![0, 4]));
        // One GPU per node: the node is the PE alone, the rail is everyone.
        assert_eq!(layout(1, 2, 1), (vec![1], vec![0, 1]));
        // One node: the rail is the PE alone.
        assert_eq!(layout(1, 2, 2), (vec![0, 1], vec![1]));
    }
}
