//! Optimizers, clipping and the gradient scaler against PyTorch (fixtures.py); LARS against an
//! f64 implementation of its formula; save -> restore -> continue against not stopping.

use super::*;
use crate::amp::{GradScaler, GradScalerConfig};
use oxtrain_autograd::Var;
use oxtrain_tensor::testing::{assert_close, Fixtures};
use oxtrain_tensor::{device_test, DType, Device, Distribution, Generator, Tensor};

fn fixtures() -> Fixtures {
    Fixtures::parse(include_str!("fixtures.json"), "nn/src/optim/fixtures.json")
}

/// The optimizer a fixture case describes, over parameters p0 (and p1 in a second group when
/// the case has two groups).
fn build(f: &Fixtures, case: &str, p0: &Var, p1: &Var) -> Box<dyn Optimizer> {
    let s = |name: &str| f.scalar(case, name);
    let groups = if s("two_groups") != 0.0 {
        vec![
            ParamGroupSpec::new(vec![p0.clone()]),
            ParamGroupSpec::new(vec![p1.clone()]).lr(s("group1_lr")).weight_decay(s("group1_weight_decay")),
        ]
    } else {
        vec![ParamGroupSpec::new(vec![p0.clone(), p1.clone()])]
    };
    if s("kind") == 0.0 {
        Box::new(Sgd::new(
            groups,
            SgdConfig {
                lr: s("lr"),
                momentum: s("momentum"),
                dampening: s("dampening"),
                nesterov: s("nesterov") != 0.0,
                weight_decay: s("weight_decay"),
                maximize: s("maximize") != 0.0,
            },
        ))
    } else {
        Box::new(AdamW::new(
            groups,
            AdamWConfig {
                lr: s("lr"),
                betas: (s("beta1"), s("beta2")),
                eps: s("eps"),
                weight_decay: s("weight_decay"),
                amsgrad: s("amsgrad") != 0.0,
                maximize: s("maximize") != 0.0,
            },
        ))
    }
}

device_test! {
    fn ten_steps_of_sgd_and_adamw_match_torch(dev: Device) {
        let f = fixtures();
        let names: Vec<String> =
            f.case_names().filter(|c| c.starts_with("sgd_") || c.starts_with("adamw_")).map(String::from).collect();
        assert_eq!(names.len(), 9, "fixture cases");
        for case in &names {
            let p0 = Var::parameter(f.tensor(case, "p0", dev));
            let p1 = Var::parameter(f.tensor(case, "p1", dev));
            let mut opt = build(&f, case, &p0, &p1);
            let (g0, g1) = (f.tensor(case, "g0", dev), f.tensor(case, "g1", dev));
            let (o0, o1) = (f.tensor(case, "p0_out", dev), f.tensor(case, "p1_out", dev));
            for s in 0..10 {
                opt.zero_grad();
                assert!(p0.grad().is_none(), "zero_grad sets gradients to None");
                p0.set_grad(Some(g0.select(0, s).contiguous()));
                p1.set_grad(Some(g1.select(0, s).contiguous()));
                opt.step();
                assert_close(p0.tensor(), &o0.select(0, s), 1e-5, 1e-6, &format!("{case}: p0 after step {s}"));
                assert_close(p1.tensor(), &o1.select(0, s), 1e-5, 1e-6, &format!("{case}: p1 after step {s}"));
            }
        }
    }
}

#[test]
fn sgd_and_adamw_train_f64_parameters_in_f64() {
    // The torch fixtures (f32 runs) replayed on f64 parameters: the composed f64 steps follow
    // the same formulas, and the parameters and state stay f64.
    let f = fixtures();
    let dev = Device::Cpu;
    let names: Vec<String> = f
        .case_names()
        .filter(|c| c.starts_with("sgd_") || c.starts_with("adamw_"))
        .map(String::from)
        .collect();
    for case in &names {
        let f64t = |name: &str| f.tensor(case, name, dev).to_dtype(DType::F64);
        let (p0, p1) = (Var::parameter(f64t("p0")), Var::parameter(f64t("p1")));
        let mut opt = build(&f, case, &p0, &p1);
        let (g0, g1, o0, o1) = (f64t("g0"), f64t("g1"), f64t("p0_out"), f64t("p1_out"));
        for s in 0..10 {
            opt.zero_grad();
            p0.set_grad(Some(g0.select(0, s).contiguous()));
            p1.set_grad(Some(g1.select(0, s).contiguous()));
            opt.step();
            assert_eq!(p0.dtype(), DType::F64, "{case}: the parameter stays f64");
            assert_close(
                p0.tensor(),
                &o0.select(0, s),
                1e-5,
                1e-6,
                &format!("{case}: f64 p0 after step {s}"),
            );
            assert_close(
                p1.tensor(),
                &o1.select(0, s),
                1e-5,
                1e-6,
                &format!("{case}: f64 p1 after step {s}"),
            );
        }
        for (name, t) in &opt.state_dict().tensors {
            if !name.ends_with(".step") {
                assert_eq!(t.dtype(), DType::F64, "{case}: state {name} is f64");
            }
        }
    }
}

