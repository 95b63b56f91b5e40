//! DDP on GPUs, checked: `world` ranks (processes) train ResNet-50 (SyncBatchNorm) or GPT-2
//! 124M with `nvshmem` or `nccl`, and one process trains the same model on the combined batch.
//! Every step each rank prints a digest of its parameters' bits and its loss; the parent
//! checks that the digests agree across ranks at every step and that the mean of the ranks'
//! losses follows the single process's within a tolerance stated on the command line.
//!
//! ```sh
//! ddp_gpu --model resnet50 --backend nvshmem --world 2 --steps 50 --batch 32 [--gpus 1] [--precision bf16]
//! ```
//! `--gpus N` puts rank r on cuda:(r % N): with one GPU both PEs share it (under CUDA MPS for
//! nvshmem; NCCL refuses two ranks on one GPU). Prints one JSON summary line at the end.

use oxtrain_autograd::{autocast, Var};
use oxtrain_comm::nccl::NcclCommunicator;
use oxtrain_comm::nvshmem::{NvshmemCommunicator, NvshmemOptions};
use oxtrain_comm::{Communicator, LaunchEnv};
use oxtrain_ddp::{convert_sync_batchnorm, Ddp, DdpConfig};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_models::{Gpt2Config, Gpt2LMHeadModel};
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{loss, Module};
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
struct Args {
    model: String,
    backend: String,
    world: usize,
    steps: usize,
    batch: usize,
    gpus: Option<usize>,
    precision: String,
    tol: f64,
}

