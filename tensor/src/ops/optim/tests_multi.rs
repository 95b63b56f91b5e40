//! Multi-tensor steps against the per-tensor ops, bit for bit (mixed sizes around the block's
//! chunk, a 1-element parameter, an offset view, mixed gradient dtypes, more parameters than
//! one launch takes); kept casts against fresh casts after steps and in-place changes; the
//! fused running statistics against the composed ops they replace.

use super::{AdamWParam, MultiTensorStep, SgdParam};
use crate::{device_test, AdamWStep, DType, Device, Distribution, Generator, SgdStep, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

fn randn(n: usize, dev: Device) -> Tensor {
    static SEED: AtomicU64 = AtomicU64::new(1000);
    let mut gen = Generator::new(SEED.fetch_add(1, Ordering::Relaxed));
    Distribution::STANDARD_NORMAL
        .sample_with(&mut gen, n, DType::F32, Device::Cpu)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

#[track_caller]
fn same_bits(got: &Tensor, want: &Tensor, what: &str) {
    let (g, w) = (bits(got), bits(want));
    assert_eq!(g.len(), w.len(), "{what}: length");
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        let (a, b) = (f64::from_bits(g[i]), f64::from_bits(w[i]));
        panic!("{what}: element {i} is {a:e}, the per-tensor op gives {b:e}");
    }
}

/// 1 element; around 4 (the vector width elsewhere); a block's chunk and past it; an offset view.
const SIZES: [usize; 9] = [1, 3, 4, 5, 37, 1000, 32768, 65537, 77];

/// Fresh parameters of `SIZES` (the last one a view at offset 5 of a larger tensor) and copies
/// for the per-tensor reference.
fn params(dev: Device) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut ps: Vec<Tensor> = SIZES[..SIZES.len() - 1].iter().map(|&n| randn(n, dev)).collect();
    let n = SIZES[SIZES.len() - 1];
    ps.push(randn(n + 9, dev).narrow(0, 5, n));
    let refs = ps.iter().map(Tensor::copy).collect();
    (ps, refs)
}

fn zeros(n: usize, dev: Device) -> Tensor {
    Tensor::zeros(n, DType::F32, dev).unwrap()
}

fn grads(dev: Device, dtypes: &[DType]) -> Vec<Tensor> {
    SIZES.iter().enumerate().map(|(i, &n)| randn(n, dev).to_dtype(dtypes[i % dtypes.len()])).collect()
}

fn sgd_matches_per_tensor(dev: Device, cfg: SgdStep, dtypes: &[DType]) {
    let (ps, refs) = params(dev);
    let has_buf = cfg.momentum != 0.0;
    let bufs: Vec<Option<Tensor>> = SIZES.iter().map(|&n| has_buf.then(|| zeros(n, dev))).collect();
    let ref_bufs: Vec<Option<Tensor>> = SIZES.iter().map(|&n| has_buf.then(|| zeros(n, dev))).collect();
    let mut multi = MultiTensorStep::new();
    for step in 0..4 {
        let gs = grads(dev, dtypes);
        let list: Vec<SgdParam> = (0..ps.len())
            .map(|i| SgdParam { param: ps[i].clone(), grad: gs[i].clone(), momentum_buf: bufs[i].clone() })
            .collect();
        multi.sgd_step_(&list, step == 0, &cfg);
        for i in 0..ps.len() {
            refs[i].sgd_step_(&gs[i], ref_bufs[i].as_ref(), step == 0, &cfg);
            same_bits(&ps[i], &refs[i], &format!("{cfg:?}: parameter {i} after step {step}"));
            if let (Some(b), Some(r)) = (&bufs[i], &ref_bufs[i]) {
                same_bits(b, r, &format!("{cfg:?}: momentum {i} after step {step}"));
            }
        }
    }
}

const SGD: SgdStep =
    SgdStep { lr: 0.1, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0, maximize: false };

device_test! {
    fn multi_tensor_sgd_is_the_per_tensor_step_bit_for_bit(dev: Device) {
        let all = [DType::F32, DType::BF16, DType::F16];
        sgd_matches_per_tensor(dev, SGD, &[DType::F32]);
        sgd_matches_per_tensor(dev, SgdStep { momentum: 0.9, dampening: 0.1, weight_decay: 1e-2, ..SGD }, &all);
        let nesterov = SgdStep { momentum: 0.8, nesterov: true, maximize: true, weight_decay: 5e-3, ..SGD };
        sgd_matches_per_tensor(dev, nesterov, &all);
    }
}

struct AdamState {
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    vmax: Vec<Option<Tensor>>,
}

impl AdamState {
    fn new(sizes: &[usize], amsgrad: bool, dev: Device) -> AdamState {
        AdamState {
            m: sizes.iter().map(|&n| zeros(n, dev)).collect(),
            v: sizes.iter().map(|&n| zeros(n, dev)).collect(),
            vmax: sizes.iter().map(|&n| amsgrad.then(|| zeros(n, dev))).collect(),
        }
    }

