//! Parameter initialisation as `torch.nn.init`: each function fills a tensor in place (so a
//! parameter keeps its storage) with the formula PyTorch uses. Random ones draw from `gen` when
//! given, else from the process-wide generator that `oxtrain_tensor::manual_seed` seeds, like
//! PyTorch's `generator=None`.

use oxtrain_tensor::{Distribution, Generator, Tensor};
use std::cell::Cell;

thread_local! {
    static SKIP_RANDOM: Cell<bool> = const { Cell::new(false) };
}

/// Runs `build` with the random initialisers ([`uniform_`], [`normal_`] and every function
/// built on them) leaving tensors as they are, as Hugging Face's `no_init_weights()`: a model
/// about to be overwritten by a checkpoint is built without drawing millions of random
/// numbers it would throw away (and without moving the generator). The deterministic fills
/// (`zeros_`, `ones_`, `constant_`) still run. Applies to this thread only; nests.
pub fn no_init_weights<R>(build: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SKIP_RANDOM.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SKIP_RANDOM.with(|s| s.replace(true)));
    build()
}

/// Whether this thread is inside [`no_init_weights`].
pub fn is_init_skipped() -> bool {
    SKIP_RANDOM.with(Cell::get)
}

/// Which fan `kaiming_*` scales by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FanMode {
    /// Preserves the variance of activations in the forward pass (PyTorch's default).
    #[default]
    FanIn,
    /// Preserves the variance of gradients in the backward pass.
    FanOut,
}

/// The nonlinearity a layer feeds, for [`calculate_gain`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Nonlinearity {
    Linear,
    Conv,
    Sigmoid,
    Tanh,
    Relu,
    /// With its negative slope.
    LeakyRelu(f64),
    Selu,
}

/// The recommended gain for `nonlinearity` (`torch.nn.init.calculate_gain`).
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Conv | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight: `dims[1] * receptive` and `dims[0] * receptive`, where the
/// receptive field is the product of the dims after the first two (a conv kernel's size).
pub fn calculate_fan_in_and_fan_out(dims: &[usize]) -> (usize, usize) {
    assert!(
        dims.len() >= 2,
        "calculate_fan_in_and_fan_out: fan in and fan out need a tensor of at least 2 dims, got shape {dims:?}"
    );
    let receptive: usize = dims[2..].iter().product();
    (dims[1] * receptive, dims[0] * receptive)
}

fn fan(dims: &[usize], mode: FanMode) -> usize {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(dims);
    match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    }
}

fn expect_float(op: &str, t: &Tensor) {
    assert!(
        t.dtype().is_float(),
        "{op}: expected a floating-point tensor, got {} with shape {:?}",
        t.dtype(),
        t.dims()
    );
}

/// Fills with samples of U(low, high) (`nn.init.uniform_`).
pub fn uniform_(t: &Tensor, low: f64, high: f64, gen: Option<&mut Generator>) {
    expect_float("uniform_", t);
    if is_init_skipped() {
        return;
    }
    let values = match gen {
        Some(g) => Distribution::Uniform { low, high }.sample_with(g, t.dims(), t.dtype(), t.device()),
        None => Tensor::uniform(t.dims(), low..high, t.dtype(), t.device()),
    };
    t.copy_(&values.expect("random values on the tensor's own device"));
}

/// Fills with samples of N(mean, std^2) (`nn.init.normal_`).
pub fn normal_(t: &Tensor, mean: f64, std: f64, gen: Option<&mut Generator>) {
    expect_float("normal_", t);
    if is_init_skipped() {
        return;
    }
    let values = match gen {
        Some(g) => Distribution::Normal { mean, std }.sample_with(g, t.dims(), t.dtype(), t.device()),
        None => Tensor::normal(t.dims(), mean, std, t.dtype(), t.device()),
    };
    t.copy_(&values.expect("random values on the tensor's own device"));
}

/// Fills with `value` (`nn.init.constant_`).
pub fn constant_(t: &Tensor, value: f64) {
    t.fill_(value);
}

/// Fills with zeros (`nn.init.zeros_`).
pub fn zeros_(t: &Tensor) {
    t.fill_(0.0);
}

/// Fills with ones (`nn.init.ones_`).
pub fn ones_(t: &Tensor) {
    t.fill_(1.0);
}

/// He initialisation, uniform (`nn.init.kaiming_uniform_`): U(-b, b) with
/// `b = gain * sqrt(3 / fan)`. PyTorch's Linear and Conv2d use `a = sqrt(5)` with
/// `LeakyRelu`, which gives `b = 1 / sqrt(fan_in)`.
pub fn kaiming_uniform_(t: &Tensor, mode: FanMode, nonlinearity: Nonlinearity, gen: Option<&mut Generator>) {
    let std = calculate_gain(nonlinearity) / (fan(t.dims(), mode) as f64).sqrt();
    let bound = 3f64.sqrt() * std;
    uniform_(t, -bound, bound, gen);
}

/// He initialisation, normal (`nn.init.kaiming_normal_`): N(0, std^2) with
/// `std = gain / sqrt(fan)`; torchvision's ResNet uses `FanOut` with `Relu`.
pub fn kaiming_normal_(t: &Tensor, mode: FanMode, nonlinearity: Nonlinearity, gen: Option<&mut Generator>) {
    let std = calculate_gain(nonlinearity) / (fan(t.dims(), mode) as f64).sqrt();
    normal_(t, 0.0, std, gen);
}

/// Glorot initialisation, uniform (`nn.init.xavier_uniform_`): U(-a, a) with
/// `a = gain * sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform_(t: &Tensor, gain: f64, gen: Option<&mut Generator>) {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t.dims());
    let a = gain * (6.0 / (fan_in + fan_out) as f64).sqrt();
    uniform_(t, -a, a, gen);
}

/// Glorot initialisation, normal (`nn.init.xavier_normal_`): N(0, std^2) with
/// `std = gain * sqrt(2 / (fan_in + fan_out))`.
pub fn xavier_normal_(t: &Tensor, gain: f64, gen: Option<&mut Generator>) {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t.dims());
    normal_(t, 0.0, gain * (2.0 / (fan_in + fan_out) as f64).sqrt(), gen);
}

/// The default initialisation of `nn.Linear` and `nn.ConvNd` weights:
/// `kaiming_uniform_(w, a = sqrt(5))`, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn default_weight_(t: &Tensor, gen: Option<&mut Generator>) {
    kaiming_uniform_(t, FanMode::FanIn, Nonlinearity::LeakyRelu(5f64.sqrt()), gen);
}

/// The default initialisation of `nn.Linear` and `nn.ConvNd` biases: U(-b, b) with
/// `b = 1 / sqrt(fan_in)` of the layer's weight (`weight_dims`), or zeros when fan_in is 0.
pub fn default_bias_(bias: &Tensor, weight_dims: &[usize], gen: Option<&mut Generator>) {
    let (fan_in, _) = calculate_fan_in_and_fan_out(weight_dims);
    let bound = if fan_in > 0 { 1.0 / (fan_in as f64).sqrt() } else { 0.0 };
    uniform_(bias, -bound, bound, gen);
}

#[cfg(test)]
mod tests;
