//! Checking mode: before a collective, ranks exchange what they are about to call and fail
//! together, naming the ranks and the difference, when the calls do not match. Without it
//! a mismatch shows up as a timeout or as wrong numbers.

use crate::engine::CpuEngine;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;
use crate::request::Request;
use oxtrain_tensor::DType;
use std::collections::BTreeMap;

const DTYPES: [DType; 8] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U32, DType::U8, DType::Bool];
const KINDS: [&str; 6] = ["all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"];
const NONE: u64 = u64::MAX;

/// kind, dtype, elements, op, root: what must agree across ranks.
pub(crate) type Signature = [u64; 5];

fn dtype_code(d: DType) -> u64 {
    DTYPES.iter().position(|&x| x == d).map_or(NONE, |i| i as u64)
}

pub(crate) fn signature(req: &Request) -> Signature {
    let kind = KINDS.iter().position(|&k| k == req.name()).unwrap_or(0) as u64;
    match req {
        Request::AllReduce { tensor, op } => {
            [kind, dtype_code(tensor.dtype()), tensor.elem_count() as u64, op.code(), NONE]
        }
        Request::Reduce { tensor, op, root } => {
            [kind, dtype_code(tensor.dtype()), tensor.elem_count() as u64, op.code(), *root as u64]
        }
        // The full buffer's length: each rank's shard differs by design when it does not divide.
        Request::ReduceScatter { input, op, .. } => {
            [kind, dtype_code(input.dtype()), input.elem_count() as u64, op.code(), NONE]
        }
        Request::AllGather { output, .. } => {
            [kind, dtype_code(output.dtype()), output.elem_count() as u64, NONE, NONE]
        }
        Request::Broadcast { tensor, root } => {
            [kind, dtype_code(tensor.dtype()), tensor.elem_count() as u64, NONE, *root as u64]
        }
        Request::Barrier => [kind, NONE, NONE, NONE, NONE],
    }
}

pub(crate) fn describe(s: &Signature) -> String {
    let kind = KINDS.get(s[0] as usize).copied().unwrap_or("?");
    if kind == "barrier" {
        return "barrier()".into();
    }
    let mut parts = vec![];
    if let Some(d) = DTYPES.get(s[1] as usize) {
        parts.push(d.to_string());
    }
    parts.push(format!("{} elements", s[2]));
    if let Some(op) = ReduceOp::from_code(s[3]) {
        parts.push(format!("op {op}"));
    }
    if s[4] != NONE {
        parts.push(format!("root {}", s[4]));
    }
    format!("{kind}({})", parts.join(", "))
}

/// Exchanges signatures and returns a [`CommError::Mismatch`] naming each group of ranks.
pub(crate) fn compare<E: CpuEngine>(e: &mut E, req: &Request, rank: usize, world: usize) -> Result<()> {
    let mine = signature(req);
    let mut all = vec![0u64; 5 * world];
    let out: &mut [u8] = bytemuck::cast_slice_mut(&mut all);
    e.all_gather(bytemuck::cast_slice(&mine), out, 8)?;
    let _ = rank;
    let mut groups: BTreeMap<Signature, Vec<usize>> = BTreeMap::new();
    for (r, s) in all.chunks_exact(5).enumerate() {
        groups.entry(s.try_into().expect("five words")).or_default().push(r);
    }
    if groups.len() == 1 {
        return Ok(());
    }
    let detail = groups
        .iter()
        .map(|(s, ranks)| format!("rank(s) {ranks:?} called {}", describe(s)))
        .collect::<Vec<_>>()
        .join("; ");
    Err(CommError::Mismatch { op: req.name().to_string(), detail })
}
