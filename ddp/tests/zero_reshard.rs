//! Resuming a ZeRO-1 state on another world size: a run on 2 ranks saved at step k and
//! resumed on 3 ranks (and 3 -> 2) continues exactly as a plain-DDP run on the new world size
//! started from the same step-k state (the unsharded optimizer's own state, saved by a plain
//! DDP run of the first k steps): loss for loss and weight for weight, bit for bit (no
//! clipping, so every sum is in the same order; the global batch of a step is the same rows
//! whatever the world size, each rank taking its contiguous part).

mod common;

use common::ddp_train::{self as t, Model, Opt};
use common::on_ranks;
use oxtrain_comm::Communicator;
use oxtrain_ddp::{Ddp, DdpConfig, DdpError, ShardState, ZeroOptimizer};
use oxtrain_nn::optim::{
    AdamW, AdamWConfig, Lars, LarsConfig, Optimizer, OptimizerState, ParamGroupSpec, Sgd, SgdConfig,
};
use oxtrain_nn::Module;
use oxtrain_tensor::Tensor;
use std::sync::Arc;

/// Rows of every step's global batch (divisible by 2 and 3).
const ROWS: usize = 6;

fn build_optimizer(opt: Opt, groups: Vec<ParamGroupSpec>) -> Box<dyn Optimizer> {
    match opt {
        Opt::SgdMomentum => Box::new(Sgd::new(
            groups,
            SgdConfig { lr: 0.1, momentum: 0.9, dampening: 0.1, ..Default::default() },
        )),
        Opt::AdamW => {
            Box::new(AdamW::new(groups, AdamWConfig { lr: 0.01, weight_decay: 0.01, ..Default::default() }))
        }
        Opt::Lars => {
            Box::new(Lars::new(groups, LarsConfig { lr: 0.5, trust_coefficient: 0.02, ..Default::default() }))
        }
    }
}

/// Where a segment of training starts.
#[derive(Clone)]
enum Start {
    Fresh,
    /// Parameters, and the saved optimizer state (every rank's part, or the unsharded one).
    Shards(Vec<(String, Vec<f32>)>, Vec<ShardState>),
    Plain(Vec<(String, Vec<f32>)>, OptimizerState),
}

struct Segment {
    params: Vec<(String, Vec<f32>)>,
    losses: Vec<f32>,
    part: Option<ShardState>,
    /// The optimizer's state as an unsharded optimizer holds it.
    unsharded: OptimizerState,
}

