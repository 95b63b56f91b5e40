//! NaN and inf in a step: the loss of a micro-batch, then the gradients before the optimizer
//! step. `train.on_nonfinite` says whether the step is skipped (at most `train.max_skipped`
//! times) or the run stops. "skip" must decide before the update, so it reads the loss and a
//! gradient flag at every step (a host read each, which stops a GPU's queue) and names the
//! first bad tensor; "stop" decides from the same values read with the loss window
//! ([`super::window`]) at the logging interval and names the first bad step.
//!
//! Under DDP a non-finite loss on one rank does not skip that rank's backward: the other ranks
//! would wait in the all-reduce for a rank that never comes. The NaN flows into the all-reduced
//! gradients instead, every rank sees the same non-finite gradient, and every rank takes the
//! same decision at the gradient check.

use super::TrainError;
use crate::config::{Config, NonFinite};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Tensor};

/// What the loop does with the step.
#[derive(Debug)]
pub enum Verdict {
    /// Everything is finite: go on.
    Go,
    /// Leave this step's update out; print the message.
    Skip(String),
    /// End the run with the error.
    Stop(TrainError),
}

/// The policy and the count of skipped steps.
pub struct NonFiniteGuard {
    policy: NonFinite,
    max_skipped: usize,
    /// One rank of several: losses defer to the (all-reduced) gradients.
    defer_losses: bool,
    /// The f16 loss scaler is on: it skips overflowing steps itself and lowers the scale,
    /// which is the intended way for inf gradients to go away.
    scaler_handles_gradients: bool,
    pub skipped: usize,
}

impl NonFiniteGuard {
    pub fn new(config: &Config, world_size: usize, scaler_enabled: bool) -> NonFiniteGuard {
        NonFiniteGuard {
            policy: config.train.on_nonfinite,
            max_skipped: config.train.max_skipped,
            defer_losses: world_size > 1,
            scaler_handles_gradients: scaler_enabled,
            skipped: 0,
        }
    }

    /// The loss of a micro-batch of optimizer step `step` (1-based).
    pub fn loss(&mut self, value: f64, step: usize, epoch: usize, params: &[(String, Var)]) -> Verdict {
        if value.is_finite() || self.defer_losses {
            return Verdict::Go;
        }
        let first = match first_nonfinite(params.iter().map(|(n, v)| (n, Some(v.tensor().clone())))) {
            Some((name, what)) => format!("the first bad tensor is parameter `{name}`, which holds {what}"),
            None => {
                "every parameter is finite, so it arose in this batch's forward pass (check the data)".into()
            }
        };
        self.decide(format!("the loss is {value}"), step, epoch, &first)
    }

    /// The gradients of optimizer step `step`, after backward (and DDP's all-reduce).
    pub fn gradients(&mut self, step: usize, epoch: usize, params: &[(String, Var)]) -> Verdict {
        if self.scaler_handles_gradients {
            return Verdict::Go;
        }
        // One flag over every gradient and one read back; only a bad step pays for the search.
        if all_finite(params.iter().filter_map(|(_, v)| v.grad())) {
            return Verdict::Go;
        }
        let grads = params.iter().map(|(n, v)| (n, v.grad()));
        let bad = grads.clone().filter(|(_, g)| g.as_ref().is_some_and(|g| !all_finite([g.clone()]))).count();
        let (name, what) = first_nonfinite(grads).expect("the flag saw a non-finite gradient");
        let others = match bad {
            1 => String::new(),
            n => format!(" ({} other parameters' gradients are non-finite too)", n - 1),
        };
        let first = format!("the first bad tensor is the gradient of parameter `{name}`{others}");
        self.decide(format!("a gradient is {what}"), step, epoch, &first)
    }

    /// Whether this guard decides before each optimizer step ("skip", which reads the loss
    /// and the gradient flag at every step) or where the loss window is read ("stop").
    pub fn checks_every_step(&self) -> bool {
        self.policy == NonFinite::Skip
    }

