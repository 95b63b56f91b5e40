//! DDP on the `local` backend (ranks as threads): data-parallel training equals one process on
//! the combined batch, every rank ends bit-identical, and the reducer's contracts (no copy,
//! overlap read from the trace, no_sync, bf16 compression, unused and mismatched parameters).

mod common;

use common::ddp_train::{self as t, Model, Opt};
use common::on_ranks;
use oxtrain_ddp::{convert_sync_batchnorm, Compression, Ddp, DdpConfig};
use oxtrain_nn::Module;

const STEPS: usize = 5;
const PER_RANK: usize = 3;

fn check_against_single_process(model: Model, opt: Opt, world: usize, config: DdpConfig, tol: f64) {
    let reference = t::params(&t::train_single(model, opt, STEPS, PER_RANK * world, 1));
    let ranks = on_ranks(world, move |comm| {
        t::params(&t::train_rank(comm, model, opt, STEPS, PER_RANK, 1, config.clone()))
    });
    for r in 1..world {
        t::assert_bitwise_equal(&format!("{model:?} {opt:?} {world} ranks"), &ranks[0], &ranks[r]);
    }
    let err = t::assert_close(&format!("{model:?} {opt:?} {world} ranks"), &ranks[0], &reference, tol);
    eprintln!("{model:?} {opt:?} {world} ranks: {err:.2e} relative from one process");
}

#[test]
fn cnn_and_transformer_train_as_one_process_on_the_combined_batch() {
    for world in [2, 3] {
        for (model, opt) in [
            (Model::Cnn, Opt::SgdMomentum),
            (Model::Cnn, Opt::AdamW),
            (Model::Transformer, Opt::AdamW),
            (Model::Transformer, Opt::SgdMomentum),
        ] {
            check_against_single_process(model, opt, world, DdpConfig::default(), 1e-6);
        }
    }
}

#[test]
fn several_buckets_give_the_same_result() {
    // Buckets of a few hundred bytes: many all-reduces per step, launched as they fill.
    let config = DdpConfig { first_bucket_cap_mb: 0.0002, bucket_cap_mb: 0.0005, ..Default::default() };
    check_against_single_process(Model::Cnn, Opt::SgdMomentum, 3, config, 1e-6);
}

#[test]
fn sync_batch_norm_equals_batch_norm_over_the_combined_batch() {
    for world in [2, 3] {
        let reference = t::train_single(Model::CnnBn, Opt::SgdMomentum, STEPS, PER_RANK * world, 1);
        let ranks = on_ranks(world, move |comm| {
            let rank = comm.rank();
            let m = t::build(Model::CnnBn, if rank == 0 { 7 } else { 50 + rank as u64 });
            assert_eq!(convert_sync_batchnorm(&m, comm.clone()), 2);
            let ddp = Ddp::new(m, comm, DdpConfig::default()).unwrap();
            let mut o = t::optimizer(Opt::SgdMomentum, ddp.module().parameters());
            for step in 0..STEPS {
                let (x, y) = t::batch(Model::CnnBn, step, PER_RANK * world);
                let (x, y) = (t::shard(&x, rank, PER_RANK), t::shard(&y, rank, PER_RANK));
                o.zero_grad();
                let logits = ddp.forward_with(|m| t::forward(Model::CnnBn, m, &x));
                t::logits_loss(Model::CnnBn, &logits, &y).try_backward().unwrap();
                o.step();
            }
            (t::params(ddp.module()), t::buffers(ddp.module()))
        });
        for r in 1..world {
            t::assert_bitwise_equal("SyncBatchNorm", &ranks[0].0, &ranks[r].0);
        }
        t::assert_close("SyncBatchNorm parameters", &ranks[0].0, &t::params(&reference), 1e-6);
        // The running statistics are those of the global batch on every rank.
        let want: Vec<(String, Vec<f32>)> = t::buffers(&reference)
            .into_iter()
            .map(|(n, v)| (n, v.iter().map(|&x| x as f32).collect()))
            .collect();
        for (r, (_, bufs)) in ranks.iter().enumerate() {
            let got: Vec<(String, Vec<f32>)> =
                bufs.iter().map(|(n, v)| (n.clone(), v.iter().map(|&x| x as f32).collect())).collect();
            t::assert_close(&format!("SyncBatchNorm running statistics, rank {r}"), &got, &want, 1e-5);
        }
    }
}

