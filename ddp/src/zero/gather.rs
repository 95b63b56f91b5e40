//! The all-gather of the updated parameters at the end of a ZeRO-1 step, overlapped with the
//! next forward (FSDP's and DeepSpeed's prefetch with a wait before the layer runs).
//!
//! `launch` starts one gather per bucket and, with overlap on, returns without waiting: each
//! bucket is a [`PendingValue`] armed on the [`ValueGate`] of every `Parameter` of the module
//! that lies in it. The first read of such a parameter (the forward reaching its layer, a
//! `state_dict`, anything going through `Parameter::var` / `tensor`) waits for the bucket's
//! gather and copies the whole bucket into its parameters. Whatever the forward never reads is
//! resolved by the next step's `wait` (and by the optimizer's other readers and its drop).
//!
//! On CPU backends the wait blocks until the communicator's worker has finished the gather;
//! on GPU backends (`nccl`, `nvshmem`) `Work::wait` orders the reading thread's current stream
//! after the gather, and the copy is queued on that stream behind it, so the host never blocks.

use super::{same_parameter, GradShards, Piece};
use crate::error::tensor_error;
use crate::reducer::Reducer;
use crate::{DdpError, Result};
use oxtrain_autograd::Var;
use oxtrain_comm::{Communicator, Work};
use oxtrain_nn::{PendingValue, ValueGate};
use oxtrain_tensor::Tensor;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The first error of a gather, kept until a fallible call can return it.
type ErrorSlot = Arc<Mutex<Option<DdpError>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One bucket's gather: this rank's updated slices in, the whole bucket out.
struct BucketGather {
    own: Tensor,
    gathered: Tensor,
    /// The bucket's parameters (the reducer's clones of the leaves: same storage as the
    /// module's) and the range of each in the flat bucket.
    params: Vec<(Var, Range<usize>)>,
    /// The gather in flight; taken (under this lock) by the one resolve that waits for it.
    work: Mutex<Option<Work>>,
    error: ErrorSlot,
}

impl PendingValue for BucketGather {
    /// Runs inside `Parameter::var`, which returns no `Result`: a failed gather leaves the
    /// bucket's parameters as they were and keeps the error for the optimizer's next fallible
    /// call (`try_step`, `wait_parameters`). Panicking here instead would unwind through the
    /// model's forward, possibly on another thread, while the step that follows has to fail
    /// anyway: the error then comes back where training code already handles the collectives'.
    fn resolve(&self) {
        // Held while copying: a second reader of the bucket waits until the values are in.
        let mut work = lock(&self.work);
        let Some(w) = work.take() else { return };
        match w.wait() {
            Ok(()) => {
                for (p, range) in &self.params {
                    let whole = self.gathered.narrow(0, range.start, range.len());
                    p.tensor().copy_(&whole.reshape(p.dims()));
                }
            }
            Err(e) => {
                lock(&self.error).get_or_insert(e.into());
            }
        }
    }
}

/// Every bucket's gather, and the gates that make the next reader of a parameter wait.
pub(super) struct ParamGather {
    buckets: Vec<Arc<BucketGather>>,
    /// Per bucket, the gates of the module's `Parameter`s in it (a tied weight has one per
    /// name). Empty when the gathers are waited for in the step (overlap off).
    gates: Vec<Vec<Arc<ValueGate>>>,
    overlap: bool,
    error: ErrorSlot,
}