#[test]
fn lars_trains_f64_parameters_in_f64() {
    let dev = Device::Cpu;
    let mut gen = Generator::new(3);
    let p =
        Var::parameter(Distribution::STANDARD_NORMAL.sample_with(&mut gen, [5, 4], DType::F64, dev).unwrap());
    let p32 = Var::parameter(p.tensor().to_dtype(DType::F32));
    let config = LarsConfig { lr: 0.1, momentum: 0.9, weight_decay: 1e-4, ..Default::default() };
    let (mut a, mut b) = (Lars::new(vec![p.clone()], config), Lars::new(vec![p32.clone()], config));
    for _ in 0..3 {
        let g = Distribution::STANDARD_NORMAL.sample_with(&mut gen, [5, 4], DType::F64, dev).unwrap();
        p.set_grad(Some(g.clone()));
        p32.set_grad(Some(g.to_dtype(DType::F32)));
        a.step();
        b.step();
    }
    assert_eq!(p.dtype(), DType::F64);
    assert_close(&p32.tensor().to_dtype(DType::F64), p.tensor(), 1e-5, 1e-6, "LARS f64 against f32");
    // Bit-level difference from the f32 run: the f64 run is not an f32 run in disguise.
    assert!(p.tensor().sub(&p32.tensor().to_dtype(DType::F64)).abs().max_all().item() > 0.0);
}

/// Runs `steps` steps of `opt` with gradients `grads[s]` for its parameters.
fn run_steps(opt: &mut dyn Optimizer, grads: &[Vec<Tensor>], range: std::ops::Range<usize>) {
    for s in range {
        opt.zero_grad();
        for (p, g) in opt.params().iter().zip(&grads[s]) {
            p.set_grad(Some(g.clone()));
        }
        opt.step();
    }
}

// Generators of their own, not the process-wide one: tests run in parallel, and another test
// drawing from it between a seed and these draws made two "fresh" parameter sets differ.
fn random_grads(params: &[Var], steps: usize) -> Vec<Vec<Tensor>> {
    let mut gen = Generator::new(11);
    (0..steps)
        .map(|_| {
            params
                .iter()
                .map(|p| {
                    Distribution::STANDARD_NORMAL
                        .sample_with(&mut gen, p.dims(), DType::F32, p.device())
                        .unwrap()
                })
                .collect()
        })
        .collect()
}

fn fresh_params(dev: Device) -> Vec<Var> {
    let mut gen = Generator::new(5);
    vec![
        Var::parameter(Distribution::STANDARD_NORMAL.sample_with(&mut gen, (3, 4), DType::F32, dev).unwrap()),
        Var::parameter(Distribution::STANDARD_NORMAL.sample_with(&mut gen, 4, DType::F32, dev).unwrap()),
    ]
}

fn check_resume(dev: Device, make: &dyn Fn(Vec<Var>) -> Box<dyn Optimizer>, through_file: bool) {
    let straight = fresh_params(dev);
    let grads = random_grads(&straight, 8);
    let mut opt = make(straight.clone());
    run_steps(opt.as_mut(), &grads, 0..8);

    let first = fresh_params(dev);
    let mut opt_a = make(first.clone());
    run_steps(opt_a.as_mut(), &grads, 0..4);
    let mut saved = opt_a.state_dict();
    if through_file {
        let path =
            std::env::temp_dir().join(format!("oxtrain-optim-state-{}.safetensors", std::process::id()));
        saved.save(&path).unwrap();
        saved = OptimizerState::load(&path).unwrap();
        std::fs::remove_file(&path).ok();
    }
    // A new optimizer over copies of the parameters, as after a restart.
    let resumed: Vec<Var> = first.iter().map(|p| Var::parameter(p.tensor().copy())).collect();
    let mut opt_b = make(resumed.clone());
    opt_b.load_state_dict(&saved).unwrap();
    run_steps(opt_b.as_mut(), &grads, 4..8);
    for (a, b) in straight.iter().zip(&resumed) {
        assert_eq!(a.tensor().to_vec::<f32>(), b.tensor().to_vec::<f32>(), "resumed run differs");
    }
}

