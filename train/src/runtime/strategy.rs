//! How the loop's work is spread over processes, kept apart from the loop (as burn's Learner
//! keeps its strategy): the loop asks the strategy for the model, runs forward and backward
//! through it, and asks it to combine metrics; it never names a backend.

use oxtrain_autograd::Var;
use oxtrain_comm::{CommError, Communicator, ProcessGroup, ReduceOp};
use oxtrain_ddp::{clip_grad_norm_sharded, DdpConfig, DdpError, DistributedDataParallel, ZeroOptimizer};
use oxtrain_nn::optim::{clip_grad_norm_, Optimizer, ParamGroupSpec};
use oxtrain_nn::Module;
use oxtrain_tensor::{Device, Tensor};
use std::sync::Arc;

/// One process, or this process's part of a data-parallel group.
pub enum Strategy<M: Module> {
    /// The whole batch here: the model as it is.
    Single(M),
    /// Data parallel: the model wrapped by DDP (gradients averaged during backward), the
    /// communicator for the metric sums, and what keeps the group's connections up.
    Ddp { ddp: Box<DistributedDataParallel<M>>, comm: Arc<dyn Communicator>, _keep: Box<dyn std::any::Any> },
}

impl<M: Module> Strategy<M> {
    pub fn single(model: M) -> Self {
        Strategy::Single(model)
    }

    /// Wraps `model` in DDP over the group's communicator (SyncBatchNorm first when asked).
    pub fn ddp(
        model: M,
        group: ProcessGroup,
        config: DdpConfig,
        sync_batchnorm: bool,
    ) -> Result<Self, DdpError> {
        let ProcessGroup { comm, store, env: _, heap } = group;
        let comm: Arc<dyn Communicator> = comm.into();
        if sync_batchnorm {
            oxtrain_ddp::convert_sync_batchnorm(&model, comm.clone());
        }
        let ddp = DistributedDataParallel::new(model, comm.clone(), config)?;
        Ok(Strategy::Ddp { ddp: Box::new(ddp), comm, _keep: Box::new((store, heap)) })
    }

    /// The model itself (`ddp.module`): for evaluation, saving and the optimizer's parameters.
    pub fn module(&self) -> &M {
        match self {
            Strategy::Single(m) => m,
            Strategy::Ddp { ddp, .. } => ddp.module(),
        }
    }

    /// Runs `f` (forward and loss) on the model; under DDP through the wrapper, so its
    /// buffers are broadcast and its gradient hooks armed.
    pub fn forward(&self, f: impl FnOnce(&M) -> Var) -> Var {
        match self {
            Strategy::Single(m) => f(m),
            Strategy::Ddp { ddp, .. } => ddp.forward_with(f),
        }
    }

    /// Runs `f` (a backward of an accumulation step that is not the last) with the gradients
    /// kept local: no all-reduce until the last micro-batch (`ddp.no_sync()`).
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Strategy::Single(_) => f(),
            Strategy::Ddp { ddp, .. } => ddp.no_sync(f),
        }
    }

    pub fn rank(&self) -> usize {
        match self {
            Strategy::Single(_) => 0,
            Strategy::Ddp { comm, .. } => comm.rank(),
        }
    }

    pub fn world_size(&self) -> usize {
        match self {
            Strategy::Single(_) => 1,
            Strategy::Ddp { comm, .. } => comm.world_size(),
        }
    }

    /// The sum over ranks of each value (eval counts, loss sums).
    pub fn sum(&self, values: &[f64]) -> Result<Vec<f64>, CommError> {
        match self {
            Strategy::Single(_) => Ok(values.to_vec()),
            Strategy::Ddp { comm, .. } => {
                let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
                // A host vector of its own length: this cannot fail.
                let t =
                    Tensor::from_vec(v, [values.len()], Device::Cpu).expect("a host tensor of the values");
                comm.all_reduce(&t, ReduceOp::Sum).and_then(|w| w.wait())?;
                Ok(t.to_vec::<f32>().into_iter().map(f64::from).collect())
            }
        }
    }

    /// Waits until every rank gets here.
    pub fn barrier(&self) -> Result<(), CommError> {
        match self {
            Strategy::Single(_) => Ok(()),
            Strategy::Ddp { comm, .. } => comm.barrier().and_then(|w| w.wait()),
        }
    }

    /// Whether the optimizer state is sharded over the ranks (ZeRO-1, `ddp.shard_optimizer`).
    pub fn shards_optimizer(&self) -> bool {
        matches!(self, Strategy::Ddp { ddp, .. } if ddp.config().shard_optimizer)
    }

    /// The optimizer `build` makes over `groups` (parameters of [`Strategy::module`]); under
    /// ZeRO-1 a [`ZeroOptimizer`] whose inner optimizer `build` makes over this rank's shards.
    /// Collective under DDP.
    pub fn optimizer(
        &self,
        groups: Vec<ParamGroupSpec>,
        build: impl FnOnce(Vec<ParamGroupSpec>) -> Box<dyn Optimizer>,
    ) -> Result<Box<dyn Optimizer>, DdpError> {
        match self {
            Strategy::Ddp { ddp, .. } if ddp.config().shard_optimizer => {
                Ok(Box::new(ZeroOptimizer::new(ddp, groups, build)?))
            }
            _ => Ok(build(groups)),
        }
    }

    /// `clip_grad_norm_(params, max_norm, 2)` of the optimizer's parameters (`opt.params()`);
    /// under ZeRO-1 the norm over every rank's shard. Returns the norm before clipping.
    pub fn clip_grad_norm_(&self, params: &[Var], max_norm: f64) -> Result<Tensor, DdpError> {
        match self {
            Strategy::Ddp { ddp, comm, .. } if ddp.config().shard_optimizer => {
                clip_grad_norm_sharded(&**comm, params, max_norm, 2.0)
            }
            _ => Ok(clip_grad_norm_(params, max_norm, 2.0)),
        }
    }

    /// Which strategy, for the start-up line.
    pub fn describe(&self) -> String {
        match self {
            Strategy::Single(_) => "single process".into(),
            Strategy::Ddp { comm, .. } => {
                let zero = if self.shards_optimizer() { ", ZeRO-1" } else { "" };
                format!("DDP rank {} of {} ({}{zero})", comm.rank(), comm.world_size(), comm.backend())
            }
        }
    }
}

/// The trainer's ZeRO-1 optimizer, as [`Strategy::optimizer`] makes it.
pub type Zero = ZeroOptimizer<Box<dyn Optimizer>>;

/// `opt` as the trainer's ZeRO-1 optimizer, when it is one.
pub fn as_zero(opt: &dyn Optimizer) -> Option<&Zero> {
    opt.as_any()?.downcast_ref()
}

pub fn as_zero_mut(opt: &mut dyn Optimizer) -> Option<&mut Zero> {
    opt.as_any_mut()?.downcast_mut()
}
