//! The `mpi` backend (feature `mpi`): every op against its reference on 2, 3 and 4 ranks.
//! Run plainly, the test starts itself under `mpirun`; under mpirun it is one rank.
#![cfg(feature = "mpi")]

mod common;

use oxtrain_comm::{CommOptions, Communicator};

#[test]
fn mpi_rank() {
    if std::env::var("OMPI_COMM_WORLD_RANK").is_err() || std::env::var("OXTRAIN_TEST_MPI").is_err() {
        return;
    }
    let comm = oxtrain_comm::mpi::connect(&CommOptions::default()).unwrap();
    assert_eq!(comm.backend(), "mpi");
    common::check_all_ops(&comm, 21 + comm.world_size());
    common::check_bf16_accumulates_in_f32(&comm);
}

#[test]
fn every_op_on_2_3_4_mpi_ranks() {
    if std::env::var("OMPI_COMM_WORLD_RANK").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for n in [2, 3, 4] {
        let out = std::process::Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np", &n.to_string()])
            .arg(&exe)
            .args(["--exact", "mpi_rank", "--nocapture", "--test-threads=1", "-q"])
            .env("OXTRAIN_TEST_MPI", "1")
            .output()
            .expect("mpirun not found: install Open MPI (libopenmpi-dev openmpi-bin)");
        assert!(
            out.status.success(),
            "mpirun -np {n} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