device_test! {
    fn save_restore_continue_equals_not_stopping(dev: Device) {
        let sgd = |p: Vec<Var>| -> Box<dyn Optimizer> {
            Box::new(Sgd::new(p, SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..Default::default() }))
        };
        let adamw = |p: Vec<Var>| -> Box<dyn Optimizer> {
            Box::new(AdamW::new(p, AdamWConfig { amsgrad: true, ..Default::default() }))
        };
        let lars = |p: Vec<Var>| -> Box<dyn Optimizer> { Box::new(Lars::new(p, LarsConfig::default())) };
        for (i, make) in [&sgd as &dyn Fn(Vec<Var>) -> Box<dyn Optimizer>, &adamw, &lars].into_iter().enumerate() {
            check_resume(dev, make, i == 1);
        }
    }
}

device_test! {
    fn autocast_weights_kept_by_the_fused_step_train_as_fresh_casts(dev: Device) {
        // One AdamW over [w, b] (one launch on CUDA, which rewrites their bf16 casts) against
        // the per-tensor op on copies lowered by explicit casts: the same bits at every step.
        let mut gen = Generator::new(21);
        let mut normal = |shape: &[usize]| {
            Distribution::STANDARD_NORMAL.sample_with(&mut gen, shape, DType::F32, dev).unwrap()
        };
        let (x, w0, b0) = (Var::constant(normal(&[8, 12])), normal(&[12, 10]), normal(&[10]));
        let params = [Var::parameter(w0.copy()), Var::parameter(b0.copy())];
        let refs = [Var::parameter(w0.copy()), Var::parameter(b0.copy())];
        let cfg = AdamWConfig { lr: 1e-2, ..Default::default() };
        let mut opt = AdamW::new(params.to_vec(), cfg);
        let zeros = |p: &Var| Tensor::zeros(p.dims(), DType::F32, dev).unwrap();
        let moments: Vec<(Tensor, Tensor)> = refs.iter().map(|r| (zeros(r), zeros(r))).collect();
        let square_sum = |y: Var| y.to_dtype(DType::F32).square().sum_all();
        for step in 1..=3 {
            opt.zero_grad();
            let y = oxtrain_autograd::autocast(DType::BF16, || x.matmul(&params[0]).add(&params[1].autocast_lower()));
            square_sum(y).backward();
            opt.step();
            refs.iter().for_each(Var::zero_grad);
            let low = |v: &Var| v.to_dtype(DType::BF16);
            square_sum(low(&x).matmul(&low(&refs[0])).add(&low(&refs[1]))).backward();
            for ((p, r), (m, v)) in params.iter().zip(&refs).zip(&moments) {
                assert_eq!(p.grad().unwrap().dtype(), DType::F32, "gradients reach the master in f32");
                let g = r.grad().unwrap();
                let s = oxtrain_tensor::AdamWStep {
                    lr: cfg.lr,
                    beta1: cfg.betas.0,
                    beta2: cfg.betas.1,
                    eps: cfg.eps,
                    weight_decay: cfg.weight_decay,
                    step,
                    maximize: false,
                };
                r.tensor().adamw_step_(&g, m, v, None, &s);
                assert_eq!(p.tensor().to_vec::<f32>(), r.tensor().to_vec::<f32>(), "step {step}");
                let (kept, fresh) = (p.tensor().to_dtype_cached(DType::BF16), p.tensor().to_dtype(DType::BF16));
                assert_eq!(kept.to_f64_vec(), fresh.to_f64_vec(), "the kept bf16 cast after step {step}");
            }
        }
    }
}

#[test]
fn state_dict_names_tensors_and_hyper_parameters_like_torch() {
    let params = fresh_params(Device::Cpu);
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default());
    run_steps(&mut opt, &random_grads(&params, 2), 0..2);
    let st = opt.state_dict();
    let names: Vec<&str> = st.tensors.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "state.0.exp_avg",
            "state.0.exp_avg_sq",
            "state.0.step",
            "state.1.exp_avg",
            "state.1.exp_avg_sq",
            "state.1.step"
        ]
    );
    assert_eq!(st.tensors["state.1.step"].item(), 2.0);
    let groups = OptimizerState::parse_param_groups(&st.param_groups_json()).unwrap();
    assert_eq!(groups, st.param_groups);
    assert_eq!(groups[0].params, vec![0, 1]);
    assert_eq!(groups[0].hyper["lr"], 1e-3);
    // A mismatched optimizer is refused with a message.
    let mut other = AdamW::new(vec![params[0].clone()], AdamWConfig::default());
    let err = other.load_state_dict(&st).unwrap_err().to_string();
    assert!(err.contains("group 0 holds parameters [0, 1]"), "{err}");
}

