//! Tensor basics: creation, views, broadcasting. Run: `cargo run --example tensor_basics`.
use oxtrain_tensor::{DType, Device, Tensor};

fn main() -> oxtrain_tensor::Result<()> {
    let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, Device::Cpu)?.reshape([3, 4]);
    let col = Tensor::new([10f32, 20., 30.], Device::Cpu)?.unsqueeze(1);
    let y = (&x.t().t() + &col).relu();
    println!("x = {x:?}\ny = {y:?}");
    Ok(())
}
