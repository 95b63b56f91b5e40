//! The DDP training loop of `ddp_train` with what ZeRO-1 tests need on: gradient clipping,
//! a grad scaler, and the optimizer either unsharded (plain DDP) or a [`ZeroOptimizer`].

use super::ddp_train::{self as t, Model, Opt, Tiny};
use oxtrain_comm::Communicator;
use oxtrain_ddp::{Ddp, DdpConfig, ZeroOptimizer};
use oxtrain_nn::amp::{GradScaler, GradScalerConfig};
use oxtrain_nn::optim::{clip_grad_norm_, Optimizer, ParamGroupSpec};
use oxtrain_nn::Module;
use oxtrain_tensor::DType;
use std::sync::Arc;

/// What a run turns on besides plain data-parallel SGD/AdamW.
#[derive(Debug, Clone, Copy)]
pub struct Extras {
    /// Micro-batches per step (all but the last under `no_sync`).
    pub accumulate: usize,
    /// `clip_grad_norm_(max_norm, 2.0)` before each step.
    pub clip: Option<f64>,
    /// A grad scaler with this initial scale.
    pub scale: Option<f64>,
    /// The parameters' dtype.
    pub dtype: DType,
}

/// The result of one rank's run.
pub struct Run {
    pub ddp: Ddp<Tiny>,
    /// Bytes of the optimizer's float state buffers (the step counters left out).
    pub state_bytes: usize,
    pub losses: Vec<f32>,
    /// The grad scaler's scale after the last step (1 without a scaler).
    pub scale: f64,
}

/// Bytes of an optimizer's state tensors, the per-parameter step counters left out.
pub fn float_state_bytes(opt: &dyn Optimizer) -> usize {
    let state = opt.state_dict_shared();
    state
        .tensors
        .iter()
        .filter(|(name, _)| !name.ends_with(".step"))
        .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

/// Rank `comm.rank()` trains `steps` steps of its shard of each batch; `shard` picks the
/// optimizer: a [`ZeroOptimizer`] (`config.shard_optimizer` must be on) or a plain one.
pub fn train_rank(
    comm: Arc<dyn Communicator>,
    model: Model,
    opt: Opt,
    steps: usize,
    per_rank: usize,
    config: DdpConfig,
    extras: Extras,
) -> Run {
    let (rank, world) = (comm.rank(), comm.world_size());
    let m = t::build(model, if rank == 0 { 7 } else { 100 + rank as u64 });
    m.to_dtype(extras.dtype).unwrap();
    let sharded = config.shard_optimizer;
    let ddp = Ddp::new(m, comm, config).unwrap();
    let groups = vec![ParamGroupSpec::new(ddp.module().parameters())];
    let mut zero = None;
    let mut plain = None;
    if sharded {
        zero = Some(ZeroOptimizer::new(&ddp, groups, |g| t::optimizer(opt, g)).unwrap());
    } else {
        plain = Some(t::optimizer(opt, groups));
    }
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: extras.scale.unwrap_or(1.0),
        enabled: extras.scale.is_some(),
        ..Default::default()
    });
    let mut losses = Vec::new();
    for step in 0..steps {
        let o: &mut dyn Optimizer = match (&mut zero, &mut plain) {
            (Some(z), _) => z,
            (None, Some(p)) => p.as_mut(),
            _ => unreachable!(),
        };
        o.zero_grad();
        let mut step_loss = 0.0;
        for micro in 0..extras.accumulate {
            let (x, y) = t::batch(model, step * extras.accumulate + micro, per_rank * world);
            let (x, y) = (t::shard(&x, rank, per_rank), t::shard(&y, rank, per_rank));
            // Images in the parameters' dtype (token ids stay integers).
            let x = if model == Model::Transformer { x } else { x.to_dtype(extras.dtype) };
            let run = || {
                let logits = ddp.forward_with(|m| t::forward(model, m, &x));
                let loss = t::logits_loss(model, &logits, &y) * (1.0 / extras.accumulate as f64);
                scaler.scale(&loss).try_backward().unwrap();
                loss.tensor().to_dtype(DType::F64).item() as f32
            };
            step_loss += if micro + 1 < extras.accumulate { ddp.no_sync(run) } else { run() };
        }
        losses.push(step_loss);
        if let Some(max_norm) = extras.clip {
            scaler.unscale_(o);
            match &mut zero {
                Some(z) => {
                    z.clip_grad_norm_(max_norm, 2.0).unwrap();
                }
                None => {
                    clip_grad_norm_(&plain.as_ref().unwrap().params(), max_norm, 2.0);
                }
            }
        }
        let o: &mut dyn Optimizer = match (&mut zero, &mut plain) {
            (Some(z), _) => z,
            (None, Some(p)) => p.as_mut(),
            _ => unreachable!(),
        };
        scaler.step(o);
        scaler.update();
    }
    let state_bytes = match (&zero, &plain) {
        (Some(z), _) => float_state_bytes(z.inner().as_ref()),
        (None, Some(p)) => float_state_bytes(p.as_ref()),
        _ => unreachable!(),
    };
    Run { ddp, state_bytes, losses, scale: scaler.get_scale() }
}
