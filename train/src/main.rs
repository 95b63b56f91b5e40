//! The `oxtrain` command.

mod bench;

use clap::{Parser, Subcommand};
use oxtrain::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oxtrain",
    version,
    about = "Train neural networks on GPUs and CPUs",
    after_help = "Examples:\n  oxtrain train                                     # the built-in example\n  oxtrain train --config examples/configs/resnet50_imagenet.toml data.train=/data/imagenet/train data.val=/data/imagenet/val\n  oxtrain launch --nproc-per-node 8 -- train --config examples/configs/resnet50_imagenet.toml\n  oxtrain config --print optim.lr=0.05"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train what a config says; with no config, the built-in example (a small ResNet on drawn
    /// shapes, written once into a cache folder), on the GPU if there is one.
    #[command(
        after_help = "Examples:\n  oxtrain train\n  oxtrain train train.epochs=3 optim.lr=2e-3\n  oxtrain train checkpoint.every_steps=500 --resume   # continue from the newest valid checkpoint\n  oxtrain train --config examples/configs/gpt2_text.toml data.train=corpus.txt"
    )]
    Train(TrainArgs),
    /// Write the model of a checkpoint as a plain safetensors state_dict with PyTorch's names,
    /// which `model.load_state_dict(safetensors.torch.load_file(...))` and Hugging Face's
    /// `from_pretrained` (beside a config.json) load as they are. Checksums are verified first.
    #[command(
        after_help = "Examples:\n  oxtrain export --checkpoint runs/oxtrain/checkpoints/step-001000 --out model.safetensors\n  oxtrain export --checkpoint runs/oxtrain/checkpoints --out model.safetensors   # the newest valid one\n  oxtrain export --merge-lora --checkpoint runs/gpt2_lora/checkpoints/final --out merged.safetensors\n  oxtrain export --peft-adapter --checkpoint runs/gpt2_lora/checkpoints/final --out gpt2-adapter"
    )]
    Export(ExportArgs),
    /// Evaluate a model folder or checkpoint (model.safetensors + config.toml): top-1/top-5
    /// for images, perplexity for language models, accuracy and loss for classification.
    #[command(
        after_help = "Examples:\n  oxtrain eval --checkpoint runs/oxtrain/checkpoints/final\n  oxtrain eval --checkpoint runs/resnet50/checkpoints/final --data /data/imagenet/val"
    )]
    Eval(EvalArgs),
    /// Start this node's workers with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    /// MASTER_ADDR, ...): one per GPU, or CPU workers talking through shared memory. Signals
    /// are passed on; when one worker fails the others are stopped, and with --max-restarts all are
    /// started again from the latest checkpoint.
    #[command(
        after_help = "Examples:\n  oxtrain launch --nproc-per-node 8 -- train --config examples/configs/resnet50_imagenet.toml\n  oxtrain launch --nproc-per-node 2 --backend shm -- train train.device=cpu\n  oxtrain launch --nproc-per-node 8 --max-restarts 3 -- train --config run.toml checkpoint.every_steps=1000\n  oxtrain launch --nproc-per-node 8 --max-restarts 3 --min-nproc 6 -- train --config run.toml ddp.shard_optimizer=true\n  oxtrain launch --nnodes 2 --node-rank 0 --master-addr node0 --nproc-per-node 8 -- train --config run.toml"
    )]
    Launch(LaunchArgs),
    /// Print the resolved config: every key with its value, defaults included.
    #[command(
        after_help = "Examples:\n  oxtrain config --print\n  oxtrain config --print --config examples/configs/bert_jsonl.toml data.batch_size=16"
    )]
    Config(ConfigArgs),
    /// Tokenize text files (.txt: one document; .jsonl: a "text" per line) with a Hugging Face
    /// tokenizer.json into llm.c token shards for data.kind = "token_shards", in parallel.
    #[command(
        after_help = "Examples:\n  oxtrain tokenize --tokenizer gpt2/tokenizer.json --out data/shards corpus.txt\n  oxtrain tokenize --tokenizer tokenizer.json --out data/web --name web --val-shard --shard-tokens 100000000 part-*.jsonl"
    )]
    Tokenize(TokenizeArgs),
    /// Time a whole training step of a built-in model on synthetic data (JSON on stdout).
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct TrainArgs {
    /// A TOML config (sections model, data, optim, schedule, precision, train, ddp, checkpoint, log).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Continue a run exactly where a checkpoint left it: `latest` (the default when given
    /// without a value) is the newest valid checkpoint in checkpoint.dir; or a step directory
    /// or a checkpoints folder. The same as checkpoint.resume=...
    #[arg(long, value_name = "latest|DIR", num_args = 0..=1, default_missing_value = "latest")]
    resume: Option<String>,
    /// Start afresh where log.dir holds an earlier run, deleting its metrics and checkpoints
    /// (without it such a start is refused). The same as log.overwrite=true.
    #[arg(long)]
    overwrite: bool,
    /// Overrides: section.key=value (or key=value when one section has the key).
    #[arg(value_name = "KEY=VALUE", allow_hyphen_values = true)]
    overrides: Vec<String>,
}

