//! ZeRO-1 on the `local` backend (ranks as threads): a [`ZeroOptimizer`] over
//! `DdpConfig { shard_optimizer: true, .. }` trains as plain DDP does, with 1/N of the
//! optimizer state on each rank.
//!
//! Bit for bit: without clipping, the reduce-scatter sums each gradient element over the ranks
//! in the same order as the all-reduce, and SGD/AdamW update element by element, so the
//! sharded run equals the plain one exactly. With clipping, the global norm is summed per
//! shard and then over ranks (another order than one sum over whole gradients): equal to f32
//! rounding.

mod common;

use common::ddp_train::{self as t, Model, Opt};
use common::on_ranks;
use common::zero_train::{self as z, Extras};
use oxtrain_autograd::Var;
use oxtrain_ddp::{Ddp, DdpConfig, DdpError, ZeroOptimizer};
use oxtrain_nn::amp::{GradScaler, GradScalerConfig};
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{Module, Parameter, Visitor};
use oxtrain_tensor::{DType, Device, Tensor};

const STEPS: usize = 5;
const PER_RANK: usize = 3;

/// Small buckets, so every model has several and shards cut through parameters.
fn config(shard: bool) -> DdpConfig {
    DdpConfig {
        shard_optimizer: shard,
        bucket_cap_mb: 0.002,
        first_bucket_cap_mb: 0.001,
        ..DdpConfig::default()
    }
}

/// Each rank's parameters, losses, state bytes and final scale.
type Outcome = (Vec<(String, Vec<f32>)>, Vec<f32>, usize, f64);

/// With the parameters' all-gather overlapping the next forward (the default).
fn run(world: usize, model: Model, opt: Opt, shard: bool, extras: Extras) -> Vec<Outcome> {
    run_with(world, model, opt, config(shard), extras)
}

fn run_with(world: usize, model: Model, opt: Opt, config: DdpConfig, extras: Extras) -> Vec<Outcome> {
    on_ranks(world, move |comm| {
        let r = z::train_rank(comm, model, opt, STEPS, PER_RANK, config.clone(), extras);
        (t::params(r.ddp.module()), r.losses, r.state_bytes, r.scale)
    })
}

const CASES: [(Model, Opt); 4] = [
    (Model::Cnn, Opt::SgdMomentum),
    (Model::Cnn, Opt::AdamW),
    (Model::Transformer, Opt::SgdMomentum),
    (Model::Transformer, Opt::AdamW),
];

#[test]
fn sharded_equals_plain_ddp_bit_for_bit_with_accumulation() {
    let extras = Extras { accumulate: 2, clip: None, scale: None, dtype: DType::F32 };
    for world in [2, 3] {
        for (model, opt) in CASES {
            let what = format!("{model:?} {opt:?} {world} ranks");
            let plain = run(world, model, opt, false, extras);
            let sharded = run(world, model, opt, true, extras);
            for r in 0..world {
                t::assert_bitwise_equal(&what, &sharded[r].0, &plain[0].0);
                assert_eq!(sharded[r].1, plain[r].1, "{what}: losses of rank {r}");
            }
        }
    }
}

#[test]
fn sharded_equals_plain_ddp_with_clipping_and_accumulation() {
    // max_norm small enough that every step clips.
    let extras = Extras { accumulate: 2, clip: Some(0.05), scale: None, dtype: DType::F32 };
    for world in [2, 3] {
        for (model, opt) in CASES {
            let what = format!("{model:?} {opt:?} {world} ranks, clipped");
            let plain = run(world, model, opt, false, extras);
            let sharded = run(world, model, opt, true, extras);
            for r in 1..world {
                t::assert_bitwise_equal(&what, &sharded[r].0, &sharded[0].0);
            }
            let err = t::assert_close(&what, &sharded[0].0, &plain[0].0, 1e-5);
            eprintln!("{what}: {err:.2e} relative from plain DDP");
        }
    }
}

#[test]
fn with_the_gather_waited_for_in_the_step_sharded_still_equals_plain_ddp() {
    let eager = DdpConfig { overlap_param_gather: false, ..config(true) };
    for (clip, bitwise) in [(None, true), (Some(0.05), false)] {
        let extras = Extras { accumulate: 2, clip, scale: None, dtype: DType::F32 };
        for world in [2, 3] {
            for (model, opt) in CASES {
                let what = format!("{model:?} {opt:?} {world} ranks, eager gather, clip {clip:?}");
                let plain = run(world, model, opt, false, extras);
                let sharded = run_with(world, model, opt, eager.clone(), extras);
                for r in 0..world {
                    t::assert_bitwise_equal(&what, &sharded[r].0, &sharded[0].0);
                    if bitwise {
                        t::assert_bitwise_equal(&what, &sharded[r].0, &plain[0].0);
                        assert_eq!(sharded[r].1, plain[r].1, "{what}: losses of rank {r}");
                    } else {
                        t::assert_close(&what, &sharded[r].0, &plain[0].0, 1e-5);
                    }
                }
            }
        }
    }
}

