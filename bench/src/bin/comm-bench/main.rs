//! nccl-tests-style benchmark of the collectives: every op, dtype and size from 8 B up to
//! `--max-bytes`, on each CPU backend (threads for `local`, processes for `shm`; run it
//! under mpirun with `--backend mpi` when built with the `mpi` feature). Prints time, algbw
//! and busbw with nccl-tests' formulas, checks every element of every result, and writes
//! JSON in the project's benchmark format with `--json PATH`.
//!
//! GPU backends (`--backend nccl,nvshmem`, see `gpu.rs`) start one process per GPU (this
//! program again, with torchrun's variables), time with CUDA events on the communication
//! stream, and with `--compare nccl` emit the NVSHMEM-vs-NCCL entries of the results file.
//!
//! Variables it reads (set by it for its children, or by the user):
//! - `OXTRAIN_COMMIT`: the commit written into results files (default `git rev-parse --short
//!   HEAD`; a copied tree may carry a stale `.git`).
//! - `OXTRAIN_BENCH_RANK`, `OXTRAIN_BENCH_WORLD`, `OXTRAIN_BENCH_STORE_PORT`: how the CPU
//!   sweep's parent tells each child process its rank, the world and the store.
//! - `OXTRAIN_BENCH_GPU_CHILD`: marks a GPU sweep's child process.
//! - `OXTRAIN_BENCH_NCCL_DESTROY`: set, the NCCL communicator is destroyed at the end of a GPU
//!   sweep (default: left to exit).

mod gpu;

use oxtrain_comm::{shard_range, Communicator, ReduceOp, ShmOptions, TcpStore};
use oxtrain_tensor::half::{bf16, f16};
use oxtrain_tensor::{DType, Device, Element, Tensor};
use std::time::{Duration, Instant};

