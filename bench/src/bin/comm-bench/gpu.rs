//! The GPU arms of comm-bench: one process per GPU (this program again, started with
//! torchrun's variables), NCCL and NVSHMEM sweeps timed with CUDA events, every element
//! checked, and with `--compare nccl` the NVSHMEM-vs-NCCL entries of the results file.

use super::{fail, print_header, run_rank, short, write_json_with, Config, Row};

mod symmetric;
use cudarc::driver::{sys, CudaGraph};
use oxtrain_comm::nccl::NcclCommunicator;
use oxtrain_comm::nvshmem::{Algorithm, NvshmemCommunicator, NvshmemOptions};
use oxtrain_comm::store_from_env;
use oxtrain_comm::{Cmp, Communicator, LaunchEnv, SignalOp, SymmetricMemory};
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::{DType, Device};
use std::time::Duration;

const CHILD: &str = "OXTRAIN_BENCH_GPU_CHILD";

pub fn is_child() -> bool {
    std::env::var(CHILD).is_ok()
}

/// Seconds per call: CUDA events around `iters` calls on `s`; and the host's seconds per
/// call spent enqueuing them.
pub fn time_on_stream(s: &Stream, iters: usize, mut call: impl FnMut()) -> (f64, f64) {
    fn err<T>(e: oxtrain_tensor::Error) -> T {
        fail(&format!("CUDA events: {e}"))
    }
    let start = s.record_event().unwrap_or_else(err);
    let host = std::time::Instant::now();
    for _ in 0..iters {
        call();
    }
    let host = host.elapsed().as_secs_f64() / iters as f64;
    let end = s.record_event().unwrap_or_else(err);
    end.synchronize().unwrap_or_else(err);
    (start.elapsed_ms(&end).unwrap_or_else(err) as f64 / 1e3 / iters as f64, host)
}

/// Seconds per call on the GPU with the host ahead of it: a matmul long enough to cover the
/// host's enqueuing is queued on `s` first, then one untimed call, and the events bracket only
/// the calls after it. Fails when
/// the matmul did not cover the enqueuing (the result would be host-bound again).
pub fn time_host_ahead(s: &Stream, device: Device, iters: usize, mut call: impl FnMut()) -> f64 {
    fn err<T>(e: oxtrain_tensor::Error) -> T {
        fail(&format!("CUDA events: {e}"))
    }
    // 8192^3 f32: about 20 ms on an H200, far more than enqueuing ~100 calls.
    let n = 8192;
    let x = oxtrain_tensor::Tensor::zeros((n, n), DType::F32, device).unwrap_or_else(err);
    let before = s.record_event().unwrap_or_else(err);
    let host = std::time::Instant::now();
    let y = x.matmul(&x);
    // One untimed call lines the GPUs up: the ranks' matmuls end at slightly different times.
    call();
    let start = s.record_event().unwrap_or_else(err);
    for _ in 0..iters {
        call();
    }
    let host = host.elapsed().as_secs_f64();
    let end = s.record_event().unwrap_or_else(err);
    end.synchronize().unwrap_or_else(err);
    drop(y);
    let cover = before.elapsed_ms(&start).unwrap_or_else(err) as f64 / 1e3;
    if cover < host {
        fail(&format!(
            "--host-ahead-max: the queued matmul ({:.1} ms) did not cover the host's {:.1} ms of enqueuing",
            cover * 1e3,
            host * 1e3
        ));
    }
    start.elapsed_ms(&end).unwrap_or_else(err) as f64 / 1e3 / iters as f64
}

/// `calls` captured in one CUDA graph on `s` (relaxed mode: the calls' host-side bookkeeping
/// stays allowed).
fn capture(s: &Stream, calls: usize, call: &mut dyn FnMut()) -> CudaGraph {
    fn err<T>(e: impl std::fmt::Debug) -> T {
        fail(&format!("capturing a CUDA graph: {e:?}"))
    }
    let raw = s.raw();
    raw.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap_or_else(err);
    for _ in 0..calls {
        call();
    }
    raw.end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap_or_else(err)
        .unwrap_or_else(|| fail("capturing a CUDA graph: the capture recorded nothing"))
}

