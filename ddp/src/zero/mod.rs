//! ZeRO-1 (DeepSpeed's stage 1, PyTorch's `ZeroRedundancyOptimizer` over DDP's buckets): each
//! rank keeps the optimizer state of one shard of every gradient bucket.
//!
//! With `DdpConfig { shard_optimizer: true, .. }` the reducer launches a bucket's
//! `reduce_scatter` (instead of its all-reduce) the moment the bucket is ready, so rank r ends
//! backward with the averaged gradient of [`shard_range`]`(bucket length, world, r)` only.
//! [`ZeroOptimizer`] steps the parameters' slices that fall in those shards, then all-gathers
//! every bucket's updated slices back into the whole parameters (below: when they are waited for).
//!
//! The inner optimizer runs, unchanged, over one parameter per slice: a `Var` whose tensor is
//! a view of the model parameter's memory (flattened, narrowed to the slice) and whose
//! gradient is a view of the reduced shard. SGD and AdamW update element by element, so a
//! slice steps exactly as the same elements of the whole parameter; their state (momentum,
//! moments) exists for the slice only. Running the optimizer over one flat tensor per bucket
//! instead would mix parameter groups (weight decay on and off) in one tensor. LARS's trust
//! ratio needs norms over whole parameters, which no slice has: every rank's sums of squares
//! over its slices are all-reduced before the step and handed to it
//! ([`Optimizer::set_whole_parameter_norms`]).
//!
//! The all-gather overlaps the next forward (`DdpConfig::overlap_param_gather`, on by
//! default): `step` launches one gather per bucket and returns. Each `Parameter` of the module
//! has a gate ([`oxtrain_nn::ValueGate`]) that the step arms; the first read of a parameter
//! (`Parameter::var` in the forward, `state_dict`, ...) waits for its bucket's gather and
//! fills that bucket's parameters, so the forward's first layers wait only for their own
//! bucket while the later ones are still gathered. The next `step`, [`ZeroOptimizer::clip_grad_norm_`],
//! [`ZeroOptimizer::shard_state`], [`ZeroOptimizer::load_shard_states`] and drop wait for
//! whatever no one read; [`ZeroOptimizer::wait_parameters`] does it on demand (before reading
//! parameters through `Var`s cloned earlier, which pass no gate). A gather that failed is
//! returned by the next of those calls that returns a `Result`. With the option off, `step`
//! waits for every gather before it returns, as before.

mod gather;
mod state;

pub use state::ShardState;

use crate::bucket::Bucket;
use crate::error::tensor_error;
use crate::reducer::Reducer;
use crate::{Compression, DdpError, DistributedDataParallel, Result};
use gather::ParamGather;
use oxtrain_autograd::{no_grad, Var};
use oxtrain_comm::{shard_range, Communicator, ReduceOp};
use oxtrain_nn::optim::{IntoParamGroups, Optimizer, OptimizerState, ParamGroupSpec};
use oxtrain_nn::{parameter_gates, Module};
use oxtrain_tensor::{DType, Device, Tensor};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// This rank's shard of one bucket: where it lies in the flat bucket, and its reduced gradient.
pub(crate) struct ShardBucket {
    pub range: Range<usize>,
    pub grad: Tensor,
}

/// The reducer's side of ZeRO-1: the reduce-scatter outputs, and the overflow flag every rank
/// agrees on.
pub(crate) struct GradShards {
    pub buckets: Vec<ShardBucket>,
    /// One element: 0 when every rank's reduced shard is finite, NaN otherwise.
    pub overflow: Tensor,
    /// A [`ZeroOptimizer`] steps the shards; without one a plain optimizer would step with
    /// unreduced gradients, so backward refuses to finish.
    pub attached: AtomicBool,
}

