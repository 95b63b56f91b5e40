//! Checks shared by the local, shm and mpi tests: every collective on every dtype, against
//! references computed here in f64 from each rank's deterministic input.
#![allow(dead_code)]

// DDP's own tests keep this file; the mpi and netns tests here run the same training.
#[path = "../../../ddp/tests/common/ddp_train.rs"]
pub mod ddp_train;
pub mod procs;
#[path = "../../../ddp/tests/common/zero_train.rs"]
pub mod zero_train;

use oxtrain_comm::{shard_range, Communicator, ReduceOp};
use oxtrain_tensor::half::{bf16, f16};
use oxtrain_tensor::{DType, Device, Element, Tensor};

/// Rank `rank`'s element `i`: multiples of 1/8 below 8 in magnitude, exact in every float
/// dtype, so sums over up to 4 ranks are exact in bf16 too.
pub fn value(rank: usize, i: usize, seed: usize) -> f64 {
    ((rank * 7919 + i * 31 + seed * 13) % 97) as f64 / 8.0 - 6.0
}

fn tensor_of(dtype: DType, values: &[f64]) -> Tensor {
    fn make<T: Element>(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>(), v.len(), Device::Cpu).unwrap()
    }
    match dtype {
        DType::F32 => make::<f32>(values),
        DType::F64 => make::<f64>(values),
        DType::F16 => make::<f16>(values),
        DType::BF16 => make::<bf16>(values),
        DType::I64 => make::<i64>(values),
        DType::U8 => make::<u8>(values),
        other => panic!("no test tensors of {other}"),
    }
}

/// The reference rounded to `dtype`, as the backend must return it.
fn rounded(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => <f32 as Element>::from_f64(x).to_f64(),
        DType::F16 => <f16 as Element>::from_f64(x).to_f64(),
        DType::BF16 => <bf16 as Element>::from_f64(x).to_f64(),
        DType::U8 => <u8 as Element>::from_f64(x).to_f64(),
        DType::I64 => <i64 as Element>::from_f64(x).to_f64(),
        _ => x,
    }
}

fn assert_matches(what: &str, dtype: DType, got: &Tensor, want: &[f64]) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}: length");
    // Inputs and sums are exact; only avg rounds, once, in the accumulation type.
    let tol = match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 1e-3,
        DType::F32 => 1e-6,
        _ => 1e-12,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = rounded(dtype, *w);
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}: element {i} is {g}, expected {w}");
    }
}

fn reduce_ref(op: ReduceOp, xs: impl Iterator<Item = f64>, n: usize) -> f64 {
    let xs: Vec<f64> = xs.collect();
    match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
        ReduceOp::Max => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => xs.iter().cloned().fold(f64::INFINITY, f64::min),
    }
}

/// Sizes that exercise single elements, non-divisible lengths and many chunks.
pub fn sizes(seed: usize) -> Vec<usize> {
    let mut x = (seed as u64).wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    vec![1, 3, 17, 1023, 1 + next() % 5000, 1 + next() % 20000]
}