const USAGE: &str = "comm-bench [--backend local|shm|mpi|nccl|nvshmem|all] [--ranks N] [--min-bytes B] [--max-bytes B] \
[--ops all_reduce,reduce_scatter,all_gather,broadcast,reduce] [--dtypes f32,bf16,f16] [--iters N] [--warmup N] [--json PATH]
[--sizes B1,B2,..] (instead of the doubling sweep)
GPU backends (one process per GPU): [--algo all|auto,ll,oneshot,twoshot,symm,symm-tensor] [--blocks N] [--oneshot-max B] [--chunk B]
  [--compare nccl] [--compare-dtype f32|bf16] [--host-ahead-max B] [--graph-max B] [--gpus N]
  --gpus N (nvshmem): rank r runs on cuda:(r % N) instead of cuda:r, so N GPUs hold several PEs each: a check
  of the multi-PE paths (4 or 8 PEs, the node and rail stages) on fewer GPUs; run it under CUDA MPS, as PEs
  that share a GPU wait on each other inside kernels; its timings say nothing about links
  --mismatch-check 1|2 (nvshmem): the ranks pass different symmetric tensors (1), or rank 0 a symmetric and the
  others an ordinary tensor (2), to one all_reduce; the ranks must fail (rank 0 naming the mismatch) and no
  symmetric tensor may change
  --timeout-check 1 (nvshmem): rank 1 skips an all_reduce (of the --algo algorithm); rank 0 must get a timeout
  error naming it within OXTRAIN_COMM_TIMEOUT plus a second, and fail at once afterwards
  --host-ahead-max B: rows up to B bytes also get the GPU's own time per call, measured with the host
  ahead of the GPU (a matmul queued first, so enqueuing costs nothing on the timeline: the regime of a
  training step, where the CPU runs ahead)
  --graph-max B: rows up to B bytes also get the time per call of the calls captured in a CUDA graph and
  replayed (nccl-tests' -G 1: no launch gaps), median over the replays; a captured call replayed twice is
  checked too
sizes take K, M, G suffixes (powers of 1024); defaults: all CPU backends, 2 ranks, 8 B to 1G, 20 iterations (GPU: 100,
fewer above 64M), 5 warm-up; every element of every result is checked";

#[derive(Clone, Debug)]
struct Config {
    backends: Vec<String>,
    ranks: usize,
    min_bytes: usize,
    max_bytes: usize,
    ops: Vec<String>,
    dtypes: Vec<DType>,
    iters: usize,
    /// Whether --iters was given (GPU runs default to more iterations).
    iters_set: bool,
    host_ahead_max: usize,
    graph_max: usize,
    timeout_check: bool,
    /// `--mismatch-check 1|2`: ranks pass different symmetric tensors (1), or a symmetric and
    /// an ordinary one (2), to one all_reduce.
    mismatch_check: u32,
    warmup: usize,
    json: Option<String>,
    /// nvshmem: auto, oneshot, twoshot, or all (one sweep each).
    algo: String,
    blocks: Option<u32>,
    oneshot_max: Option<usize>,
    chunk: Option<usize>,
    /// `--compare nccl`: also sweep NCCL's all_reduce and emit the comparison entries.
    compare: Option<String>,
    compare_dtype: DType,
    /// `--sizes`: exact byte sizes instead of the doubling sweep (odd ones give lengths the
    /// world size does not divide).
    sizes: Option<Vec<usize>>,
    /// `--gpus N`: PEs share N GPUs (rank r on cuda:(r % N)); None: one GPU per rank.
    gpus: Option<usize>,
}

fn parse_bytes(s: &str) -> usize {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().unwrap_or_else(|_| fail(&format!("not a size: {s}"))) * mul
}

fn fail(msg: &str) -> ! {
    eprintln!("comm-bench: {msg}\n{USAGE}");
    std::process::exit(2)
}

fn parse_args() -> Config {
    let mut c = Config {
        backends: vec!["local".into(), "shm".into()],
        ranks: 2,
        min_bytes: 8,
        max_bytes: 1 << 30,
        ops: ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"].map(String::from).to_vec(),
        dtypes: vec![DType::F32, DType::BF16, DType::F16],
        iters: 20,
        iters_set: false,
        host_ahead_max: 0,
        graph_max: 0,
        timeout_check: false,
        mismatch_check: 0,
        warmup: 5,
        json: None,
        algo: "auto".into(),
        blocks: None,
        oneshot_max: None,
        chunk: None,
        compare: None,
        compare_dtype: DType::F32,
        sizes: None,
        gpus: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let val = || args.get(i + 1).cloned().unwrap_or_else(|| fail(&format!("{} needs a value", args[i])));
        match args[i].as_str() {
            "--backend" => {
                let v = val();
                c.backends = if v == "all" {
                    vec!["local".into(), "shm".into()]
                } else {
                    v.split(',').map(String::from).collect()
                }
            }
            "--ranks" => c.ranks = val().parse().unwrap_or_else(|_| fail("--ranks takes a number")),
            "--min-bytes" => c.min_bytes = parse_bytes(&val()),
            "--max-bytes" => c.max_bytes = parse_bytes(&val()),
            "--ops" => c.ops = val().split(',').map(String::from).collect(),
            "--dtypes" => {
                c.dtypes = val()
                    .split(',')
                    .map(|d| match d {
                        "f32" => DType::F32,
                        "bf16" => DType::BF16,
                        "f16" => DType::F16,
                        "f64" => DType::F64,
                        other => fail(&format!("unknown dtype {other}")),
                    })
                    .collect()
            }
            "--iters" => {
                c.iters = val().parse().unwrap_or_else(|_| fail("--iters takes a number"));
                c.iters_set = true;
            }
            "--algo" => c.algo = val(),
            "--blocks" => c.blocks = Some(val().parse().unwrap_or_else(|_| fail("--blocks takes a number"))),
            "--oneshot-max" => c.oneshot_max = Some(parse_bytes(&val())),
            "--chunk" => c.chunk = Some(parse_bytes(&val())),
            "--host-ahead-max" => c.host_ahead_max = parse_bytes(&val()),
            "--graph-max" => c.graph_max = parse_bytes(&val()),
            "--timeout-check" => c.timeout_check = val() == "1",
            "--mismatch-check" => c.mismatch_check = val().parse().unwrap_or(0),
            "--compare" => c.compare = Some(val()),
            "--gpus" => {
                c.gpus = Some(
                    val()
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .unwrap_or_else(|| fail("--gpus takes a number > 0")),
                )
            }
            "--sizes" => c.sizes = Some(val().split(',').map(parse_bytes).collect()),
            "--compare-dtype" => {
                c.compare_dtype = match val().as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => fail(&format!("unknown dtype {other}")),
                }
            }
            "--warmup" => c.warmup = val().parse().unwrap_or_else(|_| fail("--warmup takes a number")),
            "--json" => c.json = Some(val()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            other => fail(&format!("unknown argument {other}")),
        }
        i += 2;
    }
    c
}

/// One measured line of the table.
struct Row {
    backend: String,
    ranks: usize,
    op: String,
    dtype: DType,
    bytes: usize,
    count: usize,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: usize,
    /// GPU: host time per call spent enqueuing (when it exceeds `time_us`, the host bounds it).
    host_us: Option<f64>,
    /// GPU, with --host-ahead-max: time per call on the GPU with the host ahead of it.
    ahead_us: Option<f64>,
    /// GPU, with --graph-max: time per call of the calls replayed as a CUDA graph.
    graph_us: Option<f64>,
}

impl Row {
    /// A row for `count` elements of `dtype` reduced or moved in `secs` per call, with
    /// nccl-tests' algbw and busbw; no host timings.
    fn timed(
        backend: &str,
        ranks: usize,
        op: &str,
        dtype: DType,
        count: usize,
        secs: f64,
        wrong: usize,
    ) -> Row {
        let bytes = count * dtype.size_in_bytes();
        let algbw = bytes as f64 / secs / 1e9;
        Row {
            backend: backend.to_string(),
            ranks,
            op: op.to_string(),
            dtype,
            bytes,
            count,
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * bus_factor(op, ranks),
            wrong,
            host_us: None,
            ahead_us: None,
            graph_us: None,
        }
    }
}

/// nccl-tests' bus-bandwidth factor: what each rank must move per byte of the op's size.
fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "reduce_scatter" | "all_gather" => (n - 1.0) / n,
        _ => 1.0, // broadcast, reduce
    }
}