#[test]
fn the_shared_state_dict_is_the_live_buffers_and_the_copy_is_not() {
    let params = fresh_params(Device::Cpu);
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default());
    run_steps(&mut opt, &random_grads(&params, 3), 0..2);
    let (shared, copied) = (opt.state_dict_shared(), opt.state_dict());
    assert_eq!(shared.param_groups, copied.param_groups);
    let keys = |s: &OptimizerState| s.tensors.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&shared), keys(&copied));
    for (name, t) in &shared.tensors {
        assert_eq!(t.to_f64_vec(), copied.tensors[name].to_f64_vec(), "{name}");
    }
    // One more step moves the shared buffers with the optimizer; the copies stay where they were.
    let before = copied.tensors["state.0.exp_avg"].to_f64_vec();
    run_steps(&mut opt, &random_grads(&params, 3), 2..3);
    assert_eq!(copied.tensors["state.0.exp_avg"].to_f64_vec(), before);
    assert_eq!(
        shared.tensors["state.0.exp_avg"].to_f64_vec(),
        opt.state_dict().tensors["state.0.exp_avg"].to_f64_vec()
    );
    assert_ne!(shared.tensors["state.0.exp_avg"].to_f64_vec(), before);
}

/// LARS in f64, the MLPerf formula as documented in lars.rs.
fn lars_ref(p: &mut [f64], g: &[f64], v: &mut [f64], c: &LarsConfig) {
    let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    let (wn, gn) = (norm(p), norm(g));
    let trust = if c.exclude || wn <= 0.0 || gn <= 0.0 {
        1.0
    } else {
        c.trust_coefficient * wn / (gn + c.weight_decay * wn + c.eps)
    };
    for i in 0..p.len() {
        let d = g[i] + c.weight_decay * p[i];
        v[i] = c.momentum * v[i] + c.lr * trust * d;
        p[i] -= if c.nesterov { c.momentum * v[i] + c.lr * trust * d } else { v[i] };
    }
}

device_test! {
    fn lars_matches_the_f64_formula_with_an_excluded_group(dev: Device) {
        for nesterov in [false, true] {
            let params = fresh_params(dev);
            let zero = Var::parameter(Tensor::zeros(3, DType::F32, dev).unwrap());
            let named = vec![
                ("fc.weight".to_string(), params[0].clone()),
                ("fc.bias".to_string(), params[1].clone()),
                ("bn.weight".to_string(), zero.clone()),
            ];
            let groups = decay_groups(named, 1e-2);
            assert_eq!((groups.len(), groups[0].params.len(), groups[1].params.len()), (2, 1, 2));
            let base = LarsConfig { lr: 0.5, momentum: 0.9, trust_coefficient: 0.02, eps: 1e-9, nesterov, ..Default::default() };
            let mut opt = Lars::new(groups, base);
            let all = opt.params();
            let grads = random_grads(&all, 6);
            let configs = [
                LarsConfig { weight_decay: 1e-2, ..base },
                LarsConfig { weight_decay: 0.0, exclude: true, ..base },
                LarsConfig { weight_decay: 0.0, exclude: true, ..base },
            ];
            let mut refs: Vec<(Vec<f64>, Vec<f64>)> =
                all.iter().map(|p| (p.tensor().to_f64_vec(), vec![0.0; p.elem_count()])).collect();
            for s in 0..6 {
                run_steps(&mut opt, &grads, s..s + 1);
                for (k, p) in all.iter().enumerate() {
                    let (rp, rv) = &mut refs[k];
                    lars_ref(rp, &grads[s][k].to_f64_vec(), rv, &configs[k]);
                    let want = Tensor::from_vec(rp.clone(), p.dims(), dev).unwrap();
                    assert_close(p.tensor(), &want, 1e-5, 1e-6, &format!("lars param {k} after step {s}"));
                }
            }
        }
    }
}

