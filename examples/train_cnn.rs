//! Trains the built-in example (a small CNN on drawn shapes) with a progress bar:
//! `cargo run --release --example train_cnn [-- bf16]`. The same run as `oxtrain train`.

use oxtrain::builtin::{run, Options, Precision};
use oxtrain_tensor::{cuda, Device};

fn main() -> oxtrain_tensor::Result<()> {
    let bf16 = std::env::args().any(|a| a == "bf16");
    let device = if cuda::is_available(0) { Device::Cuda(0) } else { Device::Cpu };
    let precision = if bf16 { Precision::Bf16 } else { Precision::F32 };
    let report = run(&Options { device, precision, ..Options::default() })?;
    println!("test accuracy {:.2}% after {:.1} s", 100.0 * report.test_accuracy, report.seconds);
    Ok(())
}