/// Element `i` of rank `r`'s input: small multiples of 1/4, exact in every dtype and in
/// sums over a few ranks, so every result can be checked exactly.
fn value(r: usize, i: usize) -> f64 {
    ((r * 3 + i * 7) % 16) as f64 / 4.0 - 2.0
}

fn tensor(dtype: DType, v: &[f64], device: Device) -> Tensor {
    fn make<T: Element>(v: &[f64], d: Device) -> Tensor {
        Tensor::from_vec(v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>(), v.len(), d)
            .expect("bench tensor")
    }
    match dtype {
        DType::F32 => make::<f32>(v, device),
        DType::BF16 => make::<bf16>(v, device),
        DType::F16 => make::<f16>(v, device),
        _ => make::<f64>(v, device),
    }
}

fn count_wrong(got: &Tensor, want: impl Fn(usize) -> f64) -> usize {
    count_wrong_in(&got.to_f64_vec(), want)
}

fn count_wrong_in(got: &[f64], want: impl Fn(usize) -> f64) -> usize {
    got.iter().enumerate().filter(|(i, g)| **g != want(*i)).count()
}

/// Measures one op at one size; every rank calls it; the row is complete on rank 0.
fn measure(
    comm: &dyn Communicator,
    op: &str,
    dtype: DType,
    bytes: usize,
    cfg: &Config,
    device: Device,
    gpu: Option<&oxtrain_tensor::cuda::Stream>,
) -> Row {
    let (rank, n) = (comm.rank(), comm.world_size());
    let esz = dtype.size_in_bytes();
    let count = (bytes / esz).max(1);
    let mine: Vec<f64> = (0..count).map(|i| value(rank, i)).collect();
    let shard = shard_range(count, n, rank);
    let root = 0;
    let call = |t: &Tensor, out: &Tensor| match op {
        "all_reduce" => comm.all_reduce(t, ReduceOp::Sum),
        "reduce" => comm.reduce(t, root, ReduceOp::Sum),
        "broadcast" => comm.broadcast(t, root),
        "reduce_scatter" => comm.reduce_scatter(out, t, ReduceOp::Sum),
        "all_gather" => comm.all_gather(out, &t.narrow(0, shard.start, shard.len())),
        other => fail(&format!("unknown op {other}")),
    };
    let out_len = match op {
        "reduce_scatter" => shard.len(),
        "all_gather" => count,
        _ => 1,
    };
    let input = tensor(dtype, &mine, device);
    let output = tensor(dtype, &vec![0.0; out_len], device);
    let iters = match gpu {
        None => cfg.iters.min((1usize << 28) / bytes.max(1)).max(2),
        Some(_) if cfg.iters_set => cfg.iters.max(1),
        // Enough calls to average well, at most ~6 GiB moved per size.
        Some(_) => 100usize.min((6usize << 30) / bytes.max(1)).max(10),
    };
    for _ in 0..cfg.warmup.min(iters) {
        call(&input, &output).and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()));
    }
    comm.barrier().and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()));
    let mut host_us = None;
    let mut ahead_us = None;
    let mut graph_us = None;
    let mut graph_wrong = 0;
    let secs = match gpu {
        None => {
            let start = Instant::now();
            let works: Vec<_> =
                (0..iters).map(|_| call(&input, &output).unwrap_or_else(|e| fail(&e.to_string()))).collect();
            for w in works {
                w.wait().unwrap_or_else(|e| fail(&e.to_string()));
            }
            start.elapsed().as_secs_f64() / iters as f64
        }
        // CUDA events around the calls on the communication stream (which is current, so the
        // calls add no cross-stream events), as nccl-tests times.
        Some(s) => {
            let (secs, host) = gpu::time_on_stream(s, iters, || {
                call(&input, &output).and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()))
            });
            host_us = Some(host * 1e6);
            if bytes <= cfg.host_ahead_max {
                comm.barrier().and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()));
                ahead_us = Some(
                    gpu::time_host_ahead(s, device, iters, || {
                        call(&input, &output).and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()))
                    }) * 1e6,
                );
            }
            if bytes <= cfg.graph_max && op == "all_reduce" {
                let sync = || {
                    comm.barrier().and_then(|w| w.synchronize()).unwrap_or_else(|e| fail(&e.to_string()));
                };
                let all_reduce = |t: &Tensor| {
                    comm.all_reduce(t, ReduceOp::Sum)
                        .and_then(|w| w.wait())
                        .unwrap_or_else(|e| fail(&e.to_string()))
                };
                graph_us = Some(gpu::time_graph(s, iters, 20, &sync, || all_reduce(&input)) * 1e6);
                // A captured all_reduce of fresh inputs, replayed twice: the sum, then n times it.
                let fresh = tensor(dtype, &mine, device);
                let replayed = gpu::replay_twice(s, &sync, || all_reduce(&fresh), || fresh.to_f64_vec());
                let sum = |i: usize| (0..n).map(|r| value(r, i)).sum::<f64>();
                graph_wrong =
                    count_wrong_in(&replayed[0], sum) + count_wrong_in(&replayed[1], |i| n as f64 * sum(i));
            }
            secs
        }
    };
    // One more call on fresh inputs, checked element by element.
    let input = tensor(dtype, &mine, device);
    call(&input, &output).and_then(|w| w.wait()).unwrap_or_else(|e| fail(&e.to_string()));
    let sum = |i: usize| (0..n).map(|r| value(r, i)).sum::<f64>();
    let wrong = match op {
        "all_reduce" => count_wrong(&input, sum),
        "reduce" if rank == root => count_wrong(&input, sum),
        "reduce" => count_wrong(&input, |i| value(rank, i)),
        "broadcast" => count_wrong(&input, |i| value(root, i)),
        "reduce_scatter" => count_wrong(&output, |i| sum(shard.start + i)),
        // Rank r contributed its own values at its shard.
        _ => count_wrong(&output, |i| {
            value((0..n).find(|&r| shard_range(count, n, r).contains(&i)).unwrap_or(0), i)
        }),
    };
    Row {
        host_us,
        ahead_us,
        graph_us,
        ..Row::timed(comm.backend(), n, op, dtype, count, secs, wrong + graph_wrong)
    }
}