    /// Whether a bad loss decides, or only the (all-reduced) gradients, as under DDP.
    pub fn judges_losses(&self) -> bool {
        !self.defer_losses
    }

    /// The finiteness flag of the gradients on the device (no read): `sum(g * 0)` over every
    /// gradient, NaN when one holds a NaN or inf; `None` when the loss scaler handles them.
    pub fn gradient_flag(&self, params: &[(String, Var)]) -> Option<Tensor> {
        if self.scaler_handles_gradients {
            return None;
        }
        finite_flag(params.iter().filter_map(|(_, v)| v.grad()))
    }

    /// The stop for a bad step found where the loss window was read at step `read_at`.
    pub(crate) fn stop_at(&self, bad: super::window::BadStep, read_at: usize) -> TrainError {
        let when = match read_at == bad.step {
            true => String::new(),
            false => format!(
                " (found when the losses were read at step {read_at}: train.on_nonfinite = \"skip\" checks \
                 before every update, at the cost of a host read per step)"
            ),
        };
        TrainError::NonFinite {
            what: bad.what,
            step: bad.step,
            epoch: bad.epoch,
            advice: format!(
                "stopping (train.on_nonfinite = \"stop\"){when}. A lower optim.lr, train.clip_grad_norm or \
                 precision.dtype = \"f32\" usually helps, or set train.on_nonfinite = \"skip\""
            ),
        }
    }

    fn decide(&mut self, what: String, step: usize, epoch: usize, first: &str) -> Verdict {
        let stop =
            |advice: String| Verdict::Stop(TrainError::NonFinite { what: what.clone(), step, epoch, advice });
        match self.policy {
            NonFinite::Stop => stop(format!(
                "stopping (train.on_nonfinite = \"stop\"); {first}. A lower optim.lr, train.clip_grad_norm or \
                 precision.dtype = \"f32\" usually helps, or set train.on_nonfinite = \"skip\""
            )),
            NonFinite::Skip if self.skipped + 1 > self.max_skipped => stop(format!(
                "stopping: more than train.max_skipped steps were skipped ({}); {first}. Lower optim.lr",
                self.max_skipped
            )),
            NonFinite::Skip => {
                self.skipped += 1;
                Verdict::Skip(format!(
                    "step {step}: {what}; {first}; skipping this update ({} skipped so far)",
                    self.skipped
                ))
            }
        }
    }
}

/// Whether every element of every tensor is finite: `sum(t * 0)` is 0 for finite values and
/// NaN as soon as one is NaN or inf (GradScaler's test), summed on the device, read once.
fn all_finite(tensors: impl IntoIterator<Item = Tensor>) -> bool {
    finite_flag(tensors).is_none_or(|f| f.item().is_finite())
}

/// `sum(t * 0)` over `tensors`, on the first one's device: 0, or NaN when one is not finite.
fn finite_flag(tensors: impl IntoIterator<Item = Tensor>) -> Option<Tensor> {
    let mut flag: Option<Tensor> = None;
    for t in tensors {
        let f = t.mul_scalar(0.0).to_dtype(DType::F32).sum_all();
        flag = Some(match flag {
            Some(acc) if acc.device() == f.device() => acc.add(&f),
            Some(acc) => acc.add(&f.to_device(acc.device()).expect("moving a finiteness flag")),
            None => f,
        });
    }
    flag
}