/// Steps `first..first + steps` on `comm`'s ranks, ZeRO-1 when `sharded`.
fn segment(
    comm: Arc<dyn Communicator>,
    model: Model,
    opt: Opt,
    sharded: bool,
    start: Start,
    first: usize,
    steps: usize,
) -> Segment {
    let (rank, world) = (comm.rank(), comm.world_size());
    let m = t::build(model, 7);
    if let Start::Shards(params, _) | Start::Plain(params, _) = &start {
        for ((_, p), (_, v)) in m.named_parameters().iter().zip(params) {
            p.tensor().copy_(&Tensor::from_vec(v.clone(), p.dims(), p.device()).unwrap());
        }
    }
    let config = DdpConfig {
        shard_optimizer: sharded,
        bucket_cap_mb: 0.002,
        first_bucket_cap_mb: 0.001,
        ..DdpConfig::default()
    };
    let ddp = Ddp::new(m, comm, config).unwrap();
    let groups = oxtrain_nn::optim::decay_groups(ddp.module().named_parameters(), 0.1);
    let (mut zero, mut plain) = (None, None);
    if sharded {
        let mut z = ZeroOptimizer::new(&ddp, groups, |g| build_optimizer(opt, g)).unwrap();
        if let Start::Shards(_, parts) = &start {
            z.load_shard_states(parts).unwrap();
        }
        zero = Some(z);
    } else {
        let mut p = build_optimizer(opt, groups);
        if let Start::Plain(_, state) = &start {
            p.load_state_dict(state).unwrap();
        }
        plain = Some(p);
    }
    let per_rank = ROWS / world;
    let mut losses = Vec::new();
    for step in first..first + steps {
        let o: &mut dyn Optimizer = match (&mut zero, &mut plain) {
            (Some(z), _) => z,
            (None, Some(p)) => p.as_mut(),
            _ => unreachable!(),
        };
        o.zero_grad();
        let (x, y) = t::batch(model, step, ROWS);
        let (x, y) = (t::shard(&x, rank, per_rank), t::shard(&y, rank, per_rank));
        let logits = ddp.forward_with(|m| t::forward(model, m, &x));
        let loss = t::logits_loss(model, &logits, &y);
        loss.try_backward().unwrap();
        losses.push(loss.tensor().item() as f32);
        o.step();
    }
    let params = t::params(ddp.module());
    match (zero, plain) {
        (Some(z), _) => {
            let part = z.shard_state().unwrap();
            // Every rank's part, to see the whole state: shared through files in a real
            // checkpoint; here through a round trip of this rank's part on disk.
            let dir = std::env::temp_dir()
                .join(format!("oxtrain-zero-{}-{model:?}-{opt:?}-{world}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("rank{rank}.safetensors"));
            part.save(&file).unwrap();
            let reread = ShardState::load(&file).unwrap();
            ddp.comm().barrier().unwrap().wait().unwrap();
            let parts: Vec<ShardState> = (0..world)
                .map(|r| ShardState::load(dir.join(format!("rank{r}.safetensors"))).unwrap())
                .collect();
            ddp.comm().barrier().unwrap().wait().unwrap();
            if rank == 0 {
                std::fs::remove_dir_all(&dir).unwrap();
            }
            let unsharded = z.unsharded_state(&parts).unwrap();
            Segment { params, losses, part: Some(reread), unsharded }
        }
        (None, Some(p)) => Segment { params, losses, part: None, unsharded: p.state_dict() },
        _ => unreachable!(),
    }
}

fn assert_same_state(what: &str, a: &OptimizerState, b: &OptimizerState) {
    assert_eq!(
        a.tensors.keys().collect::<Vec<_>>(),
        b.tensors.keys().collect::<Vec<_>>(),
        "{what}: state names"
    );
    for (name, x) in &a.tensors {
        let y = &b.tensors[name];
        assert_eq!(x.dims(), y.dims(), "{what}: {name}");
        let same = x.to_f64_vec().iter().zip(y.to_f64_vec()).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: {name} differs");
    }
    let groups = |s: &OptimizerState| {
        s.param_groups.iter().map(|g| (g.params.clone(), g.hyper.clone())).collect::<Vec<_>>()
    };
    assert_eq!(groups(a), groups(b), "{what}: groups");
}

#[test]
fn a_state_saved_on_one_world_size_resumes_on_another() {
    const K: usize = 2;
    const MORE: usize = 3;
    for (model, opt) in [(Model::Transformer, Opt::AdamW), (Model::Cnn, Opt::SgdMomentum)] {
        for (from, to) in [(2, 3), (3, 2)] {
            let what = format!("{model:?} {opt:?} {from} -> {to} ranks");
            let saved = on_ranks(from, move |c| segment(c, model, opt, true, Start::Fresh, 0, K));
            let plain = on_ranks(from, move |c| segment(c, model, opt, false, Start::Fresh, 0, K));
            // The shards, gathered, are the unsharded optimizer's state bit for bit.
            assert_same_state(&format!("{what}, step {K}"), &saved[0].unsharded, &plain[0].unsharded);
            assert_eq!(saved[0].params, plain[0].params, "{what}: parameters at step {K}");
            let parts: Vec<ShardState> = saved.iter().map(|s| s.part.clone().unwrap()).collect();
            let start = Start::Shards(saved[0].params.clone(), parts);
            let resumed = on_ranks(to, move |c| segment(c, model, opt, true, start.clone(), K, MORE));
            let start = Start::Plain(plain[0].params.clone(), plain[0].unsharded.clone());
            let reference = on_ranks(to, move |c| segment(c, model, opt, false, start.clone(), K, MORE));
            for r in 0..to {
                assert_eq!(resumed[r].losses, reference[r].losses, "{what}: losses of rank {r}");
                t::assert_bitwise_equal(&what, &resumed[r].params, &reference[0].params);
            }
            assert_same_state(
                &format!("{what}, step {}", K + MORE),
                &resumed[0].unsharded,
                &reference[0].unsharded,
            );
        }
    }
}

#[test]
fn parts_of_another_model_optimizer_or_save_are_refused() {
    let saved = on_ranks(2, |c| segment(c, Model::Cnn, Opt::AdamW, true, Start::Fresh, 0, 1));
    let parts: Vec<ShardState> = saved.iter().map(|s| s.part.clone().unwrap()).collect();
    let errors = on_ranks(2, move |comm| {
        let mut out = Vec::new();
        let config = DdpConfig {
            shard_optimizer: true,
            bucket_cap_mb: 0.002,
            first_bucket_cap_mb: 0.001,
            ..DdpConfig::default()
        };
        let other_model = Ddp::new(t::build(Model::Transformer, 7), comm.clone(), config.clone()).unwrap();
        let mut z = ZeroOptimizer::new(&other_model, other_model.module().parameters(), |g| {
            build_optimizer(Opt::AdamW, g)
        })
        .unwrap();
        out.push(z.load_shard_states(&parts).unwrap_err());
        drop((z, other_model));
        let ddp = Ddp::new(t::build(Model::Cnn, 7), comm, config).unwrap();
        let groups = oxtrain_nn::optim::decay_groups(ddp.module().named_parameters(), 0.1);
        let mut z = ZeroOptimizer::new(&ddp, groups, |g| build_optimizer(Opt::SgdMomentum, g)).unwrap();
        out.push(z.load_shard_states(&parts).unwrap_err());
        out.push(z.load_shard_states(&parts[..1]).unwrap_err());
        out
    });
    for e in errors {
        assert!(matches!(e[0], DdpError::OtherModel { .. }), "{}", e[0]);
        assert!(matches!(e[1], DdpError::OtherOptimizer { .. }), "{}", e[1]);
        assert!(matches!(e[2], DdpError::IncompleteShards { world: 2, .. }), "{}", e[2]);
        assert!(e[0].to_string().contains("another model"), "{}", e[0]);
        assert!(e[1].to_string().contains("another optimizer"), "{}", e[1]);
        assert!(e[2].to_string().contains("all 2 ranks"), "{}", e[2]);
    }
}
