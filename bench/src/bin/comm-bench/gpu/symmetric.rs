//! `--algo symm`: the in-place all-reduce of a buffer on NVSHMEM's symmetric heap
//! (`NvshmemHeap::all_reduce`, no staging copy); `--algo symm-tensor`: `all_reduce` of tensors
//! made by `Communicator::symmetric_tensor` (nvshmem). Swept and checked like the tensor rows.

use super::super::{count_wrong, fail, print_header, print_row, tensor, value, Config, Row};
use super::time_on_stream;
use oxtrain_comm::nvshmem::{NvshmemCommunicator, NvshmemHeap};
use oxtrain_comm::{Communicator, ReduceElement, ReduceOp, SymBuffer, SymmetricMemory};
use oxtrain_tensor::half::{bf16, f16};
use oxtrain_tensor::{DType, Device, Element};

/// One row per dtype and size, all_reduce only (the other ops have no symmetric form).
pub fn sweep(comm: &NvshmemCommunicator, cfg: &Config, label: &str) -> Vec<Row> {
    if !cfg.ops.iter().any(|o| o == "all_reduce") {
        return vec![];
    }
    if comm.rank() == 0 {
        print_header(label, comm.world_size());
    }
    let largest = sizes(cfg, 1).into_iter().max().unwrap_or(16);
    let heap = comm.symmetric_heap(largest).unwrap_or_else(|e| fail(&e.to_string()));
    // Every size in turn at the start of one buffer.
    let whole = heap.alloc::<u8>(largest.div_ceil(16) * 16).unwrap_or_else(|e| fail(&e.to_string()));
    let _current = comm.comm_stream().make_current();
    let mut rows = vec![];
    for &dtype in &cfg.dtypes {
        for bytes in sizes(cfg, dtype.size_in_bytes()) {
            let row = match dtype {
                DType::F32 => measure::<f32>(comm, &heap, whole, cfg, bytes),
                DType::BF16 => measure::<bf16>(comm, &heap, whole, cfg, bytes),
                DType::F16 => measure::<f16>(comm, &heap, whole, cfg, bytes),
                other => fail(&format!("--algo symm: no {other} all_reduce")),
            };
            let mut row = row;
            row.backend = label.to_string();
            if comm.rank() == 0 {
                print_row(&row);
            }
            rows.push(row);
        }
    }
    rows
}

fn sizes(cfg: &Config, esz: usize) -> Vec<usize> {
    cfg.sizes.clone().unwrap_or_else(|| {
        std::iter::successors(Some(cfg.min_bytes.max(esz)), |b| Some(b * 2))
            .take_while(|&b| b <= cfg.max_bytes)
            .collect()
    })
}

fn measure<T: ReduceElement + Element>(
    comm: &NvshmemCommunicator,
    heap: &NvshmemHeap<'_>,
    whole: SymBuffer<u8>,
    cfg: &Config,
    bytes: usize,
) -> Row {
    let (rank, n) = (heap.rank(), heap.world_size());
    let ok = |r: oxtrain_comm::Result<()>| r.unwrap_or_else(|e| fail(&e.to_string()));
    let esz = std::mem::size_of::<T>();
    let count = (bytes / esz).max(1);
    let buf = whole.slice(0..count * esz).cast::<T>();
    let mine: Vec<T> = (0..count).map(|i| T::from_f64(value(rank, i))).collect();
    ok(heap.write_local(buf, &mine));
    let call = || ok(heap.all_reduce(buf, ReduceOp::Sum).and_then(|w| w.wait()));
    let iters =
        if cfg.iters_set { cfg.iters.max(1) } else { 100usize.min((6usize << 30) / bytes.max(1)).max(10) };
    for _ in 0..cfg.warmup.min(iters) {
        call();
    }
    ok(heap.barrier_all());
    let s = comm.comm_stream();
    let (secs, host) = time_on_stream(s, iters, call);
    // One more call on fresh inputs, checked element by element.
    ok(heap.write_local(buf, &mine));
    ok(heap.barrier_all());
    ok(heap.all_reduce(buf, ReduceOp::Sum).and_then(|w| w.synchronize()));
    let mut got = vec![T::zero(); count];
    ok(heap.read_local(buf, &mut got));
    let wrong = got
        .iter()
        .enumerate()
        .filter(|(i, g)| g.to_f64() != (0..n).map(|r| value(r, *i)).sum::<f64>())
        .count();
    ok(heap.barrier_all());
    Row {
        host_us: Some(host * 1e6),
        ..Row::timed("", n, "all_reduce", <T as Element>::DTYPE, count, secs, wrong)
    }
}

