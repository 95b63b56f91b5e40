//! ZeRO-1's parameter all-gather overlapped with the next forward (`overlap_param_gather`, the
//! default): `step` returns with the gathers in flight, and every way of reading the
//! parameters afterwards (the forward, `state_dict`, a save, `shard_state`, `Var`s cloned
//! before the step once the optimizer waited or dropped) sees what the eager mode (the step
//! waits) gives, bit for bit. On the `local` backend, ranks as threads.

mod common;

use common::ddp_train::{self as t, Model, Opt, Tiny};
use common::on_ranks;
use oxtrain_autograd::Var;
use oxtrain_comm::{CommError, Communicator, ReduceOp, Work};
use oxtrain_ddp::{Ddp, DdpConfig, ZeroOptimizer};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{Module, Parameter, Visitor};
use oxtrain_tensor::{DType, Device, Shape, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const STEPS: usize = 4;
const PER_RANK: usize = 3;

/// Small buckets, so every model has several and shards cut through parameters.
fn config(overlap: bool) -> DdpConfig {
    DdpConfig {
        shard_optimizer: true,
        overlap_param_gather: overlap,
        bucket_cap_mb: 0.002,
        first_bucket_cap_mb: 0.001,
        ..DdpConfig::default()
    }
}

/// One rank training a test model under a [`ZeroOptimizer`].
struct Rank {
    ddp: Ddp<Tiny>,
    opt: ZeroOptimizer<Box<dyn Optimizer>>,
    model: Model,
    rank: usize,
    world: usize,
}

impl Rank {
    fn new(comm: Arc<dyn Communicator>, model: Model, opt: Opt, overlap: bool) -> Rank {
        let (rank, world) = (comm.rank(), comm.world_size());
        let ddp = Ddp::new(t::build(model, 7 + rank as u64), comm, config(overlap)).unwrap();
        let opt = ZeroOptimizer::new(&ddp, ddp.module().parameters(), |g| t::optimizer(opt, g)).unwrap();
        assert_eq!(opt.overlaps_param_gather(), overlap);
        Rank { ddp, opt, model, rank, world }
    }

    /// Forward (the loss's bits) and backward of `step`'s batch.
    fn forward_backward(&mut self, step: usize) -> u32 {
        let (x, y) = t::batch(self.model, step, PER_RANK * self.world);
        let (x, y) = (t::shard(&x, self.rank, PER_RANK), t::shard(&y, self.rank, PER_RANK));
        self.opt.zero_grad();
        let logits = self.ddp.forward_with(|m| t::forward(self.model, m, &x));
        let loss = t::logits_loss(self.model, &logits, &y);
        loss.try_backward().unwrap();
        (loss.tensor().to_dtype(DType::F32).item() as f32).to_bits()
    }

    fn buckets(&self) -> usize {
        self.ddp.bucket_layout().len()
    }
}

/// What one rank saw over a run: the loss bits of each forward, the pending gathers after each
/// step and after each forward, and the parameters at the end.
#[derive(Debug, PartialEq)]
struct Seen {
    losses: Vec<u32>,
    pending_after_step: Vec<usize>,
    pending_after_forward: Vec<usize>,
    params: Vec<(String, Vec<f32>)>,
}

fn train(world: usize, model: Model, opt: Opt, overlap: bool) -> Vec<(Seen, usize)> {
    on_ranks(world, move |comm| {
        let mut r = Rank::new(comm, model, opt, overlap);
        let mut seen = Seen {
            losses: Vec::new(),
            pending_after_step: Vec::new(),
            pending_after_forward: Vec::new(),
            params: Vec::new(),
        };
        for step in 0..STEPS {
            seen.losses.push(r.forward_backward(step));
            seen.pending_after_forward.push(r.opt.pending_gathers());
            r.opt.try_step().unwrap();
            seen.pending_after_step.push(r.opt.pending_gathers());
        }
        seen.losses.push(r.forward_backward(STEPS));
        seen.params = t::params(r.ddp.module());
        (seen, r.buckets())
    })
}

#[test]
fn step_returns_with_the_gathers_in_flight_and_the_forward_sees_the_eager_values() {
    for world in [2, 3] {
        for (model, opt) in [(Model::Cnn, Opt::SgdMomentum), (Model::Transformer, Opt::AdamW)] {
            let what = format!("{model:?} {opt:?} {world} ranks");
            let eager = train(world, model, opt, false);
            let overlapped = train(world, model, opt, true);
            for (r, ((lazy, buckets), (eager, _))) in overlapped.iter().zip(&eager).enumerate() {
                assert!(*buckets > 1, "{what}: the test wants several buckets");
                // Every gather is still pending when step returns; the forward reads every
                // parameter, so none is left after it.
                assert_eq!(lazy.pending_after_step, vec![*buckets; STEPS], "{what}: rank {r}");
                assert_eq!(lazy.pending_after_forward, vec![0; STEPS], "{what}: rank {r}");
                assert_eq!(eager.pending_after_step, vec![0; STEPS], "{what}: rank {r}");
                assert_eq!(lazy.losses, eager.losses, "{what}: rank {r}'s losses (f32 bits)");
                t::assert_bitwise_equal(&what, &lazy.params, &eager.params);
                t::assert_bitwise_equal(&what, &lazy.params, &overlapped[0].0.params);
            }
        }
    }
}

/// Three parameters, each in a bucket of its own; the loss is `sum(a) + sum(b^2) + sum(c^3)`.
struct Three {
    a: Parameter,
    b: Parameter,
    c: Parameter,
}

impl Module for Three {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("a", &self.a);
        v.param("b", &self.b);
        v.param("c", &self.c);
    }
}