    fn list(&self, ps: &[Tensor], gs: &[Tensor]) -> Vec<AdamWParam> {
        (0..ps.len())
            .map(|i| AdamWParam {
                param: ps[i].clone(),
                grad: gs[i].clone(),
                exp_avg: self.m[i].clone(),
                exp_avg_sq: self.v[i].clone(),
                max_exp_avg_sq: self.vmax[i].clone(),
            })
            .collect()
    }
}

const ADAMW: AdamWStep =
    AdamWStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 1e-2, step: 1, maximize: false };

fn adamw_matches_per_tensor(dev: Device, ps: Vec<Tensor>, refs: Vec<Tensor>, cfg: AdamWStep, amsgrad: bool) {
    let sizes: Vec<usize> = ps.iter().map(Tensor::elem_count).collect();
    let (state, ref_state) = (AdamState::new(&sizes, amsgrad, dev), AdamState::new(&sizes, amsgrad, dev));
    let mut multi = MultiTensorStep::new();
    let dtypes = [DType::F32, DType::BF16, DType::F32, DType::F16];
    for step in 1..=4 {
        let cfg = AdamWStep { step, ..cfg };
        let gs: Vec<Tensor> =
            sizes.iter().enumerate().map(|(i, &n)| randn(n, dev).to_dtype(dtypes[i % 4])).collect();
        multi.adamw_step_(&state.list(&ps, &gs), &cfg);
        for i in 0..ps.len() {
            let r = &ref_state;
            refs[i].adamw_step_(&gs[i], &r.m[i], &r.v[i], r.vmax[i].as_ref(), &cfg);
            let what = |t: &str| format!("{cfg:?} amsgrad {amsgrad}: {t} {i} after step {step}");
            same_bits(&ps[i], &refs[i], &what("parameter"));
            same_bits(&state.m[i], &r.m[i], &what("exp_avg"));
            same_bits(&state.v[i], &r.v[i], &what("exp_avg_sq"));
            if let (Some(a), Some(b)) = (&state.vmax[i], &r.vmax[i]) {
                same_bits(a, b, &what("max_exp_avg_sq"));
            }
        }
    }
}

device_test! {
    fn multi_tensor_adamw_is_the_per_tensor_step_bit_for_bit(dev: Device) {
        let (ps, refs) = params(dev);
        adamw_matches_per_tensor(dev, ps, refs, ADAMW, false);
        let (ps, refs) = params(dev);
        adamw_matches_per_tensor(dev, ps, refs, AdamWStep { maximize: true, weight_decay: 0.1, ..ADAMW }, true);
        let (ps, refs) = params(dev);
        adamw_matches_per_tensor(dev, ps, refs, AdamWStep { weight_decay: 0.0, ..ADAMW }, true);
    }
}

device_test! {
    fn more_parameters_than_one_launch_takes_are_all_updated(dev: Device) {
        // 330 parameters (one launch takes 320) of 1 to 40 elements.
        let ps: Vec<Tensor> = (0..330).map(|i| randn(1 + (i * 7) % 40, dev)).collect();
        let refs = ps.iter().map(Tensor::copy).collect();
        adamw_matches_per_tensor(dev, ps, refs, ADAMW, false);
    }
}

device_test! {
    fn a_parameter_listed_twice_is_stepped_twice_in_order(dev: Device) {
        let (p, r) = (randn(50, dev), randn(50, dev));
        r.copy_(&p);
        let (g, b, rb) = (randn(50, dev), zeros(50, dev), zeros(50, dev));
        let cfg = SgdStep { momentum: 0.9, ..SGD };
        let item = SgdParam { param: p.clone(), grad: g.clone(), momentum_buf: Some(b.clone()) };
        MultiTensorStep::new().sgd_step_(&[item.clone(), item], true, &cfg);
        r.sgd_step_(&g, Some(&rb), true, &cfg);
        r.sgd_step_(&g, Some(&rb), true, &cfg);
        same_bits(&p, &r, "a parameter listed twice");
        same_bits(&b, &rb, "its momentum buffer");
    }
}

fn fresh_cast_equal(p: &Tensor, dtype: DType, what: &str) {
    let kept = p.to_dtype_cached(dtype);
    assert_eq!(kept.dims(), p.dims(), "{what}: shape");
    same_bits(&kept, &p.to_dtype(dtype), what);
}