#[test]
fn each_rank_holds_a_1_over_n_share_of_the_optimizer_state() {
    let extras = Extras { accumulate: 1, clip: None, scale: None, dtype: DType::F32 };
    for (model, opt) in [(Model::Transformer, Opt::AdamW), (Model::Cnn, Opt::SgdMomentum)] {
        let unsharded = run(1, model, opt, false, extras)[0].2;
        // The buckets' alignment padding (zero gradients, no state) is shared out too.
        let padded = on_ranks(1, move |comm| {
            let ddp = Ddp::new(t::build(model, 7), comm, config(false)).unwrap();
            let elems: usize =
                (0..ddp.bucket_layout().len()).map(|b| ddp.bucket_tensor(b).elem_count()).sum();
            (elems * 4, ddp.bucket_layout().len())
        })[0];
        for world in [2, 3] {
            let per_rank: Vec<usize> = run(world, model, opt, true, extras).iter().map(|o| o.2).collect();
            let what = format!("{model:?} {opt:?} {world} ranks: state bytes {per_rank:?} of {unsharded}");
            assert_eq!(
                per_rank.iter().sum::<usize>(),
                unsharded,
                "{what}: the shards must cover the state once"
            );
            // Per bucket, a shard is ceil(len / world) elements: at most one element over the
            // even share per bucket and buffer.
            let buffers = if opt == Opt::AdamW { 2 } else { 1 };
            let bound = buffers * (padded.0 / world + padded.1 * 4);
            assert!(
                per_rank.iter().all(|&b| b <= bound),
                "{what}: a rank holds more than its share ({bound})"
            );
            assert!(per_rank.iter().all(|&b| b < unsharded), "{what}");
        }
    }
}

/// Two parameters in one bucket: `a` (one element) and `b`; the loss is `sum(a * x) + sum(b^2)`.
struct Pair {
    a: Parameter,
    b: Parameter,
}

impl Module for Pair {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("a", &self.a);
        v.param("b", &self.b);
    }
}

#[test]
fn an_overflow_in_one_ranks_shard_skips_the_step_on_every_rank() {
    // Only the last rank's `x` is infinite: the reduced gradient of `a` is inf in the shard
    // of the one rank that owns `a`'s element, every other shard is finite. Each rank's grad
    // scaler sees its shard only, unless the overflow is shared: all must skip.
    for world in [2, 3] {
        let stepped = on_ranks(world, move |comm| {
            let (rank, world) = (comm.rank(), comm.world_size());
            let full = |n: usize, v: f32| Tensor::from_vec(vec![v; n], n, Device::Cpu).unwrap();
            let m = Pair { a: Parameter::new(full(1, 1.0)), b: Parameter::new(full(63, 0.5)) };
            let ddp = Ddp::new(m, comm, config(true)).unwrap();
            let mut opt =
                ZeroOptimizer::new(&ddp, ddp.module().parameters(), |g| Sgd::new(g, SgdConfig::default()))
                    .unwrap();
            let mut scaler = GradScaler::new(GradScalerConfig::default());
            let x = Var::constant(full(1, if rank + 1 == world { f32::INFINITY } else { 1.0 }));
            let loss = ddp.forward_with(|m| m.a.var().mul(&x).sum_all().add(&m.b.var().square().sum_all()));
            scaler.scale(&loss).try_backward().unwrap();
            let stepped = scaler.step(&mut opt);
            scaler.update();
            (stepped, scaler.get_scale(), t::params(ddp.module()))
        });
        for (r, (stepped, scale, params)) in stepped.iter().enumerate() {
            assert!(!stepped, "{world} ranks: rank {r} stepped over an overflow");
            assert_eq!(*scale, 32768.0, "{world} ranks: rank {r} did not back off");
            assert_eq!(params[1].1, vec![0.5; 63], "{world} ranks: rank {r} changed `b`");
        }
    }
}

#[test]
fn a_grad_scaler_with_clipping_trains_as_plain_ddp() {
    let extras = Extras { accumulate: 1, clip: Some(1.0), scale: Some(65536.0), dtype: DType::F32 };
    for (model, opt) in [(Model::Cnn, Opt::AdamW), (Model::Transformer, Opt::SgdMomentum)] {
        let plain = run(2, model, opt, false, extras);
        let sharded = run(2, model, opt, true, extras);
        for r in 0..2 {
            assert_eq!(sharded[r].3, plain[r].3, "{model:?}: scale of rank {r}");
            t::assert_close(&format!("{model:?} with a grad scaler"), &sharded[r].0, &plain[0].0, 1e-5);
        }
    }
}