#[derive(clap::Args)]
struct ExportArgs {
    /// A step directory (`.../checkpoints/step-001000`), or a checkpoints folder, whose newest
    /// valid checkpoint is used.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The safetensors file to write (written beside it and renamed into place).
    #[arg(long)]
    out: PathBuf,
    /// A LoRA run (`[lora]`): merge its adapters into the base of `model.init_from` and write
    /// the full model with PyTorch's names (PEFT's `merge_and_unload`). `--checkpoint` is then a
    /// checkpoint or model folder (`runs/NAME/checkpoints/final`).
    #[arg(long, conflicts_with = "peft_adapter")]
    merge_lora: bool,
    /// A LoRA run: write its adapters as PEFT's adapter folder `--out` (adapter_model.safetensors
    /// and adapter_config.json), which `PeftModel.from_pretrained(base, out)` loads.
    #[arg(long)]
    peft_adapter: bool,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// A folder with model.safetensors and config.toml, as training writes at its end.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The data to evaluate (an image folder, a text file, a jsonl file); default: the
    /// config's data.val.
    #[arg(long)]
    data: Option<String>,
    /// Overrides of the saved config (data.batch_size=256, train.device=cpu, ...).
    #[arg(value_name = "KEY=VALUE", allow_hyphen_values = true)]
    overrides: Vec<String>,
}

#[derive(clap::Args)]
struct LaunchArgs {
    /// Workers on this node (one per GPU).
    #[arg(long)]
    nproc_per_node: usize,
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's index among --nnodes.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// The host of rank 0, as the other nodes reach it.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// The workers' communication backend (shm, nccl, nvshmem, mpi); default: comm's choice.
    #[arg(long)]
    backend: Option<String>,
    /// Seconds workers get to exit after SIGTERM before they are killed.
    #[arg(long, default_value_t = 30.0)]
    stop_timeout: f64,
    /// When a worker dies, stop the others and start all again, up to this many times;
    /// `train` workers then resume from the newest valid checkpoint (checkpoint.resume=latest).
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// With --max-restarts: after a worker dies, start one worker fewer, down to this many
    /// (one node only). `train` then resumes its checkpoint on the smaller world: ZeRO-1 shards
    /// and the data position are re-partitioned (the per-rank batch stays data.batch_size).
    #[arg(long, value_name = "N")]
    min_nproc: Option<usize>,
    /// What each worker runs: an oxtrain subcommand (`train ...`) or any program.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<std::ffi::OsString>,
}

#[derive(clap::Args)]
struct TokenizeArgs {
    /// The tokenizer.json (or a folder holding one); its <|endoftext|>, [SEP] or </s> ends each document.
    #[arg(long)]
    tokenizer: PathBuf,
    /// The folder the shards are written into.
    #[arg(long)]
    out: PathBuf,
    /// Tokens per shard.
    #[arg(long, default_value_t = 100_000_000)]
    shard_tokens: usize,
    /// Shard file names: NAME_train_000000.bin, ...
    #[arg(long, default_value = "tokens")]
    name: String,
    /// Make the first shard NAME_val_000000.bin, the validation split (as llm.c does).
    #[arg(long)]
    val_shard: bool,
    /// The text files, in order.
    #[arg(required = true, value_name = "FILE")]
    inputs: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct ConfigArgs {
    /// Print the config as TOML (the only action for now; required so the command reads as
    /// what it does).
    #[arg(long, required = true)]
    print: bool,
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(value_name = "KEY=VALUE", allow_hyphen_values = true)]
    overrides: Vec<String>,
}

fn fail(command: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("oxtrain {command}: {e}");
    ExitCode::from(2)
}

/// `--resume [VALUE]` given after the first override reaches the overrides (they take any
/// word, so `optim.lr=-1` works): take it back out.
fn take_resume_flag(args: &mut TrainArgs) {
    let mut rest = Vec::with_capacity(args.overrides.len());
    let mut words = std::mem::take(&mut args.overrides).into_iter().peekable();
    while let Some(w) = words.next() {
        if w == "--overwrite" {
            args.overwrite = true;
        } else if let Some(v) = w.strip_prefix("--resume=") {
            args.resume = Some(v.to_string());
        } else if w == "--resume" {
            let value = words.next_if(|n| !n.contains('=') && !n.starts_with('-'));
            args.resume = Some(value.unwrap_or_else(|| "latest".into()));
        } else {
            rest.push(w);
        }
    }
    args.overrides = rest;
}