/// Runs the whole sweep on one rank; returns the rows (every rank measures; rank 0 reports).
fn run_rank(
    comm: &dyn Communicator,
    cfg: &Config,
    device: Device,
    gpu: Option<&oxtrain_tensor::cuda::Stream>,
) -> Vec<Row> {
    let mut rows = vec![];
    for op in &cfg.ops {
        for &dtype in &cfg.dtypes {
            let sizes = cfg.sizes.clone().unwrap_or_else(|| {
                std::iter::successors(Some(cfg.min_bytes.max(dtype.size_in_bytes())), |b| Some(b * 2))
                    .take_while(|&b| b <= cfg.max_bytes)
                    .collect()
            });
            for bytes in sizes {
                let row = measure(comm, op, dtype, bytes, cfg, device, gpu);
                if comm.rank() == 0 {
                    print_row(&row);
                }
                rows.push(row);
            }
        }
    }
    rows
}

fn print_header(backend: &str, ranks: usize) {
    println!("# backend {backend}, {ranks} ranks");
    println!(
        "# {:>14} {:>5} {:>12} {:>11} {:>12} {:>9} {:>9} {:>6}",
        "op", "dtype", "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong"
    );
    println!(
        "#   (GPU rows end with the host's enqueue time per call, us; with --host-ahead-max the GPU's time per \
         call with the host ahead, us; with --graph-max the time per call replayed as a CUDA graph, us)"
    );
}

