//! The `oxtrain` command.

mod bench;

use clap::{Parser, Subcommand, ValueEnum};
use oxtrain::builtin::{self, Options, Precision};
use oxtrain_tensor::{cuda, Device};

#[derive(Parser)]
#[command(name = "oxtrain", version, about = "Train neural networks on GPUs and CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train the built-in example (a small CNN on drawn shapes) on the GPU if there is one.
    Train(TrainArgs),
    /// Time a whole training step of a built-in model on synthetic data (JSON on stdout).
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct TrainArgs {
    /// `cpu`, `cuda` or `cuda:N`; default: cuda:0 when a GPU is there, else cpu.
    #[arg(long)]
    device: Option<String>,
    #[arg(long, value_enum, default_value = "f32")]
    precision: PrecisionArg,
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 4e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F32,
    Bf16,
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("unknown device `{other}`; use cpu, cuda or cuda:N")),
    }
}

fn main() {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Train(a)) => a,
        Some(Command::Bench(b)) => {
            if let Err(e) = bench::run(&b) {
                eprintln!("oxtrain bench: {e}");
                std::process::exit(1);
            }
            return;
        }
        None => match Cli::parse_from(["oxtrain", "train"]).command {
            Some(Command::Train(a)) => a,
            _ => unreachable!("`train` was given"),
        },
    };
    let device = match args.device.as_deref().map(parse_device) {
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            eprintln!("oxtrain train: {e}");
            std::process::exit(2);
        }
        None if cuda::is_available(0) => Device::Cuda(0),
        None => Device::Cpu,
    };
    let precision = match args.precision {
        PrecisionArg::F32 => Precision::F32,
        PrecisionArg::Bf16 => Precision::Bf16,
    };
    let opts = Options {
        device,
        precision,
        epochs: args.epochs,
        batch_size: args.batch_size,
        lr: args.lr,
        seed: args.seed,
        ..Options::default()
    };
    eprintln!(
        "oxtrain train: built-in example (a CNN on {} drawn shapes: {}), {} images, on {device:?}, {precision:?}",
        builtin::shapes::CLASSES,
        builtin::shapes::CLASS_NAMES.join(", "),
        opts.train_size
    );
    match builtin::run(&opts) {
        Ok(r) => println!(
            "final loss {:.4}, test accuracy {:.2}%, {:.1} s ({:.0} images/s)",
            r.final_loss,
            100.0 * r.test_accuracy,
            r.seconds,
            r.images_per_second
        ),
        Err(e) => {
            eprintln!("oxtrain train: {e}");
            std::process::exit(1);
        }
    }
}