fn three(comm: Arc<dyn Communicator>, overlap: bool) -> (Ddp<Three>, ZeroOptimizer<Sgd>) {
    let p = |n: usize, v: f32| Parameter::new(Tensor::from_vec(vec![v; n], n, Device::Cpu).unwrap());
    let m = Three { a: p(300, 1.0), b: p(300, 0.5), c: p(300, -0.25) };
    let config = DdpConfig { bucket_cap_mb: 0.001, ..config(overlap) };
    let ddp = Ddp::new(m, comm, config).unwrap();
    assert_eq!(ddp.bucket_layout().len(), 3, "one bucket per parameter");
    let sgd = SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() };
    let opt = ZeroOptimizer::new(&ddp, ddp.module().parameters(), |g| Sgd::new(g, sgd)).unwrap();
    (ddp, opt)
}

fn three_step(ddp: &Ddp<Three>, opt: &mut ZeroOptimizer<Sgd>) {
    opt.zero_grad();
    let loss = ddp.forward_with(|m| {
        let (a, b, c) = (m.a.var(), m.b.var(), m.c.var());
        a.sum_all().add(&b.square().sum_all()).add(&c.square().mul(&c).sum_all())
    });
    loss.try_backward().unwrap();
    opt.try_step().unwrap();
}

#[test]
fn a_read_waits_for_its_own_bucket_only() {
    let seen = on_ranks(2, |comm| {
        let (ddp, mut opt) = three(comm, true);
        three_step(&ddp, &mut opt);
        let m = ddp.module();
        let armed = |m: &Three| [&m.a, &m.b, &m.c].map(|p| p.gate().is_armed());
        let mut log = vec![(opt.pending_gathers(), armed(m))];
        let c = m.c.tensor().to_vec::<f32>();
        log.push((opt.pending_gathers(), armed(m)));
        let a = m.a.var().tensor().to_vec::<f32>();
        log.push((opt.pending_gathers(), armed(m)));
        opt.wait_parameters().unwrap();
        log.push((opt.pending_gathers(), armed(m)));
        (log, a, c, m.b.tensor().to_vec::<f32>())
    });
    let eager = on_ranks(2, |comm| {
        let (ddp, mut opt) = three(comm, false);
        three_step(&ddp, &mut opt);
        assert_eq!(opt.pending_gathers(), 0);
        assert!(!ddp.module().a.gate().is_armed());
        let m = ddp.module();
        (m.a.tensor().to_vec::<f32>(), m.c.tensor().to_vec::<f32>(), m.b.tensor().to_vec::<f32>())
    });
    for ((log, a, c, b), (ea, ec, eb)) in seen.iter().zip(&eager) {
        assert_eq!(
            log,
            &vec![(3, [true; 3]), (2, [true, true, false]), (1, [false, true, false]), (0, [false; 3])],
            "pending gathers and armed gates after: the step, reading c, reading a, wait_parameters"
        );
        assert_eq!((a, b, c), (ea, eb, ec), "the values read are the eager step's");
        // Every element took the same step (the gradient of `sum(a)` is 1): each rank stepped
        // its half, the other half came from the peer's gather.
        assert!(a[0] != 1.0 && a.iter().all(|v| *v == a[0]), "`a` did not take one step everywhere");
    }
    assert_eq!(seen[0].1, seen[1].1, "the ranks read different values of `a`");
    assert_eq!(seen[0].3, seen[1].3, "the ranks read different values of `b`");
}