fn print_row(r: &Row) {
    let host = r.host_us.map(|h| format!(" {h:>9.2}")).unwrap_or_default()
        + &r.ahead_us.map(|h| format!(" {h:>9.2}")).unwrap_or_default()
        + &r.graph_us.map(|h| format!(" g{h:>8.2}")).unwrap_or_default();
    println!(
        "  {:>14} {:>5} {:>12} {:>11} {:>12.2} {:>9.3} {:>9.3} {:>6}{host}",
        r.op,
        short(r.dtype),
        r.bytes,
        r.count,
        r.time_us,
        r.algbw,
        r.busbw,
        r.wrong
    );
}

fn short(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f64",
    }
}

/// The trimmed standard output of `program args`, when it ran and succeeded.
fn command_text(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Today as YYYY-MM-DD (UTC), from `date` (the results' date; comm has no calendar crate, and
/// a copy of the civil-calendar arithmetic in oxtrain-bench was the alternative).
fn today() -> String {
    command_text("date", &["-u", "+%F"]).unwrap_or_else(|| "unknown".into())
}

fn write_json(path: &str, rows: &[Row]) {
    write_json_with(path, rows, vec![], None, None)
}

/// The results file: `extra` entries (comparisons) first, then one per measured row.
fn write_json_with(
    path: &str,
    rows: &[Row],
    extra: Vec<serde_json::Value>,
    machine: Option<String>,
    notes: Option<String>,
) {
    // OXTRAIN_COMMIT first: a copied tree (the GPU machine's) may carry a stale .git.
    let commit = std::env::var("OXTRAIN_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| command_text("git", &["rev-parse", "--short", "HEAD"]))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut benchmarks = extra;
    benchmarks.extend(rows.iter().map(|r| {
        serde_json::json!({
            "name": format!("{}_{}_{}r_{}_{}B", r.op, r.backend, r.ranks, short(r.dtype), r.bytes),
            "unit": "us",
            "oxtrain": r.time_us,
            "algbw_GBps": r.algbw,
            "busbw_GBps": r.busbw,
            "wrong": r.wrong,
            "host_enqueue_us": r.host_us,
            "gpu_us_host_ahead": r.ahead_us,
            "graph_us": r.graph_us,
        })
    }));
    let doc = serde_json::json!({
        "date": today(),
        "commit": commit,
        "machine": machine.unwrap_or_else(|| format!("CPU, {cores} cores")),
        "notes": notes.unwrap_or_else(|| "comm-bench: time per call averaged over the timed iterations; algbw = size/time, busbw with nccl-tests' factors (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, broadcast and reduce 1); no peer measured".into()),
        "benchmarks": benchmarks,
    });
    let text = serde_json::to_string_pretty(&doc).expect("json");
    std::fs::write(path, text).unwrap_or_else(|e| fail(&format!("writing {path}: {e}")));
    println!("# wrote {path}");
}

fn bench_local(cfg: &Config) -> Vec<Row> {
    let worlds = oxtrain_comm::local_group(cfg.ranks).unwrap_or_else(|e| fail(&e.to_string()));
    print_header("local", cfg.ranks);
    let handles: Vec<_> = worlds
        .into_iter()
        .map(|w| {
            let cfg = cfg.clone();
            std::thread::spawn(move || run_rank(&w.comm, &cfg, Device::Cpu, None))
        })
        .collect();
    let mut rows = vec![];
    for (r, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap_or_else(|_| fail("a rank thread panicked"));
        if r == 0 {
            rows = got;
        }
    }
    rows
}

/// Re-runs this program as `ranks` processes that meet in a store hosted here.
fn bench_shm(cfg: &Config) -> bool {
    let store =
        TcpStore::host("127.0.0.1", 0, Duration::from_secs(60)).unwrap_or_else(|e| fail(&e.to_string()));
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&e.to_string()));
    let children: Vec<_> = (0..cfg.ranks)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(std::env::args().skip(1))
                .env("OXTRAIN_BENCH_RANK", r.to_string())
                .env("OXTRAIN_BENCH_WORLD", cfg.ranks.to_string())
                .env("OXTRAIN_BENCH_STORE_PORT", store.port().to_string())
                .spawn()
                .unwrap_or_else(|e| fail(&format!("starting rank {r}: {e}")))
        })
        .collect();
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let status = c.wait().unwrap_or_else(|e| fail(&e.to_string()));
        if !status.success() {
            eprintln!("comm-bench: shm rank {r} failed ({status})");
            ok = false;
        }
    }
    ok
}

