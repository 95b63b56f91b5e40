//! What a CPU backend implements: synchronous collectives on contiguous host slices.
//! [`crate::CpuCommunicator`] adds the tensor handling, the worker thread, the ordering
//! and the checking mode once for all of them.

use crate::element::ReduceElement;
use crate::error::Result;
use crate::op::ReduceOp;

pub(crate) trait CpuEngine: 'static {
    fn all_reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()>;
    /// Only `root`'s `data` receives the result; the others keep their input.
    fn reduce<T: ReduceElement>(&mut self, data: &mut [T], op: ReduceOp, root: usize) -> Result<()>;
    /// `output` is this rank's [`crate::shard_range`] of the reduced `input`.
    fn reduce_scatter<T: ReduceElement>(&mut self, input: &[T], output: &mut [T], op: ReduceOp)
        -> Result<()>;
    /// `input` is this rank's shard (in elements of `elem_size` bytes) of `output`.
    fn all_gather(&mut self, input: &[u8], output: &mut [u8], elem_size: usize) -> Result<()>;
    fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()>;
    fn barrier(&mut self) -> Result<()>;
    /// Tells peers this rank gives up, so they fail at once instead of at their timeout.
    fn abort(&mut self);
    /// Marks a clean exit (the communicator was dropped).
    fn leave(&mut self);
}
