//! The `local` backend (ranks as threads): every collective against its reference.

mod common;

use oxtrain_comm::{local_group, Communicator, ShmOptions};

fn run_local(world: usize, chunk_bytes: usize, f: impl Fn(&dyn Communicator) + Send + Sync + Copy + 'static) {
    let opts = ShmOptions { chunk_bytes, ..Default::default() };
    let worlds = oxtrain_comm::shm::local_group(world, &opts).unwrap();
    let handles: Vec<_> = worlds.into_iter().map(|w| std::thread::spawn(move || f(&w.comm))).collect();
    for h in handles {
        h.join().expect("a rank thread panicked");
    }
}

#[test]
fn every_op_on_2_3_4_threads() {
    for world in [2, 3, 4] {
        run_local(world, 512, |c| common::check_all_ops(c, 3));
    }
}

#[test]
fn one_rank_and_large_chunks() {
    run_local(1, 1 << 20, |c| common::check_all_ops(c, 5));
    run_local(3, 1 << 20, |c| common::check_all_ops(c, 6));
}

#[test]
fn bf16_sums_accumulate_in_f32() {
    for world in [2, 3, 4] {
        run_local(world, 4096, common::check_bf16_accumulates_in_f32);
    }
}

#[test]
fn default_group_works() {
    let worlds = local_group(2).unwrap();
    let h: Vec<_> = worlds
        .into_iter()
        .map(|w| std::thread::spawn(move || w.comm.barrier().unwrap().wait().unwrap()))
        .collect();
    for h in h {
        h.join().unwrap();
    }
}

#[test]
fn symmetric_tensors_are_ordinary_zeroed_tensors_off_nvshmem() {
    use oxtrain_comm::ReduceOp;
    use oxtrain_tensor::{DType, Device, Tensor};
    run_local(2, 4096, |c| {
        // Code that allocates its gradient buckets this way runs on every backend.
        let bucket = c.symmetric_tensor([3, 5].into(), DType::F32, Device::Cpu).unwrap();
        assert_eq!((bucket.dims(), bucket.dtype()), (&[3usize, 5][..], DType::F32));
        assert!(bucket.to_vec::<f32>().iter().all(|&x| x == 0.0));
        bucket.copy_(&Tensor::full([3, 5], (c.rank() + 1) as f64, DType::F32, Device::Cpu).unwrap());
        c.all_reduce(&bucket, ReduceOp::Sum).unwrap().wait().unwrap();
        assert!(bucket.to_vec::<f32>().iter().all(|&x| x == 3.0));
    });
}
