//! DDP across hosts: the small CNN of `common/ddp_train.rs` (SGD with momentum, 5 steps, 3
//! samples per rank, every rank starting from different weights) trained by 2 hosts x 2
//! ranks over the `mpi` backend (mpirun --hostfile across the namespaces) and by 4 ranks on
//! one host over `shm`, each backend chosen by `init_from_env` as a user's program would. Every
//! rank must end equal to one process trained on the whole global batch, and the two runs
//! equal to each other.

use super::common::ddp_train::{self as t, Model, Opt};
use super::harness::Net;
use super::procs::{all_output, wait_all, Proc};
use super::{roles, start_rank, Vars};
use oxtrain_comm::Communicator;
use oxtrain_ddp::DdpConfig;
use std::sync::Arc;
use std::time::Duration;

/// Where rank 0 writes its final parameters (JSON), for the parent to compare the runs.
const OUT: &str = "OXTRAIN_NETNS_PARAMS";

/// Role `ddp`: trains, checks against one process on the global batch, rank 0 writes its
/// parameters.
pub fn ddp_role() {
    let pg = oxtrain_comm::init_from_env().unwrap();
    let backend = pg.comm.backend().to_string();
    let comm: Arc<dyn Communicator> = Arc::from(pg.comm);
    let (rank, world) = (comm.rank(), comm.world_size());
    let ddp = t::train_rank(comm, Model::Cnn, Opt::SgdMomentum, 5, 3, 1, DdpConfig::default());
    let got = t::params(ddp.module());
    let reference = t::params(&t::train_single(Model::Cnn, Opt::SgdMomentum, 5, 3 * world, 1));
    let err = t::assert_close(&format!("{backend} rank {rank} of {world}"), &got, &reference, 1e-6);
    if rank == 0 {
        let path = std::env::var(OUT).unwrap();
        std::fs::write(&path, serde_json::to_string(&got).unwrap()).unwrap();
    }
    println!("DDP-OK {backend} rank {rank} of {world}: {err:.2e} from one process on the global batch");
    roles::leave(&pg.store, &pg.env);
}

fn read_params(path: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = std::fs::remove_file(path);
    serde_json::from_str(&text).unwrap()
}

#[test]
fn mpi_ddp_2_hosts_x_2_ranks_trains_as_shm_on_one_host() {
    if !super::harness::available("mpi_ddp_2_hosts_x_2_ranks_trains_as_shm_on_one_host") {
        return;
    }
    let net = Net::new(2);
    let tmp = std::env::temp_dir();
    let (mpi_out, shm_out) = (
        tmp.join(format!("{}-mpi.json", net.hosts[0].ns)),
        tmp.join(format!("{}-shm.json", net.hosts[0].ns)),
    );
    let (job, _hostfile) = super::mpi::mpirun(&net, "ddp", "30", &[(OUT, mpi_out.to_str().unwrap())]);
    // The same 4 ranks on host 0 alone: shm.
    let shm_name = format!("{}-shm", net.hosts[0].ns);
    let shm: Vec<Proc> = (0..4)
        .map(|r| {
            // Its own store port: the mpi run's rank 0 holds 29500 on the same host.
            let extra = [
                (OUT, shm_out.to_str().unwrap()),
                ("OXTRAIN_SHM_NAME", shm_name.as_str()),
                ("MASTER_PORT", "29510"),
            ];
            start_rank(&net, "ddp", Vars::Torchrun, (0, r, 4, 4), &extra)
        })
        .collect();
    let mut all = vec![job];
    all.extend(shm);
    let ended = wait_all(all, Duration::from_secs(120));
    let text = all_output(&ended);
    for e in &ended {
        assert!(e.success, "{} failed:\n{text}", e.name);
    }
    let shm_text: String = ended[1..].iter().map(|e| e.output.as_str()).collect();
    for (backend, out) in [("mpi", ended[0].output.as_str()), ("shm", shm_text.as_str())] {
        for r in 0..4 {
            let head = format!("DDP-OK {backend} rank {r} of 4: ");
            assert!(out.contains(&head), "no {head:?} in:\n{text}");
        }
    }
    let (mpi, shm) = (read_params(&mpi_out), read_params(&shm_out));
    // Both equal one process to 1e-6 (checked in the ranks); to each other the same.
    let err = t::assert_close("mpi (2 hosts x 2 ranks) against shm (1 host x 4 ranks)", &mpi, &shm, 1e-6);
    eprintln!("mpi against shm: largest relative difference {err:.2e}");
}