/// Seconds per call of `iters` calls captured in one CUDA graph and replayed `reps` times (each
/// replay between events; the median replay), after one warm-up replay and `sync` (which lines
/// the ranks up). The regime of nccl-tests' `-G`: no launch gaps between the calls.
pub fn time_graph(s: &Stream, iters: usize, reps: usize, sync: &dyn Fn(), mut call: impl FnMut()) -> f64 {
    fn err<T>(e: impl std::fmt::Debug) -> T {
        fail(&format!("replaying a CUDA graph: {e:?}"))
    }
    let graph = capture(s, iters, &mut call);
    graph.upload().unwrap_or_else(err);
    graph.launch().unwrap_or_else(err);
    sync();
    let mut events = vec![s.record_event().unwrap_or_else(err)];
    for _ in 0..reps.max(1) {
        graph.launch().unwrap_or_else(err);
        events.push(s.record_event().unwrap_or_else(err));
    }
    if let Some(e) = events.last() {
        e.synchronize().unwrap_or_else(err);
    }
    let mut per_call: Vec<f64> = events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).unwrap_or_else(err) as f64 / 1e3 / iters as f64)
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

/// One call captured in a CUDA graph and replayed twice (the ranks lined up by `sync` first),
/// with what `read` returns after each replay: a replay must run the collective again, with
/// the launch's epoch and staging set taken afresh.
pub fn replay_twice(
    s: &Stream,
    sync: &dyn Fn(),
    mut call: impl FnMut(),
    read: impl Fn() -> Vec<f64>,
) -> [Vec<f64>; 2] {
    fn err<T>(e: impl std::fmt::Debug) -> T {
        fail(&format!("replaying a CUDA graph: {e:?}"))
    }
    let graph = capture(s, 1, &mut call);
    sync();
    graph.launch().unwrap_or_else(err);
    let first = read();
    graph.launch().unwrap_or_else(err);
    [first, read()]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| fail(&format!("finding a free port: {e}")))
}

