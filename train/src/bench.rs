//! `oxtrain bench`: the time of a whole training step (forward, loss, backward, optimizer) of
//! a built-in model on synthetic data already on the device. Warm-up steps first, then the
//! median of `--steps` steps; throughput in images or tokens a second, peak memory (the
//! process's peak RSS on the CPU, the caching allocator's peak on a GPU), and the cold start:
//! the first step's time and the time from process start to its end. The result is one
//! JSON object on stdout, the shape of an entry of `bench/results/*.json` plus the raw step
//! times, so a driver can set it beside PyTorch's figure for the same step.

use clap::ValueEnum;
use oxtrain_autograd::{profile, Var};
use oxtrain_models::{
    BertConfig, BertForSequenceClassification, Gpt2Config, Gpt2LMHeadModel, ResNet, ResNetConfig,
};
use oxtrain_nn::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use oxtrain_nn::Module;
use oxtrain_tensor::{cuda, DType, Device, Distribution, Generator, Tensor};
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BenchModel {
    Resnet18,
    Resnet50,
    /// GPT-2 as `bench/peers/train.py` writes it: 4 layers, 256 wide (the CPU issue's size).
    Gpt2,
    /// GPT-2 124M: 12 layers, 768 wide, 12 heads (the GPU issue's size).
    #[value(name = "gpt2-124m")]
    Gpt2_124m,
    Bert,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BenchPrecision {
    F32,
    /// f32 with TF32 tensor cores allowed for convolutions and products on CUDA (what
    /// PyTorch does for cuDNN convolutions by default); the same as f32 on the CPU.
    Tf32,
    Bf16,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The model: resnet18 and resnet50 (SGD with momentum 0.9), gpt2 (4 layers, 256 wide, 4
    /// heads, vocab 50257; AdamW), gpt2-124m (12 layers, 768 wide, 12 heads; AdamW) or bert (4
    /// layers, 256 wide, 4 heads, 2 classes; AdamW).
    #[arg(value_enum)]
    pub model: BenchModel,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Images (ResNet) or sequences (GPT-2, BERT) per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Image side of the ResNets.
    #[arg(long, default_value_t = 128)]
    pub image: usize,
    /// Sequence length of GPT-2 and BERT.
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Timed steps; the figure is their median.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Untimed steps before them.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// CPU threads (the rayon pool); default: every core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Parameters and activations in f32 (`tf32`: with TF32 tensor cores on CUDA), or the
    /// forward pass under bf16 autocast.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: BenchPrecision,
    /// ResNets only: activations in NHWC order (`memory_format=torch.channels_last`).
    #[arg(long)]
    pub channels_last: bool,
    /// Also print the time per op kind (forward and backward) of one step, to stderr; on a GPU
    /// each op waits for the device, so it shows the op's own kernel time.
    #[arg(long)]
    pub profile: bool,
    /// CUDA only: run one more step between `cuProfilerStart` and `cuProfilerStop`, after the
    /// timed ones, for a kernel profiler that waits for that range (`ncu --profile-from-start
    /// off`, `nsys -c cudaProfilerApi`).
    #[arg(long)]
    pub profiler_range: bool,
    /// Instead of timing: write the initial weights (`init.safetensors`, PyTorch's names) and
    /// the batch (`batch.safetensors`) into this folder, run `--steps` steps from them and
    /// write every step's loss to `oxtrain.json`, for `bench/peers/parity.py` to run the same
    /// steps in PyTorch and compare.
    #[arg(long, value_name = "DIR")]
    pub parity: Option<std::path::PathBuf>,
}

/// Why a benchmark could not run, for the user.
#[derive(Debug)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One training step of a model on a fixed synthetic batch.
struct Workload {
    name: String,
    /// Images or tokens per step.
    items: usize,
    unit: &'static str,
    /// The model's state dict (sharing storage with it) and the batch, for `--parity`.
    state: Vec<(String, Tensor)>,
    batch: Vec<(&'static str, Tensor)>,
    /// One step; returns its loss.
    step: Box<dyn FnMut() -> Var>,
}

/// GPT-2 without dropout, so both sides run the same arithmetic; `small` is the CPU issue's
/// 4-layer 256-wide model, else the 124M one.
fn gpt2_config(small: bool) -> Gpt2Config {
    let base = Gpt2Config::gpt2();
    let (n_layer, n_embd, n_head) =
        if small { (4, 256, 4) } else { (base.n_layer, base.n_embd, base.n_head) };
    Gpt2Config {
        n_layer,
        n_embd,
        n_head,
        n_positions: 1024,
        embd_pdrop: 0.0,
        attn_pdrop: 0.0,
        resid_pdrop: 0.0,
        ..base
    }
}

fn bert_config() -> BertConfig {
    BertConfig {
        num_hidden_layers: 4,
        hidden_size: 256,
        num_attention_heads: 4,
        intermediate_size: 1024,
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        classifier_dropout: Some(0.0),
        ..BertConfig::bert_base()
    }
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError(e.to_string())
}

fn workload(args: &BenchArgs, device: Device) -> Result<Workload, BenchError> {
    let mut gen = Generator::new(0);
    let autocast = matches!(args.precision, BenchPrecision::Bf16);
    match args.model {
        BenchModel::Resnet18 | BenchModel::Resnet50 => resnet_workload(args, device, &mut gen, autocast),
        BenchModel::Gpt2 | BenchModel::Gpt2_124m => gpt2_workload(args, device, &mut gen, autocast),
        BenchModel::Bert => bert_workload(args, device, &mut gen, autocast),
    }
}

fn resnet_workload(
    args: &BenchArgs,
    device: Device,
    gen: &mut Generator,
    autocast: bool,
) -> Result<Workload, BenchError> {
    let b = args.batch;
    let (config, name) = match args.model {
        BenchModel::Resnet18 => (ResNetConfig::resnet18(), "resnet18"),
        _ => (ResNetConfig::resnet50(), "resnet50"),
    };
    let config = ResNetConfig { channels_last: args.channels_last, ..config };
    let model = ResNet::new(&config, device).map_err(err)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let x = Distribution::STANDARD_NORMAL
        .sample_with(gen, [b, 3, args.image, args.image], DType::F32, device)
        .map_err(err)?;
    let y = Tensor::randint_with(gen, 0, 1000, [b], device).map_err(err)?;
    let (state, batch) = (model.state_dict(), vec![("x", x.clone()), ("y", y.clone())]);
    let x = Var::constant(x);
    Ok(Workload {
        name: format!("{name}_b{b}_{}{}", args.image, if args.channels_last { "_cl" } else { "" }),
        items: b,
        unit: "img/s",
        state,
        batch,
        step: Box::new(move || {
            profile::region("optimizer", "zero_grad", || opt.zero_grad());
            // The loss inside autocast, as the peer computes it (f32 there).
            let loss = with_autocast(autocast, || oxtrain_nn::loss::cross_entropy(&model.forward(&x), &y));
            loss.backward();
            profile::region("optimizer", "step", || opt.step());
            loss
        }),
    })
}

fn gpt2_workload(
    args: &BenchArgs,
    device: Device,
    gen: &mut Generator,
    autocast: bool,
) -> Result<Workload, BenchError> {
    let b = args.batch;
    let small = matches!(args.model, BenchModel::Gpt2);
    let config = gpt2_config(small);
    let model = Gpt2LMHeadModel::new(&config, device).map_err(err)?;
    let mut opt = AdamW::new(model.parameters(), AdamWConfig { lr: 1e-4, ..Default::default() });
    let ids = Tensor::randint_with(gen, 0, config.vocab_size as i64, [b, args.seq], device).map_err(err)?;
    Ok(Workload {
        name: format!("gpt2_l{}_d{}_b{b}_t{}", config.n_layer, config.n_embd, args.seq),
        items: b * args.seq,
        unit: "tokens/s",
        state: model.state_dict(),
        batch: vec![("ids", ids.clone())],
        step: Box::new(move || {
            profile::region("optimizer", "zero_grad", || opt.zero_grad());
            let loss = with_autocast(autocast, || Gpt2LMHeadModel::loss(&model.forward(&ids, None), &ids));
            loss.backward();
            profile::region("optimizer", "step", || opt.step());
            loss
        }),
    })
}

fn bert_workload(
    args: &BenchArgs,
    device: Device,
    gen: &mut Generator,
    autocast: bool,
) -> Result<Workload, BenchError> {
    let b = args.batch;
    let config = bert_config();
    let model = BertForSequenceClassification::new(&config, device).map_err(err)?;
    let mut opt = AdamW::new(model.parameters(), AdamWConfig { lr: 1e-4, ..Default::default() });
    let ids = Tensor::randint_with(gen, 0, config.vocab_size as i64, [b, args.seq], device).map_err(err)?;
    let labels = Tensor::randint_with(gen, 0, config.num_labels() as i64, [b], device).map_err(err)?;
    Ok(Workload {
        name: format!("bert_l4_d256_b{b}_t{}", args.seq),
        items: b * args.seq,
        unit: "tokens/s",
        state: model.state_dict(),
        batch: vec![("ids", ids.clone()), ("labels", labels.clone())],
        step: Box::new(move || {
            profile::region("optimizer", "zero_grad", || opt.zero_grad());
            let loss = with_autocast(autocast, || {
                BertForSequenceClassification::loss(&model.forward(&ids, None, None), &labels)
            });
            loss.backward();
            profile::region("optimizer", "step", || opt.step());
            loss
        }),
    })
}

fn with_autocast(on: bool, f: impl FnOnce() -> Var) -> Var {
    if on {
        oxtrain_autograd::autocast(DType::BF16, f)
    } else {
        f()
    }
}

/// `--parity`: the initial state and the batch into `dir`, then `--steps` steps from them with
/// every loss into `dir/oxtrain.json` (and on stdout).
fn parity(args: &BenchArgs, w: &mut Workload, dir: &std::path::Path) -> Result<(), BenchError> {
    let io = |what: &str, e: &dyn std::fmt::Display| {
        BenchError(format!("--parity: {what} in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating the folder", &e))?;
    let on_cpu = |named: Vec<(String, &Tensor)>| -> Result<Vec<(String, Tensor)>, BenchError> {
        named.into_iter().map(|(n, t)| Ok((n, t.to_device(Device::Cpu).map_err(err)?))).collect()
    };
    let state = on_cpu(w.state.iter().map(|(n, t)| (n.clone(), t)).collect())?;
    oxtrain_tensor::safetensors::save(state, None, dir.join("init.safetensors"))
        .map_err(|e| io("writing init.safetensors", &e))?;
    let batch = on_cpu(w.batch.iter().map(|(n, t)| (n.to_string(), t)).collect())?;
    oxtrain_tensor::safetensors::save(batch, None, dir.join("batch.safetensors"))
        .map_err(|e| io("writing batch.safetensors", &e))?;
    let losses: Vec<f64> =
        (0..args.steps).map(|_| (w.step)().tensor().to_dtype(DType::F64).to_vec::<f64>()[0]).collect();
    let out = serde_json::json!({
        "name": w.name,
        "model": format!("{:?}", args.model).to_lowercase(),
        "precision": format!("{:?}", args.precision).to_lowercase(),
        "channels_last": args.channels_last,
        "batch": args.batch,
        "image": args.image,
        "seq": args.seq,
        "losses": losses,
    });
    std::fs::write(dir.join("oxtrain.json"), out.to_string()).map_err(|e| io("writing oxtrain.json", &e))?;
    println!("{out}");
    Ok(())
}

/// One step's wall time, ended by a device synchronisation, and when it ended.
#[derive(Clone, Copy)]
struct StepTime {
    seconds: f64,
    /// From the start of the process to the end of the step (Linux only).
    since_process_start: Option<f64>,
}

fn timed_step(w: &mut Workload, sync: &dyn Fn() -> Result<(), BenchError>) -> Result<StepTime, BenchError> {
    let t = Instant::now();
    (w.step)();
    sync()?;
    Ok(StepTime { seconds: t.elapsed().as_secs_f64(), since_process_start: seconds_since_process_start() })
}

/// Seconds since this process started, from the kernel's record of its start (Linux only):
/// it counts what runs before `main` and the loading of libraries too.
fn seconds_since_process_start() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let started = start_ticks(&stat)? as f64;
    // SAFETY: sysconf and clock_gettime only write the out-parameter given.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // The start time counts from boot, as CLOCK_BOOTTIME does (both include suspend).
    if ticks_per_second <= 0 || unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return None;
    }
    let now = now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9;
    Some((now - started / ticks_per_second as f64).max(0.0))
}

/// Field 22 of `/proc/<pid>/stat` (`starttime`, clock ticks after boot). The command name,
/// field 2, is in parentheses and may hold spaces and parentheses itself, so fields are
/// counted from the last `)`.
fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The process's peak resident set (VmHWM), in bytes; Linux only.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The host waits and driver allocations per step over a few steps queued back to back (no
/// synchronisation between them, as in a training loop): a steady step should have neither.
fn steady_step_waits(ordinal: usize, step: &mut dyn FnMut() -> Var) -> oxtrain_tensor::Result<(f64, f64)> {
    const STEPS: usize = 3;
    cuda::synchronize(ordinal)?;
    let (waits, mem) = (cuda::host_waits(ordinal)?, cuda::memory_stats(ordinal)?);
    for _ in 0..STEPS {
        step();
    }
    let (waits_after, mem_after) = (cuda::host_waits(ordinal)?, cuda::memory_stats(ordinal)?);
    cuda::synchronize(ordinal)?;
    let per_step = |n: u64| n as f64 / STEPS as f64;
    Ok((
        per_step(waits_after.since(&waits).total()),
        per_step((mem_after.driver_allocs - mem.driver_allocs) as u64),
    ))
}

/// Runs the benchmark and prints its JSON line.
/// The device `--device` names, checked to be here.
fn bench_device(args: &BenchArgs) -> Result<Device, BenchError> {
    let device = match oxtrain::config::parse_device(&args.device) {
        Some(Some(d)) => d,
        Some(None) => {
            if cuda::is_available(0) {
                Device::Cuda(0)
            } else {
                Device::Cpu
            }
        }
        None => {
            return Err(BenchError(format!(
                "unknown device `{}`; use cpu, cuda, cuda:N or auto",
                args.device
            )))
        }
    };
    if let Device::Cuda(n) = device {
        if !cuda::is_available(n) {
            return Err(BenchError(format!("no CUDA device {n} here; use --device cpu")));
        }
        cuda::set_allow_tf32(matches!(args.precision, BenchPrecision::Tf32));
    }
    Ok(device)
}

/// One step under the op profiler, its table on stderr.
fn print_profile(device: Device, w: &mut Workload) {
    let profile = match device {
        // Each op waits for the GPU, so it is charged its own kernels' time.
        Device::Cuda(n) => {
            let sync: &'static (dyn Fn() + Sync) = Box::leak(Box::new(move || {
                let _ = cuda::synchronize(n);
            }));
            profile::record_synced(sync, || drop((w.step)()))
        }
        Device::Cpu => oxtrain_autograd::profile::record(|| drop((w.step)())),
    };
    eprintln!("{}", profile.table());
}

