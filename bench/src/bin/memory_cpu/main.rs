//! Memory on CPU, oxtrain against PyTorch measured the same way in the same run: peak resident
//! memory of a fresh process per measurement (getrusage `ru_maxrss`, which both sides report
//! of themselves), so allocators, caches and libraries count as they do for a user.
//!
//! `cargo run --release -p oxtrain-bench --bin memory_cpu` writes `bench/results/memory-cpu.json`.
//! One module per section, each giving its rows and a sentence of notes:
//! - `activation`: one GPT-2 step (forward and backward) with and without activation
//!   checkpointing per block, against `torch.utils.checkpoint` (use_reentrant=False).
//!
//! A section adds itself to [`SECTIONS`] and to [`child`]. The peer is
//! `bench/peers/memory_cpu.py` under `OXTRAIN_PEER_PYTHON` (default `python3`, with torch and
//! transformers). `BENCH_ROUNDS` (default 1) rounds, each running every measurement once,
//! oxtrain then PyTorch, interleaved; a figure is the median over rounds.
//!
//! Internally the same binary runs each measurement: `memory_cpu child SECTION ARGS...` prints
//! one JSON line.

mod activation;

use oxtrain_bench::{bench_file, git_commit, load_average, today, Benchmark, OtherLoad, Report};
use serde_json::Value;
use std::process::Command;

/// A section's rows, extra fields per row (by row name), and its sentence of notes.
pub struct Section {
    pub rows: Vec<Benchmark>,
    pub extras: Vec<(String, serde_json::Map<String, Value>)>,
    pub notes: String,
}

type Measure = fn(&Runner) -> Result<Section, String>;

const SECTIONS: &[(&str, Measure)] = &[("activation", activation::measure)];

/// Starts the measurement processes of both sides.
pub struct Runner {
    me: String,
    python: String,
    script: String,
    pub rounds: usize,
}

impl Runner {
    /// One oxtrain measurement in a fresh process: `memory_cpu child ARGS`.
    pub fn oxtrain(&self, args: &[String]) -> Result<Value, String> {
        let mut c = Command::new(&self.me);
        c.arg("child").args(args).env("RAYON_NUM_THREADS", "1");
        run_json(c, "oxtrain")
    }

    /// One PyTorch measurement in a fresh process: `memory_cpu.py ARGS`.
    pub fn peer(&self, args: &[String]) -> Result<Value, String> {
        let mut c = Command::new(&self.python);
        c.arg(&self.script).args(args).env("OMP_NUM_THREADS", "1");
        run_json(c, "the PyTorch peer")
    }

    /// `torch.__version__` and `transformers.__version__` of the peer.
    pub fn peer_versions(&self) -> String {
        let code = "import torch, transformers; print(torch.__version__, transformers.__version__)";
        Command::new(&self.python)
            .args(["-c", code])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }
}

/// The last stdout line of `c` as JSON, or why there is none.
fn run_json(mut c: Command, who: &str) -> Result<Value, String> {
    let o = c.output().map_err(|e| format!("could not start {who}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{who} failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr)));
    }
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("{who}: not JSON ({e}): {line}"))
}

/// This process's peak resident set in KiB (`getrusage` `ru_maxrss`, KiB on Linux).
pub fn peak_rss_kb() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    usage.ru_maxrss
}

/// A child measurement: prints its JSON line.
fn child(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let out = match args.first().map(String::as_str) {
        Some("activation") => activation::child(&args[1..])?,
        other => return Err(format!("memory_cpu child: unknown section {other:?}").into()),
    };
    println!("{out}");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2..]);
    }
    let runner = Runner {
        me: std::env::current_exe()?.to_string_lossy().into_owned(),
        python: std::env::var("OXTRAIN_PEER_PYTHON").unwrap_or_else(|_| "python3".into()),
        script: bench_file("peers/memory_cpu.py"),
        rounds: std::env::var("BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1),
    };
    let load_before = load_average();
    let others = OtherLoad::start();
    let (mut rows, mut extras, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    for (name, measure) in SECTIONS {
        let section = measure(&runner).map_err(|e| format!("section {name}: {e}"))?;
        rows.extend(section.rows);
        extras.extend(section.extras);
        notes.push(section.notes);
    }
    notes.push(format!(
        "Peer: torch/transformers {}. Load average (1, 5, 15 min) before: {load_before}; after: {}; other \
         processes kept {:.0}% of the machine busy during the run (memory figures do not depend on it, \
         times do).",
        runner.peer_versions(),
        load_average(),
        others.percent()
    ));
    let report = Report {
        date: today(),
        commit: git_commit(),
        machine: oxtrain_bench::cpu_description(),
        notes: notes.join(" "),
        benchmarks: rows,
    };
    let mut json = report.to_json();
    for row in json["benchmarks"].as_array_mut().into_iter().flatten() {
        if let Some((_, more)) = extras.iter().find(|(n, _)| row["name"] == n.as_str()) {
            row.as_object_mut().expect("a row is an object").extend(more.clone());
        }
    }
    std::fs::create_dir_all("bench/results")?;
    std::fs::write("bench/results/memory-cpu.json", serde_json::to_string_pretty(&json)? + "\n")?;
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}