impl ParamGather {
    /// Buffers for every bucket of `reducer`. `gates`: every `Parameter` of the module with
    /// its gate (`oxtrain_nn::parameter_gates`), or `None` to wait in the step. Overlap needs
    /// a gate for every reduced parameter: one the module's walk does not show would be read
    /// without a wait, so then the gathers are waited for in the step.
    pub fn new(
        reducer: &Reducer,
        shards: &GradShards,
        gates: Option<Vec<(Var, Arc<ValueGate>)>>,
    ) -> Result<Self> {
        let device = shards.overflow.device();
        let error = ErrorSlot::default();
        let mut params: Vec<Vec<(Var, Range<usize>)>> = reducer.buckets.iter().map(|_| Vec::new()).collect();
        for (p, slot) in reducer.params.iter().zip(&reducer.slots) {
            params[slot.bucket].push((p.clone(), slot.offset..slot.offset + slot.len));
        }
        let mut buckets = Vec::new();
        for ((b, s), params) in reducer.buckets.iter().zip(&shards.buckets).zip(params) {
            let own =
                Tensor::zeros(s.range.len(), s.grad.dtype(), device).map_err(tensor_error("a shard"))?;
            let gathered =
                reducer.comm.symmetric_tensor(b.flat.elem_count().into(), b.flat.dtype(), device)?;
            let work = Mutex::new(None);
            buckets.push(Arc::new(BucketGather { own, gathered, params, work, error: error.clone() }));
        }
        let mut per_bucket: Vec<Vec<Arc<ValueGate>>> = reducer.buckets.iter().map(|_| Vec::new()).collect();
        let mut gated = vec![false; reducer.params.len()];
        for (var, gate) in gates.iter().flatten() {
            if let Some(i) = reducer.params.iter().position(|q| same_parameter(q, var)) {
                per_bucket[reducer.slots[i].bucket].push(gate.clone());
                gated[i] = true;
            }
        }
        let overlap = gates.is_some() && gated.iter().all(|&g| g);
        if !overlap {
            per_bucket.iter_mut().for_each(Vec::clear);
        }
        Ok(ParamGather { buckets, gates: per_bucket, overlap, error })
    }

    /// Packs this rank's updated slices and launches every bucket's gather; with overlap on,
    /// arms the gates and returns, else waits for all. Call only with nothing pending (after
    /// [`ParamGather::wait`]): the slices are written into the gathers' inputs.
    pub fn launch(&self, comm: &dyn Communicator, pieces: &[Piece]) -> Result<()> {
        for pc in pieces {
            self.buckets[pc.bucket].own.narrow(0, pc.at_shard, pc.len).copy_(pc.var.tensor());
        }
        // Buckets hold the parameters in reverse registration order, so the forward first reads
        // the last bucket: launching from the last makes the gather waited for first the one
        // that finishes first. Every rank launches in this same order.
        let mut launch_failed = false;
        for b in self.buckets.iter().rev() {
            let work = comm.all_gather(&b.gathered, &b.own).unwrap_or_else(|e| {
                launch_failed = true;
                Work::done(Err(e))
            });
            *lock(&b.work) = Some(work);
        }
        if launch_failed || !self.overlap {
            return self.wait();
        }
        for (b, gates) in self.buckets.iter().zip(&self.gates) {
            for g in gates {
                g.arm(b.clone());
            }
        }
        Ok(())
    }

    /// Waits for every gather still pending and fills its parameters; then the first error of
    /// a gather since the last call, if one failed (the failed buckets' parameters are left as
    /// they were).
    pub fn wait(&self) -> Result<()> {
        self.resolve_all();
        self.take_error().map_or(Ok(()), Err)
    }

    /// [`ParamGather::wait`] that keeps the error for the next fallible call (for `Drop` and
    /// the readers that return no `Result`).
    pub fn resolve_all(&self) {
        for b in self.buckets.iter().rev() {
            b.resolve();
        }
        // Their buckets are resolved: this only opens the gates.
        for g in self.gates.iter().flatten() {
            g.pass();
        }
    }

    /// Takes the error a gather left, if any.
    pub fn take_error(&self) -> Option<DdpError> {
        lock(&self.error).take()
    }

    /// How many buckets' gathers have not been waited for yet.
    pub fn pending(&self) -> usize {
        self.buckets.iter().filter(|b| lock(&b.work).is_some()).count()
    }

    /// Whether the gathers overlap the next forward (else the step waits for them).
    pub fn overlaps(&self) -> bool {
        self.overlap
    }
}