#[test]
fn f64_and_bf16_parameters_train_as_plain_ddp() {
    for dtype in [DType::F64, DType::BF16] {
        let extras = Extras { accumulate: 2, clip: Some(0.05), scale: None, dtype };
        for (model, opt) in [(Model::Transformer, Opt::AdamW), (Model::Cnn, Opt::SgdMomentum)] {
            let values = |sharded: bool| {
                on_ranks(2, move |comm| {
                    let r = z::train_rank(comm, model, opt, STEPS, PER_RANK, config(sharded), extras);
                    let named = r.ddp.module().named_parameters();
                    assert!(named.iter().all(|(_, p)| p.dtype() == dtype));
                    named.into_iter().map(|(n, p)| (n, p.tensor().to_f64_vec())).collect::<Vec<_>>()
                })
            };
            let (plain, sharded) = (values(false), values(true));
            assert_eq!(sharded[0], sharded[1], "{model:?} {dtype}: ranks differ");
            // The clipping norm's summation order is the only difference; the norm is f32 (as
            // in clip_grad_norm_), so f64 runs agree to f32 rounding of the coefficient, bf16
            // runs to one bf16 rounding of the parameters.
            let tol = if dtype == DType::F64 { 1e-6 } else { 1e-2 };
            for ((n, a), (_, b)) in sharded[0].iter().zip(&plain[0]) {
                let scale = b.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
                let diff = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
                assert!(diff / scale <= tol, "{model:?} {dtype}: `{n}` differs by {:.2e}", diff / scale);
            }
        }
    }
}

#[test]
fn lars_under_zero_takes_whole_parameter_norms_and_follows_plain_ddp() {
    // Each slice's trust ratio comes from the norms of its whole parameter, summed over the
    // ranks' slices: another summation order than one sum over the parameter, so equal to f32
    // rounding. Norms of the slices alone would change every ratio by far more.
    let extras = Extras { accumulate: 2, clip: Some(0.5), scale: None, dtype: DType::F32 };
    for world in [2, 3] {
        for model in [Model::Cnn, Model::Transformer] {
            let what = format!("{model:?} LARS {world} ranks");
            let plain = run(world, model, Opt::Lars, false, extras);
            let sharded = run(world, model, Opt::Lars, true, extras);
            for r in 1..world {
                t::assert_bitwise_equal(&what, &sharded[r].0, &sharded[0].0);
            }
            for ((n, a), (_, b)) in sharded[0].0.iter().zip(&plain[0].0) {
                let scale = b.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
                let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    diff / scale < 1e-5,
                    "{what}: `{n}` differs by {:.2e} of its largest value",
                    diff / scale
                );
            }
        }
    }
}

#[test]
fn an_unsharded_wrapper_is_refused_clearly() {
    on_ranks(2, |comm| {
        let ddp = Ddp::new(t::build(Model::Cnn, 7), comm, config(false)).unwrap();
        let err = ZeroOptimizer::new(&ddp, ddp.module().parameters(), |g| Sgd::new(g, SgdConfig::default()))
            .err()
            .expect("an unsharded wrapper must be refused");
        assert!(matches!(err, DdpError::NotSharded), "{err}");
        assert!(err.to_string().contains("shard_optimizer: true"), "{err}");
    });
    // A sharded wrapper stepped by a plain optimizer would train on unreduced gradients.
    let errors = on_ranks(2, |comm| {
        let (rank, world) = (comm.rank(), comm.world_size());
        let ddp = Ddp::new(t::build(Model::Cnn, 7), comm, config(true)).unwrap();
        let (x, y) = t::batch(Model::Cnn, 0, 2 * world);
        let (x, y) = (t::shard(&x, rank, 2), t::shard(&y, rank, 2));
        let logits = ddp.forward_with(|m| t::forward(Model::Cnn, m, &x));
        t::logits_loss(Model::Cnn, &logits, &y).try_backward().err().map(|e| e.to_string())
    });
    for e in errors {
        assert!(e.as_deref().is_some_and(|e| e.contains("no ZeroOptimizer")), "{e:?}");
    }
}

#[test]
fn groups_keep_their_hyper_parameters_and_foreign_parameters_are_refused() {
    on_ranks(2, |comm| {
        let ddp = Ddp::new(t::build(Model::Transformer, 7), comm, config(true)).unwrap();
        let groups = oxtrain_nn::optim::decay_groups(ddp.module().named_parameters(), 0.5);
        let opt = ZeroOptimizer::new(&ddp, groups, |g| AdamW::new(g, AdamWConfig::default())).unwrap();
        let decay: Vec<f64> = opt.inner().param_groups().iter().map(|g| g.config.weight_decay).collect();
        assert_eq!(decay, vec![0.5, 0.0]);
        assert_eq!(opt.num_groups(), 2);
        let stranger = t::build(Model::Cnn, 1).parameters();
        let err =
            ZeroOptimizer::new(&ddp, stranger, |g| AdamW::new(g, AdamWConfig::default())).err().unwrap();
        assert!(matches!(err, DdpError::NotInModel { .. }), "{err}");
    });
}