/// Starts `cfg.ranks` processes, one per GPU, and waits for them; a rank that fails takes
/// the others down (they would wait for it until their timeout).
pub fn spawn(cfg: &Config) -> i32 {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&e.to_string()));
    let port = std::env::var("MASTER_PORT").ok().unwrap_or_else(|| free_port().to_string());
    let mut children: Vec<_> = (0..cfg.ranks)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(std::env::args().skip(1))
                .env(CHILD, "1")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", cfg.ranks.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", cfg.ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .spawn()
                .unwrap_or_else(|e| fail(&format!("starting rank {r}: {e}")))
        })
        .collect();
    let mut status: Vec<Option<bool>> = vec![None; children.len()];
    while status.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    status[r] = Some(s.success());
                    if !s.success() {
                        eprintln!("comm-bench: GPU rank {r} failed ({s}); stopping the others");
                    }
                }
            }
        }
        if status.contains(&Some(false)) {
            for (r, c) in children.iter_mut().enumerate() {
                if status[r].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    status[r] = Some(false);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    i32::from(!status.iter().all(|s| *s == Some(true)))
}

fn nvshmem_options(cfg: &Config) -> NvshmemOptions {
    let mut o = NvshmemOptions::default();
    if let Some(b) = cfg.blocks {
        o.max_blocks = b;
    }
    if let Some(b) = cfg.oneshot_max {
        o.oneshot_max_bytes = b;
    }
    if let Some(b) = cfg.chunk {
        o.chunk_bytes = b;
    }
    o
}

/// The all-reduce algorithms `--algo` names (a comma-separated list, or `all`), with the
/// label of their rows. `symm` and `symm-tensor` (None here) are not algorithms: the in-place
/// all-reduce of a buffer on the symmetric heap (`NvshmemHeap::all_reduce`), and `all_reduce`
/// (auto) of tensors made by `Communicator::symmetric_tensor` (on the nvshmem backend).
fn algorithms(cfg: &Config) -> Vec<(Option<Algorithm>, String)> {
    const ALL: [&str; 6] = ["auto", "ll", "oneshot", "twoshot", "symm", "symm-tensor"];
    let names: Vec<&str> = if cfg.algo == "all" { ALL.to_vec() } else { cfg.algo.split(',').collect() };
    names
        .into_iter()
        .map(|n| {
            let n = n.trim();
            if n == "symm" || n == "symm-tensor" {
                return (None, format!("nvshmem-{n}"));
            }
            let algo = Algorithm::parse(n).unwrap_or_else(|| {
                fail(&format!(
                    "--algo {n}: expected all or a list of auto, ll, oneshot, twoshot, symm, symm-tensor"
                ))
            });
            let label = if algo == Algorithm::Auto { "nvshmem".to_string() } else { format!("nvshmem-{n}") };
            (Some(algo), label)
        })
        .collect()
}

/// One sweep with `comm`'s stream current (so calls queue behind each other with no
/// cross-stream events), rows relabelled `label`.
fn sweep(comm: &dyn Communicator, stream: &Stream, cfg: &Config, device: Device, label: &str) -> Vec<Row> {
    if comm.rank() == 0 {
        print_header(label, comm.world_size());
    }
    let _current = stream.make_current();
    let mut rows = run_rank(comm, cfg, device, Some(stream));
    for r in &mut rows {
        r.backend = label.to_string();
    }
    rows
}

/// A rank of the GPU sweep; rank 0 prints and writes the JSON. Returns the exit code.
pub fn child(cfg: &Config) -> i32 {
    let env = LaunchEnv::from_env().unwrap_or_else(|e| fail(&e.to_string()));
    let store = store_from_env(&env, Duration::from_secs(180)).unwrap_or_else(|e| fail(&e.to_string()));
    let (rank, world) = (env.rank, env.world_size);
    let ordinal = cfg.gpus.map_or(env.local_rank, |n| env.local_rank % n);
    let device = Device::Cuda(ordinal);
    let mut rows: Vec<Row> = vec![];
    let mut symmetric_wrong = 0;
    let compare_nccl = cfg.compare.as_deref() == Some("nccl");
    if cfg.gpus.is_some_and(|n| n < world) && (compare_nccl || cfg.backends.iter().any(|b| b == "nccl")) {
        fail("--gpus: NCCL takes one rank per GPU; leave --gpus out with the nccl backend or --compare nccl");
    }
    if let Some(other) = cfg.compare.as_deref().filter(|c| *c != "nccl") {
        fail(&format!("--compare {other}: only nccl is known"));
    }

    if cfg.backends.iter().any(|b| b == "nccl") || compare_nccl {
        let comm =
            NcclCommunicator::connect(rank, world, ordinal, &store).unwrap_or_else(|e| fail(&e.to_string()));
        let mut c = cfg.clone();
        if !cfg.backends.iter().any(|b| b == "nccl") {
            // Only the comparison: all_reduce, in the swept dtypes and the compared one.
            c.ops = vec!["all_reduce".into()];
            if !c.dtypes.contains(&cfg.compare_dtype) {
                c.dtypes.push(cfg.compare_dtype);
            }
        }
        rows.extend(sweep(&comm, comm.comm_stream(), &c, device, "nccl"));
        if std::env::var("OXTRAIN_BENCH_NCCL_DESTROY").is_ok() {
            drop(comm);
            if rank == 0 {
                println!("# nccl communicator destroyed");
            }
        } else {
            // Not destroyed: ncclCommDestroy crashed (SIGSEGV) here on the 2xH200 machine
            // before Drop finalised first; the process ends soon and the driver reclaims all.
            std::mem::forget(comm);
        }
    }
    if cfg.backends.iter().any(|b| b == "nvshmem") {
        let comm = NvshmemCommunicator::connect(rank, world, ordinal, &store, nvshmem_options(cfg))
            .unwrap_or_else(|e| fail(&e.to_string()));
        if cfg.timeout_check {
            return timeout_check(&comm, cfg, device);
        }
        if cfg.mismatch_check > 0 {
            return symmetric::mismatch_check(&comm, cfg.mismatch_check);
        }
        if rank == 0 {
            let (full, small) = comm.launch_probe(2000).unwrap_or_else(|e| fail(&e.to_string()));
            println!(
                "# launch floor: an empty kernel takes {full:.2} us of host time to launch with the collectives' \
                 arguments, {small:.2} us with one pointer"
            );
            let o = comm.options();
            println!(
                "# nvshmem: at most {} blocks; auto: low-latency up to {} B, one-shot up to {} B, then two-shot{}",
                o.max_blocks,
                o.ll_max_bytes,
                o.oneshot_max_bytes,
                if comm.is_hierarchical() { "; PEs span nodes: hierarchical collectives" } else { "" }
            );
        }
        let mut first = true;
        for (algo, label) in algorithms(cfg) {
            let Some(algo) = algo else {
                comm.set_algorithm(Algorithm::Auto);
                rows.extend(if label == "nvshmem-symm" {
                    symmetric::sweep(&comm, cfg, &label)
                } else {
                    symmetric::tensor_sweep(&comm, cfg, device, &label)
                });
                continue;
            };
            comm.set_algorithm(algo);
            let mut c = cfg.clone();
            if !first {
                // The algorithm only changes all_reduce.
                c.ops = vec!["all_reduce".into()];
            }
            first = false;
            rows.extend(sweep(&comm, comm.comm_stream(), &c, device, &label));
        }
        let bad = symmetric_self_check(&comm).unwrap_or_else(|e| fail(&format!("symmetric memory: {e}")));
        if rank == 0 {
            println!("# nvshmem symmetric memory self-check: {}", if bad == 0 { "ok" } else { "FAILED" });
        }
        symmetric_wrong = bad;
    }

    let wrong: usize = rows.iter().map(|r| r.wrong).sum::<usize>() + symmetric_wrong;
    if rank == 0 {
        if wrong > 0 {
            eprintln!("comm-bench: {wrong} wrong elements");
        } else {
            println!("# every element of every result checked: all correct");
        }
        let extra = if compare_nccl { comparison(&rows, cfg.compare_dtype) } else { vec![] };
        if let Some(p) = &cfg.json {
            let name =
                oxtrain_tensor::cuda::device(ordinal).map(|d| d.name().to_string()).unwrap_or_default();
            let notes = format!(
                "comm-bench GPU: {world} processes, one GPU each; CUDA events around back-to-back calls on the \
                 communication stream, averaged; algbw = size/time, busbw with nccl-tests' factors; every element \
                 checked ({wrong} wrong). nvshmem = oxtrain's NVSHMEM kernels on tensors (auto algorithm unless labelled); nvshmem-symm = the in-place all-reduce of a buffer on NVSHMEM's symmetric heap (NvshmemHeap::all_reduce, no staging copy); nvshmem-symm-tensor = all_reduce (auto) of tensors made by Communicator::symmetric_tensor on this backend (zero-copy from 4 MiB); the _symmetric comparison entries are from symm-tensor when swept, else symm. graph_us (with --graph-max): time per call of the timed calls captured in one CUDA graph, median of 20 replays (nccl-tests -G 1); the allreduce_latency entries are those graph replays (no host launch cost on either side), _eager the back-to-back launches from the host, _host_ahead the GPU time per call with a matmul queued first."
            );
            write_json_with(p, &rows, extra, Some(format!("{world}x {name}")), Some(notes));
        }
    }
    i32::from(wrong > 0)
}

/// A rank that never calls: rank 1 skips an all_reduce, rank 0 must see a timeout naming it
/// (the kernel gives up on the GPU) within the timeout plus a second, and every later call
/// must fail at once. Returns the exit code.
fn timeout_check(comm: &NvshmemCommunicator, cfg: &Config, device: Device) -> i32 {
    let timeout = oxtrain_comm::CommOptions::default().timeout;
    let (algo, label) =
        algorithms(cfg).into_iter().next().unwrap_or((Some(Algorithm::Auto), "nvshmem".into()));
    let algo = algo.unwrap_or_else(|| fail("--timeout-check: symm is not an all_reduce algorithm"));
    comm.set_algorithm(algo);
    let _current = comm.comm_stream().make_current();
    if comm.rank() != 0 {
        // Skip the collective; stay alive past rank 0's timeout, then leave normally.
        std::thread::sleep(timeout + Duration::from_secs(3));
        return 0;
    }
    let t = oxtrain_tensor::Tensor::from_vec(vec![1f32; 1 << 16], 1 << 16, device)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let start = std::time::Instant::now();
    let first = comm.all_reduce(&t, oxtrain_comm::ReduceOp::Sum).and_then(|w| w.synchronize());
    let took = start.elapsed();
    let later = comm.all_reduce(&t, oxtrain_comm::ReduceOp::Sum).and_then(|w| w.synchronize());
    let ok = match (&first, &later) {
        (Err(oxtrain_comm::CommError::Timeout { ranks, .. }), Err(_)) => {
            ranks == &vec![1] && took >= timeout && took <= timeout + Duration::from_secs(1)
        }
        _ => false,
    };
    println!(
        "# timeout check ({label}): {} after {:.2} s (timeout {:.1} s): {}; the next call: {}",
        if ok { "ok" } else { "FAILED" },
        took.as_secs_f64(),
        timeout.as_secs_f64(),
        first.as_ref().err().map(|e| e.to_string()).unwrap_or_else(|| "no error".into()),
        later.as_ref().err().map(|e| e.to_string()).unwrap_or_else(|| "no error".into())
    );
    i32::from(!ok)
}

/// put_with_signal / wait_until / get / atomics on an NVSHMEM heap, in a ring; returns the
/// number of wrong values seen by this PE.
fn symmetric_self_check(comm: &NvshmemCommunicator) -> oxtrain_comm::Result<usize> {
    let heap = comm.symmetric_heap(1 << 20)?;
    let (me, n) = (heap.rank(), heap.world_size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    const N: usize = 1000;
    let src = heap.alloc::<f32>(N)?;
    let inbox = heap.alloc::<f32>(N)?;
    let got = heap.alloc::<f32>(N)?;
    let sig = heap.alloc_signals(1)?;
    let counter = heap.alloc::<u64>(1)?;
    let mine: Vec<f32> = (0..N).map(|i| (me * N + i) as f32).collect();
    heap.write_local(src, &mine)?;
    heap.barrier_all()?;
    let mut bad = 0;
    // Push to the next PE with a signal; the previous PE's data lands here.
    heap.put_with_signal(inbox, src, sig.at(0), SignalOp::Set, 7, next)?;
    heap.wait_until(sig.at(0), Cmp::Eq, 7)?;
    let mut v = vec![0f32; N];
    heap.read_local(inbox, &mut v)?;
    bad += v.iter().enumerate().filter(|(i, x)| **x != (prev * N + i) as f32).count();
    // Pull the next PE's source.
    heap.get(got, src, next)?;
    heap.read_local(got, &mut v)?;
    bad += v.iter().enumerate().filter(|(i, x)| **x != (next * N + i) as f32).count();
    // Every PE adds 1 on PE 0; then PE 0 swaps n for 100. NVSHMEM's host library has no
    // host-initiated atomics: the heap refuses them, and that is what is checked then.
    match heap.atomic_fetch_add(counter, 1u64, 0) {
        Err(oxtrain_comm::CommError::Unsupported(msg)) => {
            if me == 0 {
                println!("# symmetric atomics: {msg}");
            }
        }
        other => {
            other?;
            heap.barrier_all()?;
            if me == 0 {
                let old = heap.atomic_compare_swap(counter, n as u64, 100, 0)?;
                bad += usize::from(old != n as u64);
                let mut c = [0u64];
                heap.read_local(counter, &mut c)?;
                bad += usize::from(c[0] != 100);
            }
        }
    }
    heap.barrier_all()?;
    Ok(bad)
}

/// The headline entries: NVSHMEM (auto) against NCCL, all_reduce in `dtype`.
fn comparison(rows: &[Row], dtype: DType) -> Vec<serde_json::Value> {
    let peer_name = match oxtrain_comm::nccl::version() {
        Ok((a, b, c)) => format!("NCCL {a}.{b}.{c}"),
        Err(_) => "NCCL".into(),
    };
    let find = |backend: &str, bytes: usize| {
        rows.iter()
            .find(|r| r.backend == backend && r.op == "all_reduce" && r.dtype == dtype && r.bytes == bytes)
    };
    let mut out = vec![];
    println!(
        "# nvshmem vs {peer_name}, all_reduce {} (_symmetric: a buffer on the symmetric heap):",
        short(dtype)
    );
    // One entry: printed, and in the results file (figures to 3 decimals).
    let mut entry = |name: &str, unit: &str, o: f64, p: f64, ratio: f64, goal: f64, method: Option<&str>| {
        println!("  {name:<34} nvshmem {o:>10.2} {unit:<4}  nccl {p:>10.2} {unit:<4}  ratio {ratio:.3} (goal {goal})");
        let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
        let mut e = serde_json::json!({
            "name": name,
            "unit": unit,
            "oxtrain": r3(o),
            "peer": r3(p),
            "peer_name": peer_name,
            "ratio": r3(ratio),
            "goal": goal,
        });
        if let Some(m) = method {
            e["method"] = m.into();
        }
        out.push(e);
    };
    // Bandwidth of the tensor all-reduce ("nvshmem", auto) and of the in-place all-reduce of a
    // buffer on the symmetric heap ("nvshmem-symm", with --algo symm), each against NCCL on
    // the same sizes.
    let mut cases = vec![("allreduce_latency_8KB".to_string(), "nvshmem", 8usize << 10, true)];
    cases.push(("allreduce_latency_64KB".into(), "nvshmem", 64 << 10, true));
    // The symmetric entries from tensors (the Communicator API) when swept, else heap buffers.
    let symm = if rows.iter().any(|r| r.backend == "nvshmem-symm-tensor") {
        "nvshmem-symm-tensor"
    } else {
        "nvshmem-symm"
    };
    for (backend, suffix) in [("nvshmem", ""), (symm, "_symmetric")] {
        for (mb, bytes) in [(64, 64usize << 20), (256, 256 << 20), (512, 512 << 20), (1024, 1 << 30)] {
            let size = if mb == 1024 { "1GB".to_string() } else { format!("{mb}MB") };
            if backend == "nvshmem" || find(backend, bytes).is_some() {
                cases.push((format!("allreduce_busbw_{size}{suffix}"), backend, bytes, false));
            }
        }
    }
    for (name, backend, bytes, latency) in cases {
        let name = name.as_str();
        let (Some(ours), Some(peer)) = (find(backend, bytes), find("nccl", bytes)) else {
            eprintln!(
                "comm-bench: {name}: no rows at {bytes} B for both backends (widen --min-bytes/--max-bytes)"
            );
            continue;
        };
        if !latency {
            entry(name, "GB/s", ours.busbw, peer.busbw, ours.busbw / peer.busbw, 1.15, None);
            continue;
        }
        if let (Some(o), Some(p)) = (ours.ahead_us, peer.ahead_us) {
            let method =
                "GPU time per call with the host ahead (a matmul queued first), events around the calls";
            entry(&format!("{name}_host_ahead"), "us", o, p, p / o, 2.0, Some(method));
        }
        let eager = "back-to-back calls launched from the host, CUDA events around them, averaged";
        match (ours.graph_us, peer.graph_us) {
            // The latency itself: the calls captured in a CUDA graph and replayed (as nccl-tests
            // -G 1), so that neither side's host launch cost is timed; the eager figure beside it.
            (Some(o), Some(p)) => {
                let method = "time per call of the calls of one timing (100) captured in one CUDA graph, median of 20 replays";
                entry(name, "us", o, p, p / o, 2.0, Some(method));
                entry(
                    &format!("{name}_eager"),
                    "us",
                    ours.time_us,
                    peer.time_us,
                    peer.time_us / ours.time_us,
                    2.0,
                    Some(eager),
                );
            }
            _ => entry(name, "us", ours.time_us, peer.time_us, peer.time_us / ours.time_us, 2.0, Some(eager)),
        }
    }
    out
}