impl GradShards {
    pub fn new(comm: &dyn Communicator, buckets: &[Bucket], compression: Compression) -> Result<GradShards> {
        if compression != Compression::None {
            return Err(DdpError::ShardedCompression);
        }
        let (world, rank) = (comm.world_size(), comm.rank());
        let buckets = buckets
            .iter()
            .map(|b| {
                let range = shard_range(b.flat.elem_count(), world, rank);
                let grad = Tensor::zeros(range.len(), b.flat.dtype(), b.flat.device())
                    .map_err(tensor_error("a gradient shard"))?;
                Ok(ShardBucket { range, grad })
            })
            .collect::<Result<Vec<_>>>()?;
        let device = buckets.first().map_or(Device::Cpu, |b| b.grad.device());
        let overflow = Tensor::zeros(1, DType::F32, device).map_err(tensor_error("the overflow flag"))?;
        Ok(GradShards { buckets, overflow, attached: AtomicBool::new(false) })
    }

    /// Sets `overflow` to the sum over ranks of `0 * every reduced gradient element`: NaN on
    /// every rank as soon as one rank's shard holds an inf or NaN.
    pub fn share_overflow(&self, comm: &dyn Communicator) -> Result<()> {
        if !self.attached.load(Ordering::Relaxed) {
            return Err(DdpError::NoZeroOptimizer);
        }
        let partials: Vec<Tensor> =
            self.buckets.iter().map(|b| b.grad.mul_scalar(0.0).to_dtype(DType::F32).sum_all()).collect();
        if partials.is_empty() {
            return Ok(());
        }
        self.overflow.copy_(&Tensor::stack(&partials, 0).sum_all().reshape(1));
        comm.all_reduce(&self.overflow, ReduceOp::Sum)?.wait()?;
        Ok(())
    }
}

/// The slice of one parameter that lies in this rank's shard of its bucket.
struct Piece {
    /// Index into the wrapper's parameters.
    param: usize,
    bucket: usize,
    /// First element of the slice in the bucket's shard.
    at_shard: usize,
    len: usize,
    /// The slice as a parameter of the inner optimizer (a view of the model's parameter).
    var: Var,
}

/// An optimizer that keeps state for this rank's shards only (ZeRO-1), over a wrapper made
/// with `DdpConfig { shard_optimizer: true, .. }`.
///
/// ```no_run
/// # use oxtrain_ddp::{Ddp, DdpConfig, ZeroOptimizer};
/// # use oxtrain_nn::{Module, optim::{AdamW, AdamWConfig, Optimizer, decay_groups}};
/// # fn demo(ddp: Ddp<oxtrain_nn::Linear>) -> Result<(), Box<dyn std::error::Error>> {
/// let groups = decay_groups(ddp.module().named_parameters(), 0.1);
/// let mut opt = ZeroOptimizer::new(&ddp, groups, |g| AdamW::new(g, AdamWConfig::default()))?;
/// // forward, loss.backward() (buckets reduce-scattered while it runs), then:
/// opt.clip_grad_norm_(1.0, 2.0)?;                      // the norm over every rank's shard
/// opt.step();                                          // shard step, parameter all-gathers launched
/// opt.zero_grad();
/// // the next forward waits for each bucket's gather when it first reads a parameter of it
/// # Ok(()) }
/// ```
///
/// The gradients of the model's parameters (`p.grad()`) stay this rank's own, unreduced:
/// clip through [`ZeroOptimizer::clip_grad_norm_`], and read gradients of the optimizer's
/// [`Optimizer::params`]. `state_dict` is this rank's shard of the state.
pub struct ZeroOptimizer<O: Optimizer> {
    inner: O,
    reducer: Arc<Reducer>,
    pieces: Vec<Piece>,
    /// The piece of each of the inner optimizer's parameters (its state numbering).
    order: Vec<usize>,
    /// The model parameter at each position of an unsharded optimizer over the same groups.
    unsharded_order: Vec<usize>,
    /// Model parameters per group.
    group_sizes: Vec<usize>,
    /// A parameter of no model whose gradient is the all-reduced overflow flag, listed last by
    /// [`Optimizer::params`] so that a grad scaler's inf check sees every rank's overflow.
    overflow_sentinel: Var,
    /// The parameters' all-gather after each step, and the gates that wait for it.
    gather: ParamGather,
    /// Whether the inner optimizer takes whole-parameter norms (LARS).
    needs_norms: bool,
}

