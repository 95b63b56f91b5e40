//! A collective call as data: what a CPU communicator's worker executes and what checking
//! mode compares across ranks. Below both, so neither imports the other.

use crate::op::ReduceOp;
use oxtrain_tensor::Tensor;

/// A collective call, as data: what the worker thread executes and what checking mode
/// compares across ranks.
pub(crate) enum Request {
    AllReduce { tensor: Tensor, op: ReduceOp },
    Reduce { tensor: Tensor, op: ReduceOp, root: usize },
    ReduceScatter { output: Tensor, input: Tensor, op: ReduceOp },
    AllGather { output: Tensor, input: Tensor },
    Broadcast { tensor: Tensor, root: usize },
    Barrier,
}

impl Request {
    pub fn name(&self) -> &'static str {
        match self {
            Request::AllReduce { .. } => "all_reduce",
            Request::Reduce { .. } => "reduce",
            Request::ReduceScatter { .. } => "reduce_scatter",
            Request::AllGather { .. } => "all_gather",
            Request::Broadcast { .. } => "broadcast",
            Request::Barrier => "barrier",
        }
    }
}