fn parse() -> Args {
    let mut a = Args {
        model: "resnet50".into(),
        backend: "nvshmem".into(),
        world: 2,
        steps: 50,
        batch: 32,
        gpus: None,
        precision: "bf16".into(),
        tol: 2e-2,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--model" => a.model = v,
            "--backend" => a.backend = v,
            "--world" => a.world = v.parse().expect("--world N"),
            "--steps" => a.steps = v.parse().expect("--steps N"),
            "--batch" => a.batch = v.parse().expect("--batch N"),
            "--gpus" => a.gpus = Some(v.parse().expect("--gpus N")),
            "--precision" => a.precision = v,
            "--tol" => a.tol = v.parse().expect("--tol X"),
            "rank" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

enum Net {
    ResNet(Box<ResNet>),
    Gpt2(Box<Gpt2LMHeadModel>),
}

impl oxtrain_nn::Module for Net {
    fn visit(&self, v: &mut dyn oxtrain_nn::Visitor) {
        match self {
            Net::ResNet(m) => m.visit(v),
            Net::Gpt2(m) => m.visit(v),
        }
    }
    fn training_flag(&self) -> Option<&oxtrain_nn::TrainingFlag> {
        match self {
            Net::ResNet(m) => m.training_flag(),
            Net::Gpt2(m) => m.training_flag(),
        }
    }
}

const SEQ: usize = 256;

fn build(a: &Args, device: Device) -> Net {
    oxtrain_tensor::manual_seed(0);
    match a.model.as_str() {
        "resnet50" => {
            Net::ResNet(Box::new(ResNet::new(&ResNetConfig::resnet50(), device).expect("ResNet-50")))
        }
        "gpt2" => {
            let mut c = Gpt2Config::gpt2();
            // No dropout: ranks and the single process must compute the same function.
            c.embd_pdrop = 0.0;
            c.attn_pdrop = 0.0;
            c.resid_pdrop = 0.0;
            Net::Gpt2(Box::new(Gpt2LMHeadModel::new(&c, device).expect("GPT-2")))
        }
        other => panic!("unknown model {other}: resnet50 or gpt2"),
    }
}

/// The global batch of `step` (the same on every rank; each takes its rows).
fn batch(a: &Args, step: usize, rows: usize, device: Device) -> (Tensor, Tensor) {
    let mut g = Generator::new(7 + step as u64);
    if a.model == "gpt2" {
        let ids = Distribution::Uniform { low: 0.0, high: 50257.0 }
            .sample_with(&mut g, [rows, SEQ + 1], DType::F32, Device::Cpu)
            .unwrap()
            .to_dtype(DType::I64);
        let ids = ids.to_device(device).unwrap();
        return (ids.narrow(1, 0, SEQ).contiguous(), ids.narrow(1, 1, SEQ).contiguous());
    }
    let x = Distribution::STANDARD_NORMAL
        .sample_with(&mut g, [rows, 3, 224, 224], DType::F32, Device::Cpu)
        .unwrap()
        .to_device(device)
        .unwrap();
    let y: Vec<i64> = (0..rows).map(|i| ((i * 131 + step * 7) % 1000) as i64).collect();
    (x, Tensor::from_vec(y, rows, device).unwrap())
}

fn step_loss(a: &Args, net: &Net, x: &Tensor, y: &Tensor) -> Var {
    let run = || match net {
        Net::ResNet(m) => loss::cross_entropy(&m.forward(Var::constant(x.clone())), y),
        Net::Gpt2(m) => Gpt2LMHeadModel::loss(&m.forward(x, None), y),
    };
    if a.precision == "bf16" {
        autocast(DType::BF16, run)
    } else {
        run()
    }
}

fn optimizer(a: &Args, params: Vec<Var>) -> Box<dyn Optimizer> {
    if a.model == "gpt2" {
        Box::new(AdamW::new(params, AdamWConfig { lr: 3e-4, weight_decay: 0.1, ..Default::default() }))
    } else {
        Box::new(Sgd::new(
            params,
            SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 1e-4, ..Default::default() },
        ))
    }
}

fn digest(m: &dyn Module) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in m.parameters() {
        let t = p.tensor().to_device(Device::Cpu).unwrap().to_dtype(DType::F32);
        for x in t.to_vec::<f32>() {
            for b in x.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

fn rank_main(a: &Args) {
    let env = LaunchEnv::from_env().expect("launcher variables");
    let gpus = a.gpus.unwrap_or_else(oxtrain_tensor::cuda::device_count).max(1);
    let ordinal = env.local_rank % gpus;
    let device = Device::Cuda(ordinal);
    let (rank, world) = (env.rank, env.world_size);
    let comm: Option<Arc<dyn Communicator>> = (world > 1).then(|| {
        let store =
            oxtrain_comm::bootstrap::store_from_env(&env, Duration::from_secs(120)).expect("the store");
        let c: Arc<dyn Communicator> = match a.backend.as_str() {
            "nvshmem" => Arc::new(
                NvshmemCommunicator::connect(rank, world, ordinal, &store, NvshmemOptions::default())
                    .expect("nvshmem"),
            ),
            "nccl" => Arc::new(NcclCommunicator::connect(rank, world, ordinal, &store).expect("nccl")),
            other => panic!("unknown backend {other}"),
        };
        c
    });
    let net = build(a, device);
    let rows = a.batch * world;
    let run_steps = |m: &dyn Module, forward: &dyn Fn(&Tensor, &Tensor) -> Var| {
        let mut opt = optimizer(a, m.parameters());
        for step in 0..a.steps {
            let (x, y) = batch(a, step, rows, device);
            let (x, y) = (
                x.narrow(0, rank * a.batch, a.batch).contiguous(),
                y.narrow(0, rank * a.batch, a.batch).contiguous(),
            );
            opt.zero_grad();
            let l = forward(&x, &y);
            l.try_backward().expect("backward");
            opt.step();
            println!("STEP {step} {} {:016x}", l.tensor().to_dtype(DType::F32).item(), digest(m));
        }
    };
    match comm {
        None => run_steps(&net, &|x, y| step_loss(a, &net, x, y)),
        Some(comm) => {
            if let Net::ResNet(m) = &net {
                convert_sync_batchnorm(&**m, comm.clone());
            }
            let ddp = Ddp::new(net, comm, DdpConfig::default()).expect("DDP");
            run_steps(ddp.module(), &|x, y| {
                let ddp = &ddp;
                let mut out = None;
                ddp.forward_with(|m| {
                    let l = step_loss(a, m, x, y);
                    out = Some(l.clone());
                    l
                });
                out.expect("the loss")
            });
            if let Some(s) = ddp.last_step() {
                eprintln!("rank {rank}: last step {s:?}");
            }
        }
    }
}

fn launch(a: &Args, world: usize) -> Vec<Vec<(f64, String)>> {
    let exe = std::env::current_exe().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut argv: Vec<String> = vec!["rank".into()];
    for (k, v) in [
        ("--model", a.model.clone()),
        ("--backend", a.backend.clone()),
        ("--steps", a.steps.to_string()),
        ("--batch", (a.batch * a.world / world).to_string()),
        ("--world", world.to_string()),
        ("--precision", a.precision.clone()),
    ] {
        argv.push(k.into());
        argv.push(v);
    }
    if let Some(g) = a.gpus {
        argv.push("--gpus".into());
        argv.push(g.to_string());
    }
    let children: Vec<_> = (0..world)
        .map(|r| {
            oxtrain_bench::torchrun_command(&exe, r, world, &port)
                .args(&argv)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "rank {r} of {world} failed");
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("STEP "))
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f[1].parse().unwrap(), f[2].to_string())
                })
                .collect()
        })
        .collect()
}

fn main() {
    let a = parse();
    if std::env::args().nth(1).as_deref() == Some("rank") {
        return rank_main(&a);
    }
    let single = launch(&a, 1).remove(0);
    let ranks = launch(&a, a.world);
    let mut identical = true;
    let mut worst = 0f64;
    for step in 0..a.steps {
        let digests: Vec<&str> = ranks.iter().map(|r| r[step].1.as_str()).collect();
        identical &= digests.iter().all(|d| *d == digests[0]);
        let mean = ranks.iter().map(|r| r[step].0).sum::<f64>() / a.world as f64;
        let rel = (mean - single[step].0).abs() / single[step].0.abs().max(1e-6);
        worst = worst.max(rel);
        println!(
            "step {step:>3}: single {:.5}  ddp mean {mean:.5}  rel {rel:.2e}  digests {digests:?}",
            single[step].0
        );
    }
    let ok = identical && worst <= a.tol;
    println!(
        "{}",
        serde_json::json!({"model": a.model, "backend": a.backend, "world": a.world, "steps": a.steps,
            "batch_per_rank": a.batch, "precision": a.precision, "identical_every_step": identical,
            "max_loss_rel_diff": worst, "tolerance": a.tol, "ok": ok})
    );
    std::process::exit(i32::from(!ok));
}