/// Plain batch norm under DDP: each rank normalises with its own batch, gradients are
/// averaged, and rank 0's running statistics are broadcast before every forward. The
/// reference does exactly that in one process, shard by shard.
#[test]
fn plain_batch_norm_follows_the_broadcast_buffers_semantics() {
    let world = 2;
    // Reference: one model per rank, kept equal in parameters by averaging gradients.
    let replicas: Vec<t::Tiny> = (0..world).map(|_| t::build(Model::CnnBn, 7)).collect();
    let mut opts: Vec<_> = replicas.iter().map(|m| t::optimizer(Opt::SgdMomentum, m.parameters())).collect();
    for step in 0..STEPS {
        let (x, y) = t::batch(Model::CnnBn, step, PER_RANK * world);
        let rank0_buffers: Vec<_> = replicas[0].named_buffers().into_iter().map(|(_, b)| b.copy()).collect();
        let mut grads: Vec<Vec<oxtrain_tensor::Tensor>> = Vec::new();
        for (r, m) in replicas.iter().enumerate() {
            for (b, src) in m.named_buffers().into_iter().zip(&rank0_buffers) {
                b.1.copy_(src);
            }
            opts[r].zero_grad();
            t::loss(Model::CnnBn, m, &t::shard(&x, r, PER_RANK), &t::shard(&y, r, PER_RANK)).backward();
            grads.push(m.parameters().iter().map(|p| p.grad().unwrap()).collect());
        }
        for (r, m) in replicas.iter().enumerate() {
            for (i, p) in m.parameters().iter().enumerate() {
                let mean =
                    grads.iter().skip(1).fold(grads[0][i].clone(), |acc, g| acc.add(&g[i])).mul_scalar(0.5);
                p.set_grad(Some(mean));
            }
            opts[r].step();
        }
    }
    let ranks = on_ranks(world, move |comm| {
        let ddp =
            t::train_rank(comm, Model::CnnBn, Opt::SgdMomentum, STEPS, PER_RANK, 1, DdpConfig::default());
        (t::params(ddp.module()), t::buffers(ddp.module()))
    });
    t::assert_bitwise_equal("plain batch norm", &ranks[0].0, &ranks[1].0);
    t::assert_close("plain batch norm parameters", &ranks[0].0, &t::params(&replicas[0]), 1e-6);
    for r in 0..world {
        let got: Vec<(String, Vec<f32>)> =
            ranks[r].1.iter().map(|(n, v)| (n.clone(), v.iter().map(|&x| x as f32).collect())).collect();
        let want: Vec<(String, Vec<f32>)> = t::buffers(&replicas[r])
            .into_iter()
            .map(|(n, v)| (n, v.iter().map(|&x| x as f32).collect()))
            .collect();
        t::assert_close(&format!("rank {r}'s running statistics"), &got, &want, 1e-6);
    }
}

#[test]
fn no_sync_accumulation_equals_the_combined_batch() {
    let (world, accumulate) = (2, 2);
    let reference =
        t::params(&t::train_single(Model::Cnn, Opt::SgdMomentum, STEPS, PER_RANK * world, accumulate));
    let ranks = on_ranks(world, move |comm| {
        t::params(&t::train_rank(
            comm,
            Model::Cnn,
            Opt::SgdMomentum,
            STEPS,
            PER_RANK,
            accumulate,
            DdpConfig::default(),
        ))
    });
    t::assert_bitwise_equal("no_sync", &ranks[0], &ranks[1]);
    t::assert_close("no_sync with 2 accumulation steps", &ranks[0], &reference, 1e-6);
}

#[test]
fn bf16_compression_stays_within_bf16_precision() {
    let world = 2;
    let reference = t::params(&t::train_single(Model::Cnn, Opt::SgdMomentum, STEPS, PER_RANK * world, 1));
    let config = DdpConfig { compression: Compression::Bf16, ..Default::default() };
    let ranks = on_ranks(world, move |comm| {
        t::params(&t::train_rank(comm, Model::Cnn, Opt::SgdMomentum, STEPS, PER_RANK, 1, config.clone()))
    });
    t::assert_bitwise_equal("bf16 compression", &ranks[0], &ranks[1]);
    // bf16 keeps 8 significant bits: each communicated gradient is off by at most 2^-8
    // relative (rounding to nearest), once per step. With lr 0.1 and momentum 0.9 over 5
    // steps, the weights move by a fraction of their size, so their error stays far below
    // 2^-8 of the largest weight; 2^-8 itself is the bound that must hold.
    let err = t::assert_close("bf16 compression", &ranks[0], &reference, 2f64.powi(-8));
    // And it did compress: the result is not the f32 one.
    assert!(err > 1e-7, "bf16 compression gave the f32 result ({err:e}): nothing was compressed");
}

