//! Trains the built-in example (a small ResNet on drawn shapes) through the library, as
//! `oxtrain train` does: `cargo run --release --example train_cnn [-- key=value ...]`, e.g.
//! `precision.dtype=bf16` or `train.epochs=2` (`oxtrain config --print` lists every key).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let overrides: Vec<String> = std::env::args().skip(1).collect();
    let config = oxtrain::config::Config::load(None, &overrides)?;
    let summary = oxtrain::trainer::train(&config)?;
    println!("{}", summary.line());
    Ok(())
}