pub fn run(args: &BenchArgs) -> Result<(), BenchError> {
    let device = bench_device(args)?;
    if args.batch == 0 || args.steps == 0 {
        return Err(BenchError("--batch and --steps must be at least 1".into()));
    }
    let threads = args.threads.unwrap_or_else(rayon::current_num_threads).max(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(err)?;
    pool.install(|| {
        let mut w = workload(args, device)?;
        let sync = || {
            if let Device::Cuda(n) = device {
                cuda::synchronize(n).map_err(err)
            } else {
                Ok(())
            }
        };
        if let Some(dir) = &args.parity {
            return parity(args, &mut w, dir);
        }
        // The first step compiles or loads every kernel it uses: on a fresh machine, the cold
        // start a user waits for. With no warm-up, the first timed step is that step.
        let mut first_step = None;
        if args.warmup > 0 {
            first_step = Some(timed_step(&mut w, &sync)?);
        }
        for _ in 1..args.warmup {
            (w.step)();
        }
        sync()?;
        if args.profile {
            print_profile(device, &mut w);
        }
        let mut times = Vec::with_capacity(args.steps);
        for _ in 0..args.steps {
            let step = timed_step(&mut w, &sync)?;
            first_step.get_or_insert(step);
            times.push(step.seconds);
        }
        let steady = match device {
            Device::Cuda(n) => Some(steady_step_waits(n, &mut w.step).map_err(err)?),
            Device::Cpu => None,
        };
        let first_step = first_step.expect("--steps is at least 1");
        if let (true, Device::Cuda(n)) = (args.profiler_range, device) {
            cuda::profiler_range(n, || drop((w.step)())).map_err(err)?;
        }
        let step_s = median(times.clone());
        let peak = match device {
            Device::Cpu => peak_rss_bytes(),
            Device::Cuda(n) => cuda::memory_stats(n).ok().map(|s| s.peak_allocated as u64),
        };
        let out = serde_json::json!({
            "name": format!("train_{}_{}_{}t", w.name, if device.is_cuda() { "cuda" } else { "cpu" }, threads),
            "unit": w.unit,
            "oxtrain": w.items as f64 / step_s,
            "step_seconds": step_s,
            "step_times": times,
            "first_step_seconds": first_step.seconds,
            "process_to_first_step_seconds": first_step.since_process_start,
            "peak_memory_bytes": peak,
            "memory_kind": if device.is_cuda() { "CUDA caching allocator peak" } else { "peak RSS" },
            "threads": threads,
            "precision": format!("{:?}", args.precision).to_lowercase(),
            // Per step, over steps queued back to back: both should be 0.
            "steady_step_host_waits": steady.map(|s| s.0),
            "steady_step_driver_allocs": steady.map(|s| s.1),
        });
        println!("{out}");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_after_a_command_name_with_spaces_and_parentheses() {
        // A line as proc(5) lays it out: pid (comm) state ppid ... with starttime 22nd.
        let fields: Vec<String> =
            (4..=52).map(|i| if i == 22 { "98765".into() } else { i.to_string() }).collect();
        let stat = format!("4242 (a (b) c) S {}", fields.join(" "));
        assert_eq!(start_ticks(&stat), Some(98765));
        assert_eq!(start_ticks("4242 (x) S 1 2"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_process_started_before_now_and_after_boot() {
        let since_start = seconds_since_process_start().expect("Linux has /proc/self/stat");
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // Clock ticks are 10 ms: allow one either way.
        assert!((0.0..=uptime + 0.02).contains(&since_start), "{since_start} s since start, {uptime} s up");
        let later = seconds_since_process_start().unwrap();
        assert!(later >= since_start, "{later} < {since_start}");
    }
}
