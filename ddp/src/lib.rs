//! Data-parallel training: [`DistributedDataParallel`] (also [`Ddp`]) wraps a module so that
//! every rank trains the same model on its own part of the batch, with the gradient
//! all-reduce overlapped with the backward pass, as PyTorch's `DistributedDataParallel`.
//!
//! ```no_run
//! # use oxtrain_ddp::{Ddp, DdpConfig};
//! # fn demo(model: oxtrain_nn::Linear, x: oxtrain_autograd::Var) -> Result<(), Box<dyn std::error::Error>> {
//! let pg = oxtrain_comm::init_from_env()?;             // torchrun / mpirun / srun variables
//! let ddp = Ddp::new(model, pg.comm, DdpConfig::default())?;
//! let loss = ddp.forward(&x).square().mean_all();
//! loss.try_backward()?;                                // buckets are reduced while this runs
//! # Ok(()) }
//! ```
//!
//! - [`bucket`]: which parameters share a bucket, and the flat memory the gradients live in.
//! - [`reducer`]: hooks mark parameters ready, full buckets launch, the end of backward waits.
//! - [`sync_batch_norm`]: batch norm with statistics over every rank's batch.
//! - [`zero`]: ZeRO-1, the optimizer state sharded over the ranks ([`ZeroOptimizer`]).
//! - [`trace`]: the spans of each step as Chrome trace JSON, and [`StepStats`].

#![doc = include_str!("../README.md")]

mod bucket;
mod error;
mod options;
mod reducer;
mod state_sync;
mod sync_batch_norm;
mod trace;
mod zero;

pub use error::{DdpError, Result};
pub use options::{Compression, DdpConfig, Reduction};
pub use sync_batch_norm::{convert_sync_batchnorm, SyncBatchNorm};
pub use trace::StepStats;
pub use zero::{clip_grad_norm_sharded, ShardState, ZeroOptimizer};

use oxtrain_autograd::{is_grad_enabled, HookHandle, Var};
use oxtrain_comm::Communicator;
use oxtrain_nn::{Forward, Module, TrainingFlag, Visitor};
use reducer::Reducer;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// A module trained data-parallel over the ranks of a communicator (`torch.nn.parallel.
/// DistributedDataParallel`).
///
/// - `new` checks that every rank wraps the same model, then broadcasts rank 0's parameters
///   and buffers, so every rank starts from the same weights whatever its seed.
/// - The gradients live in buckets (each parameter's `.grad()` is a view into one); during
///   `loss.backward()` a bucket's all-reduce starts as soon as all of its gradients are
///   ready, and backward returns once every bucket is reduced. Optimizers built on the
///   module's parameters then see the averaged gradients; user code is the single-process
///   code with the model wrapped.
/// - Errors of the collectives, and parameters that got no gradient, come back from
///   [`Var::try_backward`] (and make [`Var::backward`] panic with the message).
pub struct DistributedDataParallel<M: Module> {
    module: M,
    attachment: Attachment,
}

/// The short name (`Ddp::new(...)`).
pub type Ddp<M> = DistributedDataParallel<M>;