device_test! {
    fn clip_grad_norm_matches_torch(dev: Device) {
        let f = fixtures();
        for case in ["clip_l2", "clip_inf", "clip_l1", "clip_l3", "clip_l2_no_clip"] {
            let params: Vec<Var> = (0..3)
                .map(|i| {
                    let g = f.tensor(case, &format!("g{i}"), dev);
                    let p = Var::parameter(g.zeros_like());
                    p.set_grad(Some(g));
                    p
                })
                .collect();
            let norm_type = match f.scalar(case, "norm_type") { -1.0 => f64::INFINITY, n => n };
            let total = clip_grad_norm_(&params, f.scalar(case, "max_norm"), norm_type);
            assert_eq!(total.device(), dev, "the norm stays on the device");
            assert_close(&total, &f.tensor(case, "total", dev), 1e-5, 1e-6, &format!("{case}: total norm"));
            for (i, p) in params.iter().enumerate() {
                let want = f.tensor(case, &format!("clipped{i}"), dev);
                assert_close(&p.grad().unwrap(), &want, 1e-5, 1e-6, &format!("{case}: grad {i}"));
            }
        }
    }
}

device_test! {
    fn total_grad_norm_is_torchs_total_and_leaves_the_gradients(dev: Device) {
        let f = fixtures();
        let case = "clip_l2";
        let grads: Vec<Tensor> = (0..3).map(|i| f.tensor(case, &format!("g{i}"), dev)).collect();
        let params: Vec<Var> = grads
            .iter()
            .map(|g| {
                let p = Var::parameter(g.zeros_like());
                p.set_grad(Some(g.clone()));
                p
            })
            .collect();
        let total = total_grad_norm(&params, 2.0);
        assert_close(&total, &f.tensor(case, "total", dev), 1e-5, 1e-6, "total norm");
        for (p, g) in params.iter().zip(&grads) {
            assert_eq!(p.grad().unwrap().to_vec::<f32>(), g.to_vec::<f32>(), "gradients untouched");
        }
    }
}

#[test]
fn clip_grad_value_clamps_every_gradient() {
    let p = Var::parameter(Tensor::zeros(4, DType::F32, Device::Cpu).unwrap());
    p.set_grad(Some(Tensor::new(vec![-3.0f32, -0.5, 0.25, 7.0], Device::Cpu).unwrap()));
    clip_grad_value_(std::slice::from_ref(&p), 1.0);
    assert_eq!(p.grad().unwrap().to_vec::<f32>(), vec![-1.0, -0.5, 0.25, 1.0]);
}

device_test! {
    fn grad_scaler_skips_backs_off_and_grows_like_torch(dev: Device) {
        let f = fixtures();
        let case = "grad_scaler";
        let bad = f.ints(case, "bad");
        let ug = f.tensor(case, "unscaled_grads", dev);
        let (before, after) = (f.tensor(case, "scale_before", Device::Cpu).to_f64_vec(), f.tensor(case, "scale_after", Device::Cpu).to_f64_vec());
        let tracker = f.ints(case, "growth_tracker");
        let want_params = f.tensor(case, "params", dev);
        let p = Var::parameter(Tensor::zeros(4, DType::F32, dev).unwrap());
        let mut opt = Sgd::new(vec![p.clone()], SgdConfig { lr: 0.1, ..Default::default() });
        let mut scaler = GradScaler::new(GradScalerConfig { growth_interval: 3, ..Default::default() });
        for (s, &is_bad) in bad.iter().enumerate() {
            assert_eq!(scaler.get_scale(), before[s], "scale before step {s}");
            let mut g = ug.select(0, s).mul_scalar(scaler.get_scale()).to_vec::<f32>();
            if is_bad != 0 {
                g[s % 4] = if s % 2 == 1 { f32::INFINITY } else { f32::NAN };
            }
            p.set_grad(Some(Tensor::from_vec(g, 4, dev).unwrap()));
            let stepped = scaler.step(&mut opt);
            assert_eq!(stepped, is_bad == 0, "step {s} ran");
            scaler.update();
            assert_eq!(scaler.get_scale(), after[s], "scale after step {s}");
            assert_eq!(scaler.growth_tracker() as i64, tracker[s], "growth tracker after step {s}");
            assert_close(p.tensor(), &want_params.select(0, s), 1e-5, 1e-6, &format!("param after step {s}"));
        }
        let mut restored = GradScaler::default();
        restored.load_state_dict(&scaler.state_dict());
        assert_eq!((restored.get_scale(), restored.growth_tracker()), (scaler.get_scale(), scaler.growth_tracker()));
    }
}

#[test]
fn grad_scaler_scales_the_loss() {
    let x = Var::parameter(Tensor::new(vec![2.0f32], Device::Cpu).unwrap());
    let scaler = GradScaler::default();
    let loss = scaler.scale(&x.sum_all());
    assert_eq!(loss.tensor().item(), 2.0 * 65536.0);
    loss.backward();
    assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![65536.0]);
}