#[test]
fn a_gradient_is_a_view_of_its_bucket() {
    on_ranks(2, |comm| {
        let ddp = t::train_rank(
            comm,
            Model::Cnn,
            Opt::SgdMomentum,
            1,
            PER_RANK,
            1,
            DdpConfig { first_bucket_cap_mb: 0.0002, ..Default::default() },
        );
        let layout = ddp.bucket_layout();
        assert!(layout.len() >= 2, "expected several buckets, got {layout:?}");
        // Reverse registration order: the head's parameters are in the first bucket.
        let names: Vec<String> = ddp.module().named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(layout[0][0], *names.last().unwrap());
        // Recompute a gradient and look where it lives.
        let (x, y) = t::batch(Model::Cnn, 0, PER_RANK * 2);
        let logits = ddp.forward_with(|m| t::forward(Model::Cnn, m, &t::shard(&x, 0, PER_RANK)));
        t::logits_loss(Model::Cnn, &logits, &t::shard(&y, 0, PER_RANK)).backward();
        for (b, members) in layout.iter().enumerate() {
            for name in members {
                let (_, p) = ddp.module().named_parameters().into_iter().find(|(n, _)| n == name).unwrap();
                let g = p.grad().expect("a gradient after backward");
                assert!(g.same_storage(ddp.bucket_tensor(b)), "`{name}`'s gradient is not in bucket {b}");
            }
        }
    });
}

#[test]
fn the_first_bucket_is_reduced_while_backward_goes_on() {
    let traces = on_ranks(2, |comm| {
        let config = DdpConfig { first_bucket_cap_mb: 0.0002, bucket_cap_mb: 0.0005, ..Default::default() };
        let ddp = t::train_rank(comm.clone(), Model::Cnn, Opt::SgdMomentum, 0, PER_RANK, 1, config);
        ddp.enable_trace();
        let mut o = t::optimizer(Opt::SgdMomentum, ddp.module().parameters());
        for step in 0..3 {
            let (x, y) = t::batch(Model::Cnn, step, PER_RANK * 2);
            let r = comm.rank();
            let logits = ddp.forward_with(|m| t::forward(Model::Cnn, m, &t::shard(&x, r, PER_RANK)));
            t::logits_loss(Model::Cnn, &logits, &t::shard(&y, r, PER_RANK)).backward();
            ddp.span("optimizer", || o.step());
        }
        (ddp.trace_json(), ddp.last_step().unwrap(), ddp.bucket_layout().len())
    });
    for (json, stats, buckets) in traces {
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let spans: Vec<&serde_json::Value> =
            v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
        let times = |name: &str| -> Vec<(f64, f64)> {
            spans
                .iter()
                .filter(|e| e["name"] == name)
                .map(|e| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap()))
                .collect()
        };
        for name in ["forward", "backward", "optimizer", "backward compute", "all_reduce bucket 0"] {
            assert_eq!(times(name).len(), 3, "one `{name}` span per step in {json}");
        }
        assert_eq!(times(&format!("all_reduce bucket {}", buckets - 1)).len(), 3);
        // In every step, bucket 0's all-reduce was launched before backward had computed its
        // last gradient: communication overlapped the rest of backward.
        for (bucket0, compute) in times("all_reduce bucket 0").iter().zip(times("backward compute")) {
            assert!(
                bucket0.0 < compute.1,
                "bucket 0 started at {} after the last gradient at {}",
                bucket0.0,
                compute.1
            );
        }
        assert_eq!(stats.buckets, buckets);
        eprintln!("last step: {stats:?}");
    }
}