/// Runs every collective on every dtype and size and checks the results.
pub fn check_all_ops(comm: &dyn Communicator, seed: usize) {
    let (rank, world) = (comm.rank(), comm.world_size());
    let ctx = |what: &str, dtype: DType, len: usize| {
        format!("{} rank {rank}/{world}: {what} {dtype} len {len}", comm.backend())
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for len in sizes(seed) {
            let mine: Vec<f64> = (0..len).map(|i| value(rank, i, seed)).collect();
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                let t = tensor_of(dtype, &mine);
                comm.all_reduce(&t, op).unwrap().wait().unwrap();
                let want: Vec<f64> =
                    (0..len).map(|i| reduce_ref(op, (0..world).map(|r| value(r, i, seed)), world)).collect();
                assert_matches(&ctx(&format!("all_reduce {op}"), dtype, len), dtype, &t, &want);

                let root = (len + op as usize) % world;
                let t = tensor_of(dtype, &mine);
                comm.reduce(&t, root, op).unwrap().wait().unwrap();
                let expect = if rank == root { want.clone() } else { mine.clone() };
                assert_matches(&ctx(&format!("reduce {op} root {root}"), dtype, len), dtype, &t, &expect);

                let shard = shard_range(len, world, rank);
                let out = tensor_of(dtype, &vec![0.0; shard.len()]);
                comm.reduce_scatter(&out, &tensor_of(dtype, &mine), op).unwrap().wait().unwrap();
                assert_matches(&ctx(&format!("reduce_scatter {op}"), dtype, len), dtype, &out, &want[shard]);
            }
            check_movement(comm, dtype, len, seed);
        }
    }
    for dtype in [DType::U8, DType::I64] {
        check_movement(comm, dtype, 1001, seed);
    }
    // A strided view is reduced through a contiguous copy and written back in place.
    let m = Tensor::from_vec(
        (0..12).map(|i| value(rank, i, seed) as f32).collect::<Vec<_>>(),
        (3, 4),
        Device::Cpu,
    )
    .unwrap();
    let view = m.t();
    comm.all_reduce(&view, ReduceOp::Sum).unwrap().wait().unwrap();
    let want: Vec<f64> = (0..12).map(|i| (0..world).map(|r| value(r, i, seed)).sum()).collect();
    assert_matches(&ctx("all_reduce of a transposed view", DType::F32, 12), DType::F32, &m, &want);
    comm.barrier().unwrap().wait().unwrap();
}

fn check_movement(comm: &dyn Communicator, dtype: DType, len: usize, seed: usize) {
    let (rank, world) = (comm.rank(), comm.world_size());
    // all_gather: rank r holds its shard of one global array.
    let global: Vec<f64> = (0..len).map(|i| value(i % 5, i, seed + 1).abs()).collect();
    let shard = shard_range(len, world, rank);
    let out = tensor_of(dtype, &vec![0.0; len]);
    comm.all_gather(&out, &tensor_of(dtype, &global[shard])).unwrap().wait().unwrap();
    assert_matches(
        &format!("{} rank {rank}: all_gather {dtype} len {len}", comm.backend()),
        dtype,
        &out,
        &global,
    );

    let root = len % world;
    let t = tensor_of(dtype, &(0..len).map(|i| value(rank, i, seed).abs()).collect::<Vec<_>>());
    comm.broadcast(&t, root).unwrap().wait().unwrap();
    let want: Vec<f64> = (0..len).map(|i| value(root, i, seed).abs()).collect();
    assert_matches(
        &format!("{} rank {rank}: broadcast {dtype} len {len} root {root}", comm.backend()),
        dtype,
        &t,
        &want,
    );
}

/// bf16 sums accumulate in f32: 256 + 1 + 1 (+ 1) is 256 when added up in bf16 step by step
/// (each +1 is half a bf16 step at 256 and rounds away), but 258 (or 260) when accumulated
/// in f32 and rounded once.
pub fn check_bf16_accumulates_in_f32(comm: &dyn Communicator) {
    let (rank, world) = (comm.rank(), comm.world_size());
    let x = if rank == 0 { 256.0 } else { 1.0 };
    let t = Tensor::from_vec(vec![bf16::from_f64(x); 5], 5, Device::Cpu).unwrap();
    comm.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
    let exact = 256.0 + (world - 1) as f64;
    let want = bf16::from_f64(exact).to_f64();
    for v in t.to_vec::<bf16>() {
        assert_eq!(
            v.to_f64(),
            want,
            "bf16 sum on {world} ranks: got {v}, the f32-accumulated answer is {want}"
        );
    }
    if world >= 3 {
        // Step-by-step bf16 addition would have stayed at 256.
        let mut step = bf16::from_f64(256.0);
        for _ in 1..world {
            step = bf16::from_f32(step.to_f32() + 1.0);
        }
        assert_ne!(step.to_f64(), want, "the test values do not separate the two ways of summing");
    }
}