device_test! {
    fn kept_casts_are_rewritten_by_the_multi_tensor_step(dev: Device) {
        for dtype in [DType::BF16, DType::F16, DType::F64] {
            let (ps, _) = params(dev);
            for p in &ps {
                p.keep_casts();
                drop(p.to_dtype_cached(dtype));
            }
            let sizes: Vec<usize> = ps.iter().map(Tensor::elem_count).collect();
            let state = AdamState::new(&sizes, false, dev);
            let mut multi = MultiTensorStep::new();
            for step in 1..=3 {
                let gs: Vec<Tensor> = sizes.iter().map(|&n| randn(n, dev)).collect();
                multi.adamw_step_(&state.list(&ps, &gs), &AdamWStep { step, ..ADAMW });
                for (i, p) in ps.iter().enumerate() {
                    fresh_cast_equal(p, dtype, &format!("{dtype} cast of parameter {i} after step {step}"));
                    // Rewritten in place (once per step) rather than cast again, where the
                    // launch covers the parameter's whole storage.
                    let whole = p.layout().offset() == 0;
                    if dev.is_cuda() && whole {
                        assert_eq!(p.to_dtype_cached(dtype).version(), step, "{dtype} cast of parameter {i}");
                    }
                    assert_eq!(p.kept_cast_count(), 1, "{dtype} casts kept of parameter {i}");
                }
            }
        }
    }
}

device_test! {
    fn a_kept_cast_is_never_stale_and_never_changes_under_its_holder(dev: Device) {
        let p = randn(37, dev);
        p.keep_casts();
        let view = p.narrow(0, 3, 20);
        let held = view.to_dtype_cached(DType::BF16);
        same_bits(&held, &view.to_dtype(DType::BF16), "a view's kept cast");
        assert!(p.to_dtype_cached(DType::BF16).same_storage(&held), "the cast is reused");
        let before = held.to_f64_vec();
        let changes: [&dyn Fn(); 4] = [
            &|| {
                p.copy_(&randn(37, dev));
            },
            &|| {
                p.add_scalar_(0.5);
            },
            &|| {
                p.narrow(0, 30, 5).fill_(2.0);
            },
            &|| p.sgd_step_(&randn(37, dev), None, true, &SGD),
        ];
        for (k, change) in changes.iter().enumerate() {
            change();
            fresh_cast_equal(&p, DType::BF16, &format!("after in-place change {k}"));
            fresh_cast_equal(&view, DType::BF16, &format!("the view after in-place change {k}"));
        }
        // A multi-tensor step while a view of the kept cast is held: the holder's values stay.
        let held = p.to_dtype_cached(DType::BF16);
        let before_step = held.to_f64_vec();
        let item = SgdParam { param: p.clone(), grad: randn(37, dev), momentum_buf: None };
        MultiTensorStep::new().sgd_step_(&[item], false, &SGD);
        assert_eq!(held.to_f64_vec(), before_step, "a held cast changed under its holder");
        fresh_cast_equal(&p, DType::BF16, "after a step with the cast held");
        assert_ne!(before, p.to_dtype(DType::BF16).narrow(0, 3, 20).to_f64_vec(), "the parameter changed");
        // A write into the kept copy voids it.
        p.to_dtype_cached(DType::BF16).fill_(0.0);
        fresh_cast_equal(&p, DType::BF16, "after a write into the kept cast");
        // Casts of unmarked tensors are not kept.
        let t = randn(8, dev);
        assert!(!t.to_dtype_cached(DType::BF16).same_storage(&t.to_dtype_cached(DType::BF16)));
        assert_eq!(t.kept_cast_count(), 0);
    }
}

/// The composition `update_running_stats_` replaces, as batch norm wrote it.
fn composed_running_stats(rm: &Tensor, rv: &Tensor, count: &Tensor, m: &Tensor, v: &Tensor, f: f64, k: f64) {
    count.add_scalar_(1.0);
    let unbiased = v.mul_scalar(k);
    for (running, batch) in [(rm, m), (rv, &unbiased)] {
        running.copy_(&running.mul_scalar(1.0 - f).add(&batch.mul_scalar(f)));
    }
}

device_test! {
    fn fused_running_statistics_equal_the_composed_ops_bit_for_bit(dev: Device) {
        for c in [1, 3, 64, 1000, 2049] {
            let (rm, rv) = (randn(c, dev), randn(c, dev).abs());
            let (rm2, rv2) = (rm.copy(), rv.copy());
            let (count, count2) = (Tensor::scalar(3i64, dev).unwrap(), Tensor::scalar(3i64, dev).unwrap());
            for (f, k) in [(0.1, 256.0 / 255.0), (0.3, 1.5), (1.0 / 7.0, 12544.0 / 12543.0)] {
                let (m, v) = (randn(c, dev), randn(c, dev).abs());
                Tensor::update_running_stats_((&rm, &rv), Some(&count), (&m, &v), f, k);
                composed_running_stats(&rm2, &rv2, &count2, &m, &v, f, k);
                same_bits(&rm, &rm2, &format!("running mean, {c} channels, factor {f}"));
                same_bits(&rv, &rv2, &format!("running var, {c} channels, factor {f}"));
                assert_eq!(count.to_vec::<i64>(), count2.to_vec::<i64>(), "the batch counter");
            }
            // Without a counter the counter is left alone.
            let (m, v) = (randn(c, dev), randn(c, dev).abs());
            Tensor::update_running_stats_((&rm, &rv), None, (&m, &v), 0.1, 2.0);
            assert_eq!(count.to_vec::<i64>(), vec![6]);
        }
    }
}