/// What the wrapper adds to the module: the reducer and its hooks, removed again on drop.
struct Attachment {
    comm: Arc<dyn Communicator>,
    config: DdpConfig,
    reducer: Arc<Reducer>,
    hooks: Vec<HookHandle>,
    sync: AtomicBool,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
        for p in &self.reducer.params {
            p.set_grad_buffer(None);
        }
        if let Some(path) = &self.config.trace {
            let path = trace::rank_path(path, self.comm.rank(), self.comm.world_size());
            if let Err(e) = self.reducer.trace.write(&path) {
                eprintln!("oxtrain ddp: could not write the trace to {}: {e}", path.display());
            }
        }
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` for training over `comm`'s ranks; collective (every rank calls it).
    pub fn new(module: M, comm: impl Into<Arc<dyn Communicator>>, config: DdpConfig) -> Result<Self> {
        let comm: Arc<dyn Communicator> = comm.into();
        for (what, mb) in
            [("bucket_cap_mb", config.bucket_cap_mb), ("first_bucket_cap_mb", config.first_bucket_cap_mb)]
        {
            if !(mb.is_finite() && mb > 0.0) {
                return Err(DdpError::BadBucketCap { field: what, value: mb });
            }
        }
        // As PyTorch's DDP: frozen parameters are not reduced (they get no gradient).
        let named = module.trainable_named_parameters();
        let (names, params): (Vec<String>, Vec<Var>) = named.into_iter().unzip();
        if let Some((i, p)) = params.iter().enumerate().find(|(_, p)| !reducer::reducible(p.dtype())) {
            return Err(DdpError::NotReducible { name: names[i].clone(), dtype: p.dtype() });
        }
        let param_tensors: Vec<(String, _)> =
            names.iter().cloned().zip(params.iter().map(|p| p.tensor().clone())).collect();
        let buffers = module.named_buffers();
        state_sync::check_same_model(&*comm, &param_tensors, &buffers)?;
        let mut all: Vec<_> = param_tensors.iter().map(|(_, t)| t.clone()).collect();
        all.extend(buffers.iter().map(|(_, t)| t.clone()));
        state_sync::broadcast_coalesced(&*comm, &all, 0)?;

        let mib = |mb: f64| ((mb * 1024.0 * 1024.0) as usize).max(1);
        let sizes: Vec<_> = params.iter().map(|p| (p.elem_count(), p.dtype(), p.device())).collect();
        let assignment = bucket::assign(&sizes, mib(config.first_bucket_cap_mb), mib(config.bucket_cap_mb));
        let compress = config.compression == Compression::Bf16;
        let (buckets, slots) = bucket::build(&*comm, &params, &assignment, compress)?;
        let shards = match config.shard_optimizer {
            true => Some(zero::GradShards::new(&*comm, &buckets, config.compression)?),
            false => None,
        };
        let trace = trace::Recorder::new(comm.rank(), config.trace.is_some());
        let reducer = Arc::new(Reducer::new(
            comm.clone(),
            names,
            params,
            slots,
            buckets,
            config.reduction,
            config.compression,
            config.find_unused_parameters,
            trace,
            shards,
        ));
        let hooks = reducer
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                // Weak: the hook lives in the parameter, which the reducer holds.
                let r: Weak<Reducer> = Arc::downgrade(&reducer);
                p.register_hook(move |_| {
                    if let Some(r) = r.upgrade() {
                        r.mark_ready(i);
                    }
                })
            })
            .collect();
        let attachment = Attachment { comm, config, reducer, hooks, sync: AtomicBool::new(true) };
        Ok(DistributedDataParallel { module, attachment })
    }

    /// The wrapped module (`ddp.module`).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The module back, with gradients allocated normally again.
    pub fn into_inner(self) -> M {
        let DistributedDataParallel { module, attachment } = self;
        drop(attachment);
        module
    }

    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.attachment.comm
    }

    pub fn config(&self) -> &DdpConfig {
        &self.attachment.config
    }

    /// The wrapped module's forward ([`Forward`] modules).
    pub fn forward(&self, x: &Var) -> Var
    where
        M: Forward,
    {
        self.forward_with(|m| m.forward(x))
    }

    /// Runs `f` as the forward of the wrapped module (any signature: `|m| m.forward(&ids,
    /// mask)`), with what DDP does around a forward: the buffer broadcast before, and a mark
    /// on the output so the reducer knows when the model's backward starts.
    pub fn forward_with(&self, f: impl FnOnce(&M) -> Var) -> Var {
        let a = &self.attachment;
        let start = Instant::now();
        let sync = a.sync.load(Ordering::Relaxed) && is_grad_enabled();
        if sync && a.config.broadcast_buffers {
            let buffers: Vec<_> = self.module.named_buffers().into_iter().map(|(_, t)| t).collect();
            if let Err(e) = state_sync::broadcast_coalesced(&*a.comm, &buffers, 0) {
                a.reducer.record_error(e);
            }
        }
        let out = f(&self.module);
        let end = Instant::now();
        a.reducer.trace.span("forward", "compute", start, end);
        a.reducer.prepare_forward(sync, end - start);
        if !sync || !out.requires_grad() {
            return out;
        }
        let r = Arc::downgrade(&a.reducer);
        Var::from_op("ddp_output", out.tensor().clone(), &[&out], move |g, _| {
            if let Some(r) = r.upgrade() {
                r.backward_started();
            }
            vec![Some(g.clone())]
        })
    }

    /// Runs `f` (forward and backward passes) without reducing gradients: they accumulate
    /// locally in the buckets, and the next synchronised backward reduces the sum
    /// (`with ddp.no_sync():`), for gradient accumulation.
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a>(&'a AtomicBool, bool);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.store(self.1, Ordering::Relaxed);
            }
        }
        let _restore = Restore(&self.attachment.sync, self.attachment.sync.swap(false, Ordering::Relaxed));
        f()
    }

    /// Runs `f` and records it as a span named `name` in the trace (`ddp.span("optimizer",
    /// || opt.step())`).
    pub fn span<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.attachment.reducer.trace.span(name, "compute", start, Instant::now());
        r
    }

    /// The figures of the last synchronised backward pass.
    pub fn last_step(&self) -> Option<StepStats> {
        self.attachment.reducer.last_stats()
    }

    /// Turns span recording on (off by default unless `DdpConfig::trace` is set).
    pub fn enable_trace(&self) {
        self.attachment.reducer.trace.set_enabled(true);
    }

    /// The trace so far as Chrome trace JSON.
    pub fn trace_json(&self) -> String {
        self.attachment.reducer.trace.to_json()
    }

    /// Writes the trace so far (Chrome trace JSON) to `path`.
    pub fn write_trace(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        self.attachment.reducer.trace.write(path.as_ref())
    }

    /// The buckets: the parameter names in each, in launch order (for tests and tuning).
    pub fn bucket_layout(&self) -> Vec<Vec<String>> {
        let r = &self.attachment.reducer;
        r.buckets.iter().map(|b| b.params.iter().map(|&i| r.names[i].clone()).collect()).collect()
    }

    pub(crate) fn reducer(&self) -> &Arc<Reducer> {
        &self.attachment.reducer
    }

    /// The flat gradient memory of bucket `b` (its parameters' `.grad()` are views into it).
    pub fn bucket_tensor(&self, b: usize) -> &oxtrain_tensor::Tensor {
        &self.attachment.reducer.buckets[b].flat
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    // The module's own names, without PyTorch's `module.` prefix, so a state dict saved from
    // the wrapper loads into the bare model.
    fn visit(&self, v: &mut dyn Visitor) {
        self.module.visit(v)
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        self.module.training_flag()
    }
    // The module's own mode switch: a wrapper that shows only part of itself to a walk (LoRA's
    // adapters) still reaches every dropout of the model.
    fn train(&self, training: bool) {
        self.module.train(training)
    }
    fn is_training(&self) -> bool {
        self.module.is_training()
    }
}

impl<M: Forward> Forward for DistributedDataParallel<M> {
    fn forward(&self, x: &Var) -> Var {
        DistributedDataParallel::forward(self, x)
    }
}
