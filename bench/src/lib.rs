//! Shared helpers of the benchmark programs: timing, and the results file every program writes
//! (the format is described in the project's notes on benchmark results).

use oxtrain_tensor::{Device, Tensor};
use serde_json::{json, Value};
use std::time::Instant;

/// Trials of [`time_gpu`], whose median it reports.
pub const GPU_TRIALS: usize = 7;

/// Median seconds per call of `f` on GPU 0 over [`GPU_TRIALS`] trials of `iters` calls each,
/// timed with CUDA events on the current stream after 3 untimed calls (the device's time, not
/// the host's).
pub fn time_gpu(iters: usize, f: &mut dyn FnMut()) -> f64 {
    const TRIALS: usize = GPU_TRIALS;
    let stream = oxtrain_tensor::cuda::Stream::current(0).expect("cuda:0");
    for _ in 0..3 {
        f();
    }
    stream.synchronize().unwrap();
    let mut times: Vec<f64> = (0..TRIALS)
        .map(|_| {
            let start = stream.record_event().unwrap();
            for _ in 0..iters {
                f();
            }
            let end = stream.record_event().unwrap();
            end.synchronize().unwrap();
            start.elapsed_ms(&end).unwrap() as f64 * 1e-3 / iters as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[TRIALS / 2]
}

/// Median wall time of `reps` calls of `f` after `warmup` untimed calls, in seconds.
pub fn median_seconds(warmup: usize, reps: usize, f: &mut dyn FnMut()) -> f64 {
    median_of(warmup, reps, f, || Instant::now().duration_since(*START).as_secs_f64())
}

/// Median CPU time, summed over all threads of this process, of `reps` calls of `f` after
/// `warmup` untimed calls, in seconds. Time spent waiting for a core does not count, so the
/// figure stays meaningful on a loaded machine. Linux only (reads /proc).
pub fn median_cpu_seconds(warmup: usize, reps: usize, f: &mut dyn FnMut()) -> f64 {
    median_of(warmup, reps, f, process_cpu_seconds)
}

static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// CPU time of all threads of this process so far, from each thread's schedstat (nanoseconds,
/// finer than the clock ticks of /proc/self/stat).
pub fn process_cpu_seconds() -> f64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux only)");
    let nanos: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 * 1e-9
}

fn median_of(warmup: usize, reps: usize, f: &mut dyn FnMut(), clock: impl Fn() -> f64) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let times: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = clock();
            f();
            clock() - t
        })
        .collect();
    median(&times)
}

/// The number after `name` on the command line (`--reps 20`), or `default` when absent or
/// not a number: the benchmark programs' one kind of option.
pub fn usize_arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `values` (the mean of the middle two for an even count), for programs that
/// interleave several measurements in one loop.
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of no values");
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// One measured figure against its peer.
pub struct Benchmark {
    pub name: String,
    pub unit: String,
    pub oxtrain: f64,
    pub peer: Option<f64>,
    pub peer_name: String,
    /// oxtrain over peer, higher is better.
    pub ratio: Option<f64>,
    pub goal: Option<f64>,
}

impl Benchmark {
    /// A throughput-like figure (higher is better): ratio = oxtrain / peer.
    pub fn higher_is_better(
        name: &str,
        unit: &str,
        oxtrain: f64,
        peer: Option<f64>,
        peer_name: &str,
        goal: Option<f64>,
    ) -> Benchmark {
        Benchmark {
            name: name.into(),
            unit: unit.into(),
            oxtrain,
            peer,
            peer_name: peer_name.into(),
            ratio: peer.map(|p| oxtrain / p),
            goal,
        }
    }

    pub fn to_json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        let mut v = json!({ "name": self.name, "unit": self.unit, "oxtrain": round(self.oxtrain) });
        // A figure that could not be measured is absent, not zero.
        if let Some(p) = self.peer {
            v["peer"] = json!(round(p));
            v["peer_name"] = json!(self.peer_name);
        }
        if let Some(r) = self.ratio {
            v["ratio"] = json!(round(r));
        }
        if let Some(g) = self.goal {
            v["goal"] = json!(g);
        }
        v
    }
}

/// A results file: `bench/results/<name>.json`.
pub struct Report {
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub notes: String,
    pub benchmarks: Vec<Benchmark>,
}

impl Report {
    pub fn to_json(&self) -> Value {
        json!({
            "date": self.date,
            "commit": self.commit,
            "machine": self.machine,
            "notes": self.notes,
            "benchmarks": self.benchmarks.iter().map(Benchmark::to_json).collect::<Vec<_>>(),
        })
    }

    pub fn write(&self, path: &str) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json()).expect("JSON") + "\n";
        std::fs::write(path, text)
    }
}

/// `git rev-parse --short HEAD`, or "unknown" outside a checkout.
pub fn git_commit() -> String {
    // A binary carried to another machine has no checkout there: the builder passes the commit.
    if let Ok(c) = std::env::var("OXTRAIN_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Today's UTC date as YYYY-MM-DD.
pub fn today() -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// The 1-minute load average (Linux), to record how busy the machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// This machine's CPU as `lscpu` names it, with its core count and widest vector extension
/// (Linux; "unknown CPU" elsewhere), for a result's `machine` field.
pub fn cpu_description() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let simd = if has("avx512f") {
        "AVX-512"
    } else if has("avx2") {
        "AVX2, no AVX-512"
    } else {
        "no AVX2"
    };
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(String::new(), |kib| format!(", {} GiB memory", (kib + (1 << 19)) >> 20));
    format!("{model}, {cores} cores ({simd}){memory_gib}")
}

/// CPU ticks (USER_HZ) so far: busy time of the whole machine, and of this process with its
/// waited-for children. Linux only; zeros elsewhere.
fn busy_ticks() -> (u64, u64, u64) {
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu: Vec<u64> = machine
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = cpu.iter().sum();
    let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
    let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime, stime, cutime, cstime are 14..=17.
    let after = own.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ours: u64 = after.split_whitespace().skip(11).take(4).filter_map(|v| v.parse::<u64>().ok()).sum();
    (total, total - idle, ours)
}

/// Watches how much of the machine other processes use while a benchmark runs.
pub struct OtherLoad((u64, u64, u64));

impl OtherLoad {
    pub fn start() -> OtherLoad {
        OtherLoad(busy_ticks())
    }

    /// Percent of all cores' time, since `start`, that processes other than this benchmark
    /// (and its finished peer processes) kept busy.
    pub fn percent(&self) -> f64 {
        let (t1, b1, o1) = busy_ticks();
        let (t0, b0, o0) = self.0;
        let others = (b1 - b0).saturating_sub(o1 - o0);
        100.0 * others as f64 / (t1 - t0).max(1) as f64
    }
}

/// `program args` as rank `rank` of `world` on this host, with torchrun's variables
/// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=`port`),
/// for benchmarks that start their own ranks.
pub fn torchrun_command(
    program: impl AsRef<std::ffi::OsStr>,
    rank: usize,
    world: usize,
    port: &str,
) -> std::process::Command {
    let mut c = std::process::Command::new(program);
    c.env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port);
    c
}

/// A host f32 tensor of values uniform in [-0.5, 0.5) from a fixed xorshift stream per `seed`.
pub fn uniform(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_vec(data, shape, Device::Cpu).expect("host tensor")
}

/// A file of the bench crate: under `bench/` of the current directory when run from a checkout's
/// root (as on a machine the binary was copied to), else beside this crate's sources.
pub fn bench_file(rel: &str) -> String {
    if std::path::Path::new("bench/peers").is_dir() {
        format!("bench/{rel}")
    } else {
        format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
    }
}