/// `all_reduce` (auto) of views of one symmetric tensor per dtype, as large as the sweep's
/// largest size (symmetric memory returns only when the communicator goes).
pub fn tensor_sweep(comm: &NvshmemCommunicator, cfg: &Config, device: Device, label: &str) -> Vec<Row> {
    if !cfg.ops.iter().any(|o| o == "all_reduce") {
        return vec![];
    }
    if comm.rank() == 0 {
        print_header(label, comm.world_size());
    }
    let _current = comm.comm_stream().make_current();
    let ok = |r: oxtrain_comm::Result<()>| r.unwrap_or_else(|e| fail(&e.to_string()));
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut rows = vec![];
    for &dtype in &cfg.dtypes {
        let esz = dtype.size_in_bytes();
        let sizes = sizes(cfg, esz);
        let largest = sizes.iter().max().copied().unwrap_or(esz) / esz;
        let big = comm
            .symmetric_tensor(largest.max(1).into(), dtype, device)
            .unwrap_or_else(|e| fail(&e.to_string()));
        for bytes in sizes {
            let count = (bytes / esz).max(1);
            let t = big.narrow(0, 0, count);
            let mine: Vec<f64> = (0..count).map(|i| value(rank, i)).collect();
            let input = tensor(dtype, &mine, device);
            t.copy_(&input);
            let call = || ok(comm.all_reduce(&t, ReduceOp::Sum).and_then(|w| w.wait()));
            let iters = if cfg.iters_set {
                cfg.iters.max(1)
            } else {
                100usize.min((6usize << 30) / bytes.max(1)).max(10)
            };
            for _ in 0..cfg.warmup.min(iters) {
                call();
            }
            ok(comm.barrier().and_then(|w| w.wait()));
            let (secs, host) = time_on_stream(comm.comm_stream(), iters, call);
            // One more call on fresh inputs, checked element by element.
            t.copy_(&input);
            ok(comm.barrier().and_then(|w| w.wait()));
            ok(comm.all_reduce(&t, ReduceOp::Sum).and_then(|w| w.synchronize()));
            let wrong = count_wrong(&t, |i| (0..n).map(|r| value(r, i)).sum::<f64>());
            let row = Row {
                host_us: Some(host * 1e6),
                ..Row::timed(label, n, "all_reduce", dtype, count, secs, wrong)
            };
            if rank == 0 {
                print_row(&row);
            }
            rows.push(row);
        }
    }
    rows
}

/// `--mismatch-check 1`: rank 0 reduces the first of two symmetric tensors, the other ranks
/// the second; every rank must get `CommError::Mismatch` (from the kernels' buffer check).
/// `--mismatch-check 2`: rank 0 reduces a symmetric tensor, the others an ordinary one; rank 0
/// must get the mismatch and the others an error (their peer left). Either way no rank's
/// symmetric tensors may change. Returns the exit code.
pub fn mismatch_check(comm: &NvshmemCommunicator, mode: u32) -> i32 {
    let count = 8usize << 20; // 32 MiB of f32: the zero-copy path
    let _current = comm.comm_stream().make_current();
    let full = |v: f32| {
        oxtrain_tensor::Tensor::full(count, f64::from(v), DType::F32, oxtrain_tensor::Device::Cpu)
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let make = |v: f32| {
        let t = comm
            .symmetric_tensor(
                count.into(),
                DType::F32,
                oxtrain_tensor::Device::Cuda(comm.comm_stream().ordinal()),
            )
            .unwrap_or_else(|e| fail(&e.to_string()));
        t.copy_(&full(v).to_device(t.device()).unwrap_or_else(|e| fail(&e.to_string())));
        t
    };
    let (a, b) = (make(1.0), make(2.0));
    let ordinary = full(3.0).to_device(a.device()).unwrap_or_else(|e| fail(&e.to_string()));
    let mine = match (comm.rank(), mode) {
        (0, _) => &a,
        (_, 1) => &b,
        _ => &ordinary,
    };
    let got = comm.all_reduce(mine, ReduceOp::Sum).and_then(|w| w.synchronize());
    let unchanged = |t: &oxtrain_tensor::Tensor, v: f32| t.to_vec::<f32>().iter().all(|&x| x == v);
    let expected = match &got {
        Err(oxtrain_comm::CommError::Mismatch { .. }) => comm.rank() == 0 || mode == 1,
        Err(_) => comm.rank() != 0 && mode == 2,
        Ok(()) => false,
    };
    let ok = expected && unchanged(&a, 1.0) && unchanged(&b, 2.0);
    println!(
        "# mismatch check {mode} (rank {}): {}: {}",
        comm.rank(),
        if ok { "ok" } else { "FAILED" },
        got.err().map(|e| e.to_string()).unwrap_or_else(|| "no error".into())
    );
    i32::from(!ok)
}