#[test]
fn state_dict_saving_and_earlier_clones_right_after_a_step_see_the_gathered_values() {
    let dir = std::env::temp_dir().join(format!("oxtrain-zero-overlap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = Arc::new(dir);
    let seen = |overlap: bool| {
        let dir = dir.clone();
        on_ranks(2, move |comm| {
            let mut r = Rank::new(comm, Model::Transformer, Opt::AdamW, overlap);
            let clones: Vec<Var> = r.ddp.module().parameters();
            for step in 0..2 {
                r.forward_backward(step);
                r.opt.try_step().unwrap();
            }
            // No forward since the step: only the readers below can wait for the gathers.
            let pending = r.opt.pending_gathers();
            let state: Vec<(String, Vec<f32>)> =
                r.ddp.module().state_dict().into_iter().map(|(n, t)| (n, t.to_vec::<f32>())).collect();
            let after_state_dict = r.opt.pending_gathers();
            let path = dir.join(format!("model-{overlap}-{}.safetensors", r.rank));
            r.ddp.module().save_safetensors(&path).unwrap();
            let saved: Vec<(String, Vec<f32>)> = oxtrain_tensor::safetensors::load_all(&path)
                .unwrap()
                .into_iter()
                .map(|(n, t)| (n, t.to_vec::<f32>()))
                .collect();
            // Another step, then a checkpoint of the optimizer and a drop, with no forward.
            r.forward_backward(2);
            r.opt.try_step().unwrap();
            let pending_before_shard = r.opt.pending_gathers();
            r.opt.shard_state().unwrap();
            let after_shard_state = r.opt.pending_gathers();
            r.forward_backward(3);
            r.opt.try_step().unwrap();
            drop(r.opt);
            let after_drop: Vec<Vec<f32>> = clones.iter().map(|v| v.tensor().to_vec::<f32>()).collect();
            let pending = (pending, after_state_dict, pending_before_shard, after_shard_state);
            (pending, state, saved, after_drop)
        })
    };
    let (lazy_all, eager) = (seen(true), seen(false));
    std::fs::remove_dir_all(&*dir).unwrap();
    for (r, (lazy, eager)) in lazy_all.iter().zip(&eager).enumerate() {
        let (pending, after_state_dict, before_shard, after_shard) = lazy.0;
        assert!(pending > 1 && before_shard > 1, "rank {r}: the gathers were waited for in step");
        assert_eq!((after_state_dict, after_shard), (0, 0), "rank {r}: a reader left a gather pending");
        assert_eq!(eager.0, (0, 0, 0, 0), "rank {r}: the eager step left a gather pending");
        t::assert_bitwise_equal("state_dict after the step", &lazy.1, &eager.1);
        let mut saved = lazy.2.clone();
        saved.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want = eager.1.clone();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        t::assert_bitwise_equal("the saved safetensors", &saved, &want);
        assert_eq!(lazy.3, eager.3, "rank {r}: Vars cloned before the steps, after the optimizer's drop");
        // And the values are the gathered ones, the same on every rank.
        t::assert_bitwise_equal("state_dict on every rank", &lazy.1, &lazy_all[0].1);
        assert_eq!(lazy.3, lazy_all[0].3, "rank {r}: the ranks' parameters differ after the drop");
    }
}

/// The local backend with every all-gather failing while `fail` is set (on all ranks, so
/// none waits for a peer).
struct FailingGather {
    inner: Arc<dyn Communicator>,
    fail: Arc<AtomicBool>,
}

impl Communicator for FailingGather {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> oxtrain_comm::Result<Work> {
        self.inner.all_reduce(tensor, op)
    }
    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> oxtrain_comm::Result<Work> {
        self.inner.reduce(tensor, dst, op)
    }
    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> oxtrain_comm::Result<Work> {
        self.inner.reduce_scatter(output, input, op)
    }
    fn all_gather(&self, output: &Tensor, input: &Tensor) -> oxtrain_comm::Result<Work> {
        if self.fail.load(Ordering::Relaxed) {
            // Launched, failing when waited for: the wait happens in the next forward.
            return Ok(Work::done(Err(CommError::Aborted("injected all_gather failure".into()))));
        }
        self.inner.all_gather(output, input)
    }
    fn broadcast(&self, tensor: &Tensor, src: usize) -> oxtrain_comm::Result<Work> {
        self.inner.broadcast(tensor, src)
    }
    fn barrier(&self) -> oxtrain_comm::Result<Work> {
        self.inner.barrier()
    }
    fn symmetric_tensor(&self, shape: Shape, dtype: DType, device: Device) -> oxtrain_comm::Result<Tensor> {
        self.inner.symmetric_tensor(shape, dtype, device)
    }
}

#[test]
fn a_failed_gather_read_in_a_forward_is_returned_by_the_next_fallible_call() {
    let errors = on_ranks(2, |comm| {
        let fail = Arc::new(AtomicBool::new(false));
        let comm: Arc<dyn Communicator> = Arc::new(FailingGather { inner: comm, fail: fail.clone() });
        let (ddp, mut opt) = three(comm, true);
        fail.store(true, Ordering::Relaxed);
        three_step(&ddp, &mut opt);
        // A forward's reads run the failed gathers: no panic, the values stay as they were.
        let m = ddp.module();
        let _ = (m.a.var(), m.b.var(), m.c.var());
        let after_forward = opt.pending_gathers();
        let before = m.b.tensor().to_vec::<f32>();
        let from_wait = opt.wait_parameters().err().map(|e| e.to_string());
        let again = opt.wait_parameters().is_ok();
        // A failure nobody waited for explicitly comes back from the next step.
        three_step_then(&ddp, &mut opt, |opt| {
            assert_eq!(opt.pending_gathers(), 3);
        });
        let from_step = {
            let _ = ddp.module().a.var(); // one bucket read by a forward, the others by the step
            opt.try_step().err().map(|e| e.to_string())
        };
        fail.store(false, Ordering::Relaxed);
        (before, after_forward, from_wait, again, from_step)
    });
    for (r, (before, after_forward, from_wait, again, from_step)) in errors.into_iter().enumerate() {
        assert_eq!(after_forward, 0, "rank {r}");
        assert!(from_wait.as_deref().is_some_and(|e| e.contains("injected")), "rank {r}: {from_wait:?}");
        assert!(again, "rank {r}: an error is returned once");
        assert!(from_step.as_deref().is_some_and(|e| e.contains("injected")), "rank {r}: {from_step:?}");
        // This rank's own half of `b` stepped in place; the peer's half never arrived.
        let changed = before.iter().filter(|&&v| v != 0.5).count();
        assert!(changed > 100 && changed < 200, "rank {r}: {changed} of `b`'s 300 values changed");
    }
}

/// A step whose gathers are left pending, then `check`.
fn three_step_then(ddp: &Ddp<Three>, opt: &mut ZeroOptimizer<Sgd>, check: impl FnOnce(&ZeroOptimizer<Sgd>)) {
    opt.zero_grad();
    let loss = ddp.forward_with(|m| m.a.var().sum_all().add(&m.b.var().sum_all()).add(&m.c.var().sum_all()));
    loss.try_backward().unwrap();
    opt.try_step().unwrap();
    check(opt);
}