fn shm_child(cfg: &Config, rank: usize, world: usize) -> Vec<Row> {
    let port: u16 = std::env::var("OXTRAIN_BENCH_STORE_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| fail("no store port"));
    let store = TcpStore::connect("127.0.0.1", port, Duration::from_secs(60))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let w = oxtrain_comm::shm::connect(rank, world, &store, &ShmOptions::default())
        .unwrap_or_else(|e| fail(&e.to_string()));
    if rank == 0 {
        print_header("shm", world);
    }
    run_rank(&w.comm, cfg, Device::Cpu, None)
}

fn finish(rows: Vec<Row>, cfg: &Config, json_rows: &mut Vec<Row>) -> bool {
    let wrong: usize = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        eprintln!("comm-bench: {wrong} wrong elements");
    }
    let _ = cfg;
    json_rows.extend(rows);
    wrong == 0
}

fn main() {
    let cfg = parse_args();
    if gpu::is_child() {
        std::process::exit(gpu::child(&cfg));
    }
    if cfg.backends.iter().any(|b| b == "nccl" || b == "nvshmem") {
        std::process::exit(gpu::spawn(&cfg));
    }
    let mut rows = vec![];
    let mut ok = true;
    if let (Ok(r), Ok(w)) = (std::env::var("OXTRAIN_BENCH_RANK"), std::env::var("OXTRAIN_BENCH_WORLD")) {
        // A rank of the shm sweep; rank 0 reports and writes the JSON.
        let (r, w) = (r.parse().unwrap_or(0), w.parse().unwrap_or(1));
        ok &= finish(shm_child(&cfg, r, w), &cfg, &mut rows);
        if r == 0 {
            if let Some(p) = &cfg.json {
                write_json(p, &rows);
            }
        }
        std::process::exit(if ok { 0 } else { 1 });
    }
    let mut shm_json = false;
    for b in &cfg.backends {
        match b.as_str() {
            "local" => ok &= finish(bench_local(&cfg), &cfg, &mut rows),
            "shm" => {
                ok &= bench_shm(&cfg);
                shm_json = cfg.json.is_some();
            }
            #[cfg(feature = "mpi")]
            "mpi" => {
                let comm = oxtrain_comm::mpi::connect(&Default::default()).unwrap_or_else(|e| fail(&e.to_string()));
                if comm.rank() == 0 {
                    print_header("mpi", comm.world_size());
                }
                let got = run_rank(&comm, &cfg, Device::Cpu, None);
                if comm.rank() == 0 {
                    ok &= finish(got, &cfg, &mut rows);
                } else {
                    return;
                }
            }
            other => fail(&format!(
                "backend {other} is not available here (CPU: local, shm{}; GPU backends add themselves through run_rank)",
                if cfg!(feature = "mpi") { ", mpi" } else { "" }
            )),
        }
    }
    if let Some(p) = &cfg.json {
        if !rows.is_empty() && !shm_json {
            write_json(p, &rows);
        } else if !rows.is_empty() {
            // The shm ranks wrote their own file; keep both sweeps.
            write_json(&format!("{p}.local.json"), &rows);
        }
    }
    std::process::exit(if ok { 0 } else { 1 })
}
