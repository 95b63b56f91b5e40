//! Reduction operators and how a buffer is split among ranks.

use std::ops::Range;

/// How values from all ranks combine (`torch.distributed.ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size, computed in the accumulation type.
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    pub(crate) fn code(self) -> u64 {
        self as u64
    }

    pub(crate) fn from_code(code: u64) -> Option<ReduceOp> {
        [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min].get(code as usize).copied()
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The elements of a buffer of `len` elements that `rank` owns in reduce_scatter and
/// all_gather: contiguous, balanced, the first `len % world` ranks one element longer.
/// When `world` divides `len` this is torch's `len / world` elements per rank.
pub fn shard_range(len: usize, world: usize, rank: usize) -> Range<usize> {
    assert!(rank < world, "shard_range: rank {rank} out of range for world size {world}");
    let base = len / world;
    let extra = len % world;
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_in_order() {
        for len in 0..40 {
            for world in 1..6 {
                let mut next = 0;
                for r in 0..world {
                    let s = shard_range(len, world, r);
                    assert_eq!(s.start, next);
                    assert!(s.len() == len / world || s.len() == len / world + 1);
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