#[test]
fn an_unused_parameter_is_an_error_naming_it_unless_allowed() {
    let errors = on_ranks(2, |comm| {
        let m = t::WithUnused {
            inner: t::build(Model::Cnn, 7),
            unused: oxtrain_nn::Parameter::new(
                oxtrain_tensor::Tensor::ones(3, oxtrain_tensor::DType::F32, oxtrain_tensor::Device::Cpu)
                    .unwrap(),
            ),
        };
        let ddp = Ddp::new(m, comm.clone(), DdpConfig::default()).unwrap();
        let (x, y) = t::batch(Model::Cnn, 0, PER_RANK);
        let logits = ddp.forward_with(|m| t::forward(Model::Cnn, &m.inner, &x));
        t::logits_loss(Model::Cnn, &logits, &y).try_backward().unwrap_err().to_string()
    });
    for e in errors {
        assert!(e.contains("`extra`") && e.contains("find_unused_parameters"), "{e}");
    }
    // With the flag it trains: the unused parameter keeps no gradient, the others are reduced.
    let results = on_ranks(2, |comm| {
        let rank = comm.rank();
        let m = t::WithUnused {
            inner: t::build(Model::Cnn, 7 + rank as u64),
            unused: oxtrain_nn::Parameter::new(
                oxtrain_tensor::Tensor::ones(3, oxtrain_tensor::DType::F32, oxtrain_tensor::Device::Cpu)
                    .unwrap(),
            ),
        };
        let config = DdpConfig { find_unused_parameters: true, ..Default::default() };
        let ddp = Ddp::new(m, comm.clone(), config).unwrap();
        let mut o = t::optimizer(Opt::AdamW, ddp.module().parameters());
        for step in 0..3 {
            let (x, y) = t::batch(Model::Cnn, step, PER_RANK * 2);
            o.zero_grad();
            let logits =
                ddp.forward_with(|m| t::forward(Model::Cnn, &m.inner, &t::shard(&x, rank, PER_RANK)));
            t::logits_loss(Model::Cnn, &logits, &t::shard(&y, rank, PER_RANK)).try_backward().unwrap();
            assert!(
                ddp.module().unused.var().grad().is_none(),
                "a parameter unused on every rank got a gradient"
            );
            o.step();
        }
        (t::params(ddp.module()), ddp.module().unused.tensor().to_vec::<f32>())
    });
    t::assert_bitwise_equal("find_unused_parameters", &results[0].0, &results[1].0);
    assert_eq!(results[0].1, vec![1.0; 3], "AdamW must skip a parameter without gradient");
}

#[test]
fn a_parameter_used_on_one_rank_only_is_averaged_with_zero() {
    let results = on_ranks(2, |comm| {
        let rank = comm.rank();
        let m = t::WithUnused {
            inner: t::build(Model::Cnn, 7),
            unused: oxtrain_nn::Parameter::new(
                oxtrain_tensor::Tensor::ones(3, oxtrain_tensor::DType::F32, oxtrain_tensor::Device::Cpu)
                    .unwrap(),
            ),
        };
        let ddp = Ddp::new(m, comm.clone(), DdpConfig { find_unused_parameters: true, ..Default::default() })
            .unwrap();
        let (x, y) = t::batch(Model::Cnn, 0, PER_RANK);
        let logits = ddp.forward_with(|m| t::forward(Model::Cnn, &m.inner, &x));
        let mut loss = t::logits_loss(Model::Cnn, &logits, &y);
        if rank == 1 {
            // d/dextra of sum(extra) * 2 is 2 for each element, on rank 1 only.
            loss = loss + ddp.module().unused.var().sum_all() * 2.0;
        }
        loss.try_backward().unwrap();
        ddp.module().unused.var().grad().unwrap().to_vec::<f32>()
    });
    assert_eq!(results, vec![vec![1.0; 3], vec![1.0; 3]], "the mean of 2 (rank 1) and 0 (rank 0)");
}

#[test]
fn mismatched_models_fail_at_new_on_every_rank() {
    let errors = on_ranks(3, |comm| {
        let model = if comm.rank() == 2 { Model::CnnBn } else { Model::Cnn };
        Ddp::new(t::build(model, 7), comm, DdpConfig::default()).err().map(|e| e.to_string())
    });
    for e in errors {
        let e = e.expect("a different model on rank 2 must be an error");
        assert!(e.contains("rank 2 wraps a different model"), "{e}");
    }
}

#[test]
fn impossible_bucket_sizes_are_errors() {
    on_ranks(1, |comm| {
        let e =
            Ddp::new(t::build(Model::Cnn, 7), comm, DdpConfig { bucket_cap_mb: 0.0, ..Default::default() })
                .err()
                .unwrap()
                .to_string();
        assert!(e.contains("bucket_cap_mb must be a positive number"), "{e}");
    });
}
