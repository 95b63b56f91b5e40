//! `manual_seed` makes the default generator repeat, as `torch.manual_seed`: layer
//! initialisation and dropout masks drawn after the same seed are the same. A test binary of
//! its own: in the library's tests, others draw from the default generator concurrently.

use oxtrain_autograd::Var;
use oxtrain_nn::{Dropout, Forward, Linear};
use oxtrain_tensor::{manual_seed, DType, Device, Tensor};

#[test]
fn manual_seed_repeats_initialisation_and_dropout_masks() {
    manual_seed(5);
    let c = Linear::new(8, 8, Device::Cpu).unwrap();
    manual_seed(5);
    let d = Linear::new(8, 8, Device::Cpu).unwrap();
    assert_eq!(c.weight.tensor().to_f64_vec(), d.weight.tensor().to_f64_vec());

    let x = Var::constant(Tensor::ones(64, DType::F32, Device::Cpu).unwrap());
    let drop = Dropout::new(0.5);
    manual_seed(7);
    let a = drop.forward(&x).tensor().to_vec1::<f32>();
    manual_seed(7);
    let b = drop.forward(&x).tensor().to_vec1::<f32>();
    assert_eq!(a, b);
    // A different seed gives a different mask (64 draws at p = 0.5 collide with chance 2^-64).
    manual_seed(8);
    assert_ne!(drop.forward(&x).tensor().to_vec1::<f32>(), a);
}
