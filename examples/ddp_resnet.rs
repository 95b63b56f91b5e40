//! Data-parallel training of a ResNet-18 with `oxtrain_ddp`, the way a PyTorch script
//! uses `DistributedDataParallel`: the single-process loop with the model wrapped.
//!
//! Under a launcher each process is one rank (the backend comes from the environment: `shm`
//! on one host, `mpi` across hosts, `nccl`/`nvshmem` with `OXTRAIN_COMM_BACKEND` on GPUs):
//!
//! ```sh
//! cargo build --release --example ddp_resnet
//! oxtrain launch --nproc-per-node 2 -- target/release/examples/ddp_resnet
//! mpirun -np 2 target/release/examples/ddp_resnet        # Open MPI
//! srun -n 2 target/release/examples/ddp_resnet           # Slurm
//! ```
//!
//! With no launcher variables it runs 2 ranks as threads of this process (backend `local`).
//! `--sync-bn` converts the batch norms to SyncBatchNorm; `--steps N` (default 10).

use oxtrain_autograd::Var;
use oxtrain_comm::Communicator;
use oxtrain_ddp::{convert_sync_batchnorm, Ddp, DdpConfig};
use oxtrain_models::resnet::{ResNet, ResNetConfig};
use oxtrain_nn::optim::{Optimizer, Sgd, SgdConfig};
use oxtrain_nn::{loss, Module};
use oxtrain_tensor::{DType, Device, Distribution, Generator, Tensor};
use std::sync::Arc;

const PER_RANK_BATCH: usize = 8;

fn train(comm: Arc<dyn Communicator>, steps: usize, sync_bn: bool) -> Result<(), Box<dyn std::error::Error>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let device = match comm.backend() {
        "nccl" | "nvshmem" => Device::Cuda(oxtrain_comm::LaunchEnv::from_env()?.local_rank),
        _ => Device::Cpu,
    };
    let model = ResNet::new(&ResNetConfig::resnet18().with_num_classes(10), device)?;
    if sync_bn {
        convert_sync_batchnorm(&model, comm.clone());
    }
    // Every rank may start from other weights: DDP broadcasts rank 0's.
    let ddp = Ddp::new(model, comm.clone(), DdpConfig::default())?;
    let mut opt =
        Sgd::new(ddp.module().parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    // One fixed batch per rank (each rank its own part of the global batch), to be learnt.
    let mut g = Generator::new(rank as u64);
    let images =
        Distribution::STANDARD_NORMAL.sample_with(&mut g, [PER_RANK_BATCH, 3, 32, 32], DType::F32, device)?;
    let labels: Vec<i64> = (0..PER_RANK_BATCH).map(|i| ((i + rank * PER_RANK_BATCH) % 10) as i64).collect();
    let labels = Tensor::from_vec(labels, PER_RANK_BATCH, device)?;
    for step in 0..steps {
        opt.zero_grad();
        let logits = ddp.forward(&Var::constant(images.clone()));
        let loss = loss::cross_entropy(&logits, &labels);
        loss.try_backward()?; // bucket all-reduces run while backward goes on
        ddp.span("optimizer", || opt.step());
        if rank == 0 {
            let s = ddp.last_step().expect("a synchronised step");
            println!(
                "step {step:>3}  loss {:.4}  backward {:>6.1} ms  exposed comm {:>5.1} ms  ({} buckets, world {world})",
                loss.tensor().item(),
                s.backward.as_secs_f64() * 1e3,
                s.exposed_comm.as_secs_f64() * 1e3,
                s.buckets
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let sync_bn = args.iter().any(|a| a == "--sync-bn");
    let steps = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(10), |s| s.parse())?;
    if oxtrain_comm::LaunchEnv::from_env().is_ok() {
        let pg = oxtrain_comm::init_from_env()?;
        return train(pg.comm.into(), steps, sync_bn);
    }
    println!("no launcher variables (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID): 2 ranks as threads");
    let ranks = oxtrain_comm::local_group(2)?;
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|w| {
            std::thread::spawn(move || train(Arc::new(w.comm), steps, sync_bn).map_err(|e| e.to_string()))
        })
        .collect();
    for h in handles {
        h.join().expect("a rank thread panicked")?;
    }
    Ok(())
}