fn train(mut args: TrainArgs) -> ExitCode {
    take_resume_flag(&mut args);
    if let Some(r) = args.resume.take() {
        // After the other overrides, so the flag wins over a checkpoint.resume=... among them.
        args.overrides.push(format!("checkpoint.resume={r}"));
    }
    if args.overwrite {
        args.overrides.push("log.overwrite=true".into());
    }
    let config = match Config::load(args.config.as_deref(), &args.overrides) {
        Ok(c) => c,
        Err(e) => return fail("train", e),
    };
    match oxtrain::trainer::train(&config) {
        Ok(summary) => {
            if summary.rank == 0 {
                println!("{}", summary.line());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oxtrain train: {e}");
            ExitCode::FAILURE
        }
    }
}

fn export(args: ExportArgs) -> ExitCode {
    if args.peft_adapter {
        return match oxtrain::merge_lora::export_peft_adapter(&args.checkpoint, &args.out) {
            Ok(m) => {
                println!(
                    "wrote the LoRA adapters of {} ({} layers, {} tensors) as PEFT's adapter folder {}",
                    args.checkpoint.display(),
                    m.adapted.len(),
                    m.tensors,
                    args.out.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail("export", e),
        };
    }
    if args.merge_lora {
        return match oxtrain::merge_lora::export_merged(&args.checkpoint, &args.out) {
            Ok(m) => {
                println!(
                    "merged the LoRA adapters of {} ({} layers) into its base and wrote the full model ({} tensors) to {}",
                    args.checkpoint.display(),
                    m.adapted.len(),
                    m.tensors,
                    args.out.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail("export", e),
        };
    }
    match oxtrain::checkpoint::export(&args.checkpoint, &args.out) {
        Ok(e) => {
            for s in &e.skipped {
                eprintln!("oxtrain export: skipped the newer checkpoint {}: {}", s.path.display(), s.problem);
            }
            println!(
                "exported the model of {} (step {}) to {} ({} bytes)",
                e.checkpoint.display(),
                e.step,
                e.out.display(),
                e.bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail("export", e),
    }
}

fn eval(args: EvalArgs) -> ExitCode {
    match oxtrain::eval::evaluate_checkpoint(&args.checkpoint, args.data.as_deref(), &args.overrides) {
        Ok((_, e)) => {
            let mut line = format!("eval: {} samples, loss {:.4}", e.samples, e.loss);
            for (k, v) in &e.metrics {
                match k.as_str() {
                    "perplexity" => line += &format!(", perplexity {v:.3}"),
                    _ => line += &format!(", {k} {:.2}%", 100.0 * v),
                }
            }
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => fail("eval", e),
    }
}

fn launch(a: LaunchArgs) -> ExitCode {
    let spec = oxtrain::launch::LaunchSpec {
        nproc_per_node: a.nproc_per_node,
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr,
        master_port: a.master_port,
        backend: a.backend,
        command: a.command,
        grace: std::time::Duration::from_secs_f64(a.stop_timeout.clamp(0.0, 3600.0)),
        max_restarts: a.max_restarts,
        min_nproc: a.min_nproc,
    };
    match oxtrain::launch::launch(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxtrain launch: {e}");
            ExitCode::from(e.exit_code().clamp(1, 255) as u8)
        }
    }
}

fn tokenize(a: TokenizeArgs) -> ExitCode {
    let spec = oxtrain::tokenize::TokenizeSpec {
        tokenizer: a.tokenizer,
        out: a.out,
        inputs: a.inputs,
        shard_tokens: a.shard_tokens,
        name: a.name,
        val_first: a.val_shard,
        progress: true,
    };
    match oxtrain::tokenize::tokenize(&spec) {
        Ok(summary) => {
            println!("{}", summary.report(&spec));
            ExitCode::SUCCESS
        }
        Err(e) => fail("tokenize", e),
    }
}

fn config(args: ConfigArgs) -> ExitCode {
    match Config::load(args.config.as_deref(), &args.overrides) {
        Ok(c) => {
            debug_assert!(args.print);
            print!("{}", c.to_toml());
            ExitCode::SUCCESS
        }
        Err(e) => fail("config", e),
    }
}

/// Makes glibc's allocator keep the memory a training step frees for the next step. By default
/// glibc serves every buffer over its mmap threshold (at most 32 MB) with a fresh mapping and
/// unmaps it on free, and trims freed memory off the heap: every step then faults the same
/// pages in again (GPT-2's logits and their gradient are 206 MB each), each fault a page the
/// kernel clears, and with several threads each unmapping a TLB shootdown on every core. One
/// arena, no mappings and no trimming keep a step's buffers in the heap for the next step; the
/// resident memory stays at the peak that every step reaches anyway. (jemalloc, tried instead,
/// gave zeroed allocations back to the kernel with madvise and faulted them in again.)
/// Settings given in `GLIBC_TUNABLES` are left to rule.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    match cli.command {
        None => train(TrainArgs { config: None, resume: None, overwrite: false, overrides: vec![] }),
        Some(Command::Export(a)) => export(a),
        Some(Command::Train(a)) => train(a),
        Some(Command::Eval(a)) => eval(a),
        Some(Command::Config(a)) => config(a),
        Some(Command::Launch(a)) => launch(a),
        Some(Command::Tokenize(a)) => tokenize(a),
        Some(Command::Bench(b)) => match bench::run(&b) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail("bench", e),
        },
    }
}