/// The first named tensor holding a NaN or inf, and which ("NaN", "inf", "-inf").
fn first_nonfinite<'a>(
    tensors: impl Iterator<Item = (&'a String, Option<Tensor>)>,
) -> Option<(&'a str, &'static str)> {
    for (name, t) in tensors {
        let Some(t) = t else { continue };
        if all_finite([t.clone()]) {
            continue;
        }
        let values = t.to_dtype(DType::F64).to_vec::<f64>();
        let what = match values.iter().find(|v| !v.is_finite()) {
            Some(v) if v.is_nan() => "NaN",
            Some(v) if *v > 0.0 => "inf",
            _ => "-inf",
        };
        return Some((name.as_str(), what));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxtrain_tensor::Device;

    fn param(values: Vec<f32>, grad: Option<Vec<f32>>) -> Var {
        let n = values.len();
        let v = Var::parameter(Tensor::from_vec(values, [n], Device::Cpu).unwrap());
        if let Some(g) = grad {
            v.set_grad(Some(Tensor::from_vec(g, [n], Device::Cpu).unwrap()));
        }
        v
    }

    fn guard(policy: NonFinite, world: usize) -> NonFiniteGuard {
        let mut config = Config::default();
        config.train.on_nonfinite = policy;
        config.train.max_skipped = 1;
        NonFiniteGuard::new(&config, world, false)
    }

    #[test]
    fn the_first_bad_gradient_is_named_and_the_step_skipped_or_stopped() {
        let params = vec![
            ("fc1.weight".to_string(), param(vec![1.0, 2.0], Some(vec![0.5, 0.5]))),
            ("fc2.weight".to_string(), param(vec![1.0], Some(vec![f32::INFINITY]))),
            ("fc2.bias".to_string(), param(vec![1.0], Some(vec![f32::NAN]))),
        ];
        let mut g = guard(NonFinite::Skip, 1);
        let Verdict::Skip(msg) = g.gradients(7, 2, &params) else { panic!("a skip") };
        assert!(msg.starts_with("step 7: a gradient is inf;"), "{msg}");
        assert!(msg.contains("gradient of parameter `fc2.weight` (1 other parameters'"), "{msg}");
        // max_skipped = 1: the second bad step stops the run.
        let Verdict::Stop(e) = g.gradients(8, 2, &params) else { panic!("a stop") };
        let msg = e.to_string();
        assert!(msg.contains("a gradient is inf at step 8 (epoch 2); stopping: more than"), "{msg}");
        let Verdict::Stop(e) = guard(NonFinite::Stop, 1).gradients(1, 1, &params) else { panic!("a stop") };
        assert!(e.to_string().contains("train.on_nonfinite = \"stop\""), "{e}");
        // Finite gradients and missing ones pass.
        let fine = vec![
            ("a".to_string(), param(vec![1.0], Some(vec![3.0]))),
            ("b".to_string(), param(vec![1.0], None)),
        ];
        assert!(matches!(guard(NonFinite::Stop, 1).gradients(1, 1, &fine), Verdict::Go));
    }

    #[test]
    fn a_bad_loss_names_the_first_bad_parameter_or_the_forward_pass() {
        let params = vec![
            ("conv.weight".to_string(), param(vec![1.0, 2.0], None)),
            ("fc.bias".to_string(), param(vec![f32::NEG_INFINITY, 0.0], None)),
        ];
        let Verdict::Stop(e) = guard(NonFinite::Stop, 1).loss(f64::NAN, 3, 1, &params) else { panic!() };
        let msg = e.to_string();
        assert!(msg.contains("the loss is NaN at step 3 (epoch 1); stopping"), "{msg}");
        assert!(msg.contains("parameter `fc.bias`, which holds -inf"), "{msg}");
        let Verdict::Skip(msg) = guard(NonFinite::Skip, 1).loss(f64::INFINITY, 3, 1, &params[..1]) else {
            panic!()
        };
        assert!(msg.contains("the loss is inf") && msg.contains("forward pass"), "{msg}");
        // Under DDP the loss defers to the all-reduced gradients.
        assert!(matches!(guard(NonFinite::Stop, 2).loss(f64::NAN, 3, 1, &params), Verdict::Go));
        assert!(matches!(guard(NonFinite::Stop, 1).loss(0.5, 3, 1, &params), Verdict::Go));
    }
}