impl<O: Optimizer> ZeroOptimizer<O> {
    /// Builds the inner optimizer with `build` over this rank's slices of the parameters in
    /// `groups` (parameters of `ddp`'s module, grouped as for an unsharded optimizer; each
    /// group keeps its hyper-parameters). Collective (every rank calls it).
    pub fn new<M: Module>(
        ddp: &DistributedDataParallel<M>,
        groups: impl IntoParamGroups,
        build: impl FnOnce(Vec<ParamGroupSpec>) -> O,
    ) -> Result<Self> {
        let reducer = ddp.reducer().clone();
        let shards = reducer.shards.as_ref().ok_or(DdpError::NotSharded)?;
        let pieces = slice_parameters(&reducer, shards)?;
        let (mut order, mut unsharded_order, mut group_sizes) = (Vec::new(), Vec::new(), Vec::new());
        let specs = groups
            .into_param_groups()
            .into_iter()
            .map(|spec| {
                let mut params = Vec::new();
                for p in &spec.params {
                    let i = reducer
                        .params
                        .iter()
                        .position(|q| same_parameter(q, p))
                        .ok_or_else(|| DdpError::NotInModel { shape: p.dims().to_vec() })?;
                    unsharded_order.push(i);
                    for (k, pc) in pieces.iter().enumerate().filter(|(_, pc)| pc.param == i) {
                        order.push(k);
                        params.push(pc.var.clone());
                    }
                }
                group_sizes.push(spec.params.len());
                Ok(ParamGroupSpec { params, ..spec })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut inner = build(specs);
        // Whether it takes whole-parameter norms (LARS): asked once, with none to use yet.
        let needs_norms = inner.set_whole_parameter_norms(Vec::new());
        let device = shards.overflow.device();
        let overflow_sentinel =
            Var::parameter(Tensor::zeros(1, DType::F32, device).map_err(tensor_error("the overflow flag"))?);
        let gates = ddp.config().overlap_param_gather.then(|| parameter_gates(ddp.module()));
        let gather = ParamGather::new(&reducer, shards, gates)?;
        shards.attached.store(true, Ordering::Relaxed);
        Ok(ZeroOptimizer {
            inner,
            reducer,
            pieces,
            order,
            unsharded_order,
            group_sizes,
            overflow_sentinel,
            gather,
            needs_norms,
        })
    }

    /// The optimizer over this rank's slices.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut O {
        &mut self.inner
    }

    /// Bytes of optimizer state this rank holds (its shard), from the state's tensors.
    pub fn state_bytes(&self) -> usize {
        let state = self.inner.state_dict_shared();
        state.tensors.values().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    fn shards(&self) -> &GradShards {
        self.reducer.shards.as_ref().expect("checked in new")
    }

    /// Points each slice's gradient at its part of the reduced shard, or at nothing when the
    /// parameter got no gradient (unused on every rank: the optimizer skips it).
    fn attach_gradients(&self) {
        let shards = self.shards();
        for pc in &self.pieces {
            let has = self.reducer.params[pc.param].grad().is_some();
            pc.var.set_grad(has.then(|| shards.buckets[pc.bucket].grad.narrow(0, pc.at_shard, pc.len)));
        }
        self.overflow_sentinel.set_grad(Some(shards.overflow.clone()));
    }

    /// Waits for every parameter gather still pending (the last step's, where no forward read
    /// them yet) and fills the parameters; returns the error of a gather that failed since the
    /// last call (its bucket's parameters were left as they were). Needed only before reading
    /// parameters through `Var`s cloned before the step: the module's own reads
    /// (`Parameter::var`, `state_dict`) wait by themselves.
    pub fn wait_parameters(&self) -> Result<()> {
        self.gather.wait()
    }

    /// How many buckets' parameter gathers are still in flight (launched by the last step, not
    /// yet waited for by a read of their parameters).
    pub fn pending_gathers(&self) -> usize {
        self.gather.pending()
    }

    /// Whether `step` returns with the parameter gathers in flight (`overlap_param_gather`, and
    /// every reduced parameter reachable through the module's walk).
    pub fn overlaps_param_gather(&self) -> bool {
        self.gather.overlaps()
    }

    /// Steps this rank's slices, then launches the all-gather of every bucket's parameters
    /// (waited for by their next reader, or here with the overlap off). The error of a
    /// collective that failed, this step's or a gather's of the last step.
    pub fn try_step(&mut self) -> Result<()> {
        // The slices about to step are views of the parameters, which a pending copy would
        // overwrite; the gathers' inputs are about to be rewritten.
        self.gather.wait()?;
        self.attach_gradients();
        // LARS scales each parameter by its whole norm, which no slice has: every rank's
        // partial sums of squares, all-reduced. Element-wise optimizers take no norms.
        if self.needs_norms {
            let norms = self.whole_parameter_norms()?;
            self.inner.set_whole_parameter_norms(norms);
        }
        self.inner.step();
        no_grad(|| self.gather.launch(&*self.reducer.comm, &self.pieces))
    }

    /// Per inner parameter, the L2 norms (weight, gradient) of the whole parameter it is a
    /// slice of: each rank's sums of squares over its slices, all-reduced (in f32, f64 for f64
    /// parameters). Collective.
    fn whole_parameter_norms(&self) -> Result<Vec<(Tensor, Tensor)>> {
        let params = &self.reducer.params;
        let dtype = if params.iter().any(|p| p.dtype() == DType::F64) { DType::F64 } else { DType::F32 };
        let device = self.shards().overflow.device();
        let zero = Tensor::zeros(1, dtype, device).map_err(tensor_error("the parameter norms"))?;
        let mut partial = vec![zero; 2 * params.len()];
        for pc in &self.pieces {
            let square_sum = |t: &Tensor| t.to_dtype(dtype).square().sum_all().reshape(1);
            partial[2 * pc.param] = square_sum(pc.var.tensor());
            if let Some(g) = pc.var.grad() {
                partial[2 * pc.param + 1] = square_sum(&g);
            }
        }
        let sums = Tensor::cat(&partial.iter().collect::<Vec<_>>(), 0);
        self.reducer.comm.all_reduce(&sums, ReduceOp::Sum)?.wait()?;
        let norms = sums.sqrt();
        let at = |i: usize| norms.narrow(0, i, 1).reshape(());
        Ok(self
            .order
            .iter()
            .map(|&k| (at(2 * self.pieces[k].param), at(2 * self.pieces[k].param + 1)))
            .collect())
    }

    /// Scales the reduced gradients so that their global `norm_type`-norm over every rank's
    /// shard is at most `max_norm`, as `clip_grad_norm_` over the unsharded gradients (each
    /// rank's partial, all-reduced: the same coefficient on every rank). Returns the norm.
    pub fn clip_grad_norm_(&mut self, max_norm: f64, norm_type: f64) -> Result<Tensor> {
        // Gradients only, but a gather's error surfaces here rather than after the clip.
        self.gather.wait()?;
        self.attach_gradients();
        clip_grad_norm_sharded(&*self.reducer.comm, &self.inner.params(), max_norm, norm_type)
    }
}

/// `clip_grad_norm_` over gradients sharded across `comm`'s ranks (each rank passes the
/// parameters it steps, as [`Optimizer::params`] of a [`ZeroOptimizer`]): each rank's partial
/// sum is all-reduced, so every rank scales by the coefficient of the global norm, which it
/// returns (f32, rank 0). Collective.
pub fn clip_grad_norm_sharded(
    comm: &dyn Communicator,
    params: &[Var],
    max_norm: f64,
    norm_type: f64,
) -> Result<Tensor> {
    assert!(norm_type > 0.0, "clip_grad_norm_: norm_type must be positive (or infinity), got {norm_type}");
    let grads: Vec<Tensor> = params.iter().filter_map(Var::grad).collect();
    let device = grads.first().map_or(Device::Cpu, Tensor::device);
    let partial = |g: &Tensor| {
        let a = g.to_dtype(DType::F32).abs();
        match norm_type {
            p if p.is_infinite() => a.max_all(),
            2.0 => a.square().sum_all(),
            1.0 => a.sum_all(),
            p => a.powf(p).sum_all(),
        }
    };
    let local = match grads.is_empty() {
        true => Tensor::zeros(1, DType::F32, device).map_err(tensor_error("the gradient norm"))?,
        false => {
            let stacked = Tensor::stack(&grads.iter().map(partial).collect::<Vec<_>>(), 0);
            let sum = if norm_type.is_infinite() { stacked.max_all() } else { stacked.sum_all() };
            sum.reshape(1)
        }
    };
    let op = if norm_type.is_infinite() { ReduceOp::Max } else { ReduceOp::Sum };
    comm.all_reduce(&local, op)?.wait()?;
    let total = match norm_type {
        p if p.is_infinite() || p == 1.0 => local,
        2.0 => local.sqrt(),
        p => local.powf(1.0 / p),
    }
    .reshape(());
    let coef = total.add_scalar(1e-6).recip().mul_scalar(max_norm).clamp(f64::NEG_INFINITY, 1.0);
    for g in &grads {
        g.mul_(&coef.to_dtype(g.dtype()));
    }
    Ok(total)
}

impl<O: Optimizer + 'static> Optimizer for ZeroOptimizer<O> {
    /// [`ZeroOptimizer::try_step`]; panics with the collective's error.
    fn step(&mut self) {
        if let Err(e) = self.try_step() {
            panic!("ZeroOptimizer::step: {e}");
        }
    }

    /// The slices this rank steps, and last a sentinel whose gradient is the overflow flag of
    /// every rank (so a grad scaler skips a step on all ranks or none).
    fn params(&self) -> Vec<Var> {
        self.attach_gradients();
        let mut params = self.inner.params();
        params.push(self.overflow_sentinel.clone());
        params
    }

    /// Drops the model's gradients (the next backward writes fresh ones into the buckets).
    fn zero_grad(&mut self) {
        for p in &self.reducer.params {
            p.zero_grad();
        }
        for pc in &self.pieces {
            pc.var.zero_grad();
        }
    }

    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }
    fn lr(&self, group: usize) -> f64 {
        self.inner.lr(group)
    }
    fn set_group_lr(&mut self, group: usize, lr: f64) {
        self.inner.set_group_lr(group, lr)
    }
    fn initial_lr(&self, group: usize) -> Option<f64> {
        self.inner.initial_lr(group)
    }
    fn set_initial_lr(&mut self, group: usize, lr: f64) {
        self.inner.set_initial_lr(group, lr)
    }
    /// This rank's shard of the state (its slices numbered as the inner optimizer's params).
    fn state_dict(&self) -> OptimizerState {
        self.inner.state_dict()
    }
    fn state_dict_shared(&self) -> OptimizerState {
        self.inner.state_dict_shared()
    }
    fn load_state_dict(&mut self, state: &OptimizerState) -> oxtrain_tensor::Result<()> {
        self.inner.load_state_dict(state)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

impl<O: Optimizer> Drop for ZeroOptimizer<O> {
    /// Leaves nothing in flight: the gathers write into the model's parameters and read this
    /// optimizer's buffers. An error no call returned yet has no one left to take it.
    fn drop(&mut self) {
        self.gather.resolve_all();
        if let Some(e) = self.gather.take_error() {
            eprintln!("oxtrain ZeroOptimizer: the last parameter all-gather failed: {e}");
        }
    }
}

/// The slices of the parameters that lie in this rank's shards, in parameter order.
fn slice_parameters(reducer: &Reducer, shards: &GradShards) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    for (i, (p, slot)) in reducer.params.iter().zip(&reducer.slots).enumerate() {
        if !p.tensor().is_contiguous() {
            return Err(DdpError::NotContiguous(reducer.names[i].clone()));
        }
        let shard = &shards.buckets[slot.bucket].range;
        let start = slot.offset.max(shard.start);
        let end = (slot.offset + slot.len).min(shard.end);
        if start < end {
            let view = p.tensor().reshape(slot.len).narrow(0, start - slot.offset, end - start);
            pieces.push(Piece {
                param: i,
                bucket: slot.bucket,
                at_shard: start - shard.start,
                len: end - start,
                var: Var::parameter(view),
            });
        }
    }
    Ok(pieces)
}

/// Whether `a` and `b` are the same parameter (the same memory; `Var` has no identity of its own).
fn same_parameter(a: &Var, b: &Var) -> bool {
    let (a, b) = (a.tensor(), b.tensor());
    a.same_storage(b) && a.layout().offset() == b.layout().offset() && a.dims() == b.dims()
}
