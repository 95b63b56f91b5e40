//! What the resume and elastic tests share: a GPT-2 of one layer on a few hundred bytes of
//! text (dropout on, a shuffling sampler, AdamW with warmup and cosine decay over two epochs,
//! so every piece of state a checkpoint holds changes the losses), processes watched line by
//! line, and the comparison of two runs bit for bit.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Optimizer steps of every run: 2 epochs of 8 batches, less 4.
pub const STEPS: usize = 12;

/// Writes the corpus into `dir` and returns the `train` arguments of a run logging into
/// `dir/<name>`, with `extra` overrides.
pub fn train_args(dir: &Path, name: &str, extra: &[&str]) -> Vec<String> {
    let corpus = dir.join("corpus.txt");
    if !corpus.exists() {
        std::fs::write(&corpus, "the quick brown fox jumps over the lazy dog. ".repeat(12)).unwrap();
    }
    let mut a: Vec<String> = vec![
        "train".into(),
        "model.name=gpt2".into(),
        "model.layers=1".into(),
        "model.hidden_size=16".into(),
        "model.heads=2".into(),
        "model.max_positions=16".into(),
        "model.dropout=0.1".into(),
        "data.kind=text_lm".into(),
        format!("data.train={}", corpus.display()),
        "data.block_size=16".into(),
        "data.batch_size=4".into(),
        format!("train.steps={STEPS}"),
        "train.device=cpu".into(),
        "log.every_steps=1".into(),
        "log.progress=lines".into(),
        "log.plots=false".into(),
        format!("log.dir={}", dir.join(name).display()),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// A started `oxtrain` whose stderr lines arrive on a channel (and are kept for messages).
pub struct Watched {
    pub child: Child,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

pub fn start(dir: &Path, args: &[String], env: &[(&str, String)]) -> Watched {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxtrain"));
    cmd.args(args).current_dir(dir).env_remove("RANK").env_remove("WORLD_SIZE");
    cmd.env_remove("OXTRAIN_TEST_HALT_AFTER_STEP").env_remove("OXTRAIN_TEST_PAUSE_CHECKPOINT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("oxtrain starts");
    let (tx, lines) = channel();
    for stream in [
        Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stdout.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    Watched { child, lines, seen: Vec::new() }
}

impl Watched {
    /// Waits (up to two minutes) for `n` lines containing `needle`; returns them.
    pub fn wait_for(&mut self, needle: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let found: Vec<String> = self.seen.iter().filter(|l| l.contains(needle)).cloned().collect();
            if found.len() >= n {
                return found;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no {n} line(s) with {needle:?} within 2 minutes:\n{}", self.seen.join("\n"));
                }
            }
        }
    }

    /// Waits for the process to end; returns its status and everything it printed.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().unwrap();
        // The reader threads end with the pipes.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(l);
        }
        (status, self.seen.join("\n"))
    }
}

/// The pid in a test hook's line ("... (pid 123) ...").
pub fn pid_in(line: &str) -> i32 {
    let rest = line.split("(pid ").nth(1).unwrap_or_else(|| panic!("no pid in {line:?}"));
    rest.split(')').next().unwrap().parse().unwrap()
}

pub fn sigkill(pid: i32) {
    // SAFETY: kill(2) on a process this test started (or its launcher did) and that is alive.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
}

/// Runs `oxtrain ARGS` to the end and asserts it succeeded; returns its output.
pub fn run_ok(dir: &Path, args: &[String], env: &[(&str, String)]) -> String {
    let (status, out) = start(dir, args, env).finish();
    assert!(status.success(), "oxtrain {args:?} failed ({status}):\n{out}");
    out
}

/// (step, loss) of every logged training step of a run, the loss as its f64 bits.
pub fn losses(run: &Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap().to_bits()))
        .collect()
}

pub fn final_weights(run: &Path) -> PathBuf {
    run.join("checkpoints/final/model.safetensors")
}

/// The resumed run equals the uninterrupted one: the same loss at every step, bit for bit
/// (the steps before the resume come from the first attempt's records, the later ones were
/// recomputed), and byte-identical final weights.
pub fn assert_same_run(reference: &Path, resumed: &Path) {
    let (a, b) = (losses(reference), losses(resumed));
    assert_eq!(a.len(), STEPS, "the reference logs every step: {a:?}");
    assert_eq!(a, b, "the losses differ (step, f64 bits)");
    let (wa, wb) =
        (std::fs::read(final_weights(reference)).unwrap(), std::fs::read(final_weights(resumed)).unwrap());
    assert!(wa == wb, "the final weights differ between {} and {}", reference.display(), resumed.display());
}

/// A seed for a random choice: `OXTRAIN_TEST_SEED` when set (to replay a failure), else the
/// clock; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var("OXTRAIN_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay with OXTRAIN_TEST_SEED={seed})");
    seed
}

/// A number in [0, 1) from `seed` (splitmix64).
pub fn unit_from(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
}
