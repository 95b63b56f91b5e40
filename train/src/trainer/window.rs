//! The logged loss window, kept on the device: each optimizer step's loss (the mean of its
//! micro-batches) and a finiteness flag of its gradients stay tensors until the loop reads
//! them, at the logging interval or before a save, in one transfer. A steady step then makes
//! no host read: the CPU queues steps ahead of the GPU instead of waiting for each loss.
//!
//! The NaN/inf guard works from the same values: with `train.on_nonfinite = "stop"` a bad
//! step is found where the window is read and named by its own step number; the updates
//! since were applied, but the run stops without a final model. `"skip"` must decide before
//! the optimizer step, so it reads the loss and the gradient flag at every step: the cost of
//! that policy.

use oxtrain_tensor::{DType, Tensor};

/// A step of the window not yet read.
struct Pending {
    step: usize,
    epoch: usize,
    loss: Tensor,
    /// `sum(g * 0)` over the step's gradients: 0, or NaN when one is NaN or inf.
    grads: Option<Tensor>,
}

/// The first step of a window that went non-finite.
#[derive(Debug, PartialEq)]
pub(crate) struct BadStep {
    pub step: usize,
    pub epoch: usize,
    /// "the loss is NaN", "a gradient is NaN or inf".
    pub what: String,
}

#[derive(Default)]
pub(crate) struct LossWindow {
    /// This step's micro-batch losses so far, each divided by the accumulation count.
    micro: Option<Tensor>,
    pending: Vec<Pending>,
    /// The sums already read: loss over `steps` steps (restored from a checkpoint on resume).
    pub loss: f64,
    pub steps: usize,
}

impl LossWindow {
    pub fn new(loss: f64, steps: usize) -> LossWindow {
        LossWindow { loss, steps, ..LossWindow::default() }
    }

    /// Adds a micro-batch's loss (on the device, no read).
    pub fn add_micro(&mut self, loss: &Tensor, accum: usize) {
        let part = loss.to_dtype(DType::F32).mul_scalar(1.0 / accum as f64);
        self.micro = Some(match self.micro.take() {
            Some(sum) => sum.add(&part),
            None => part,
        });
    }

    /// Forgets the micro-batches of a skipped step.
    pub fn discard_step(&mut self) {
        self.micro = None;
    }

    /// Ends optimizer step `step` of `epoch` (both counted from 1).
    pub fn end_step(&mut self, step: usize, epoch: usize, grads: Option<Tensor>) {
        if let Some(loss) = self.micro.take() {
            self.pending.push(Pending { step, epoch, loss, grads });
        }
    }

    /// Reads every pending step in one transfer and adds the losses to the sums; the first
    /// non-finite step, if any (`losses`: whether a bad loss counts, or only the gradients, as
    /// under DDP where every rank must decide alike from the all-reduced gradients).
    pub fn read(&mut self, losses: bool) -> Option<BadStep> {
        if self.pending.is_empty() {
            return None;
        }
        let n = self.pending.len();
        let mut parts: Vec<Tensor> = self.pending.iter().map(|p| p.loss.reshape([1])).collect();
        let zero =
            Tensor::zeros([1], DType::F32, self.pending[0].loss.device()).expect("a scalar on the device");
        parts.extend(self.pending.iter().map(|p| p.grads.as_ref().map_or(zero.clone(), |g| g.reshape([1]))));
        let values = Tensor::cat(&parts, 0).to_f64_vec();
        let mut bad = None;
        for (i, p) in self.pending.drain(..).enumerate() {
            let (loss, grads) = (values[i], values[n + i]);
            if bad.is_none() {
                let what = if losses && !loss.is_finite() {
                    Some(format!("the loss is {loss}"))
                } else if !grads.is_finite() {
                    Some("a gradient is NaN or inf".to_string())
                } else {
                    None
                };
                bad = what.map(|what| BadStep { step: p.step, epoch: p.epoch, what });
            }
            self.loss += loss;
            self.steps += 1;
        }
        bad
    }

    /// The mean loss of the window read so far, and a fresh window.
    pub fn take_mean(&mut self) -> f64 {
        let mean = self.loss / self.steps.max(1) as f64;
        (self.loss, self.steps) = (0.0, 0);
        mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxtrain_tensor::Device;

    fn scalar(v: f32) -> Tensor {
        Tensor::from_vec(vec![v], [1], Device::Cpu).unwrap()
    }

    #[test]
    fn steps_are_read_in_one_transfer_and_the_first_bad_one_is_named() {
        let mut w = LossWindow::new(0.0, 0);
        for (step, (a, b)) in [(1.0f32, 3.0f32), (f32::NAN, 1.0), (2.0, 2.0)].into_iter().enumerate() {
            w.add_micro(&scalar(a), 2);
            w.add_micro(&scalar(b), 2);
            let grads = (step == 2).then(|| scalar(f32::INFINITY).mul_scalar(0.0));
            w.end_step(step + 1, 1, grads);
        }
        let before = oxtrain_tensor::host_reads();
        let bad = w.read(true);
        assert_eq!(oxtrain_tensor::host_reads() - before, 1, "one read for the window");
        assert_eq!(bad, Some(BadStep { step: 2, epoch: 1, what: "the loss is NaN".into() }));
        assert_eq!(w.steps, 3);

        let mut w = LossWindow::new(0.0, 0);
        for step in 1..=2 {
            w.add_micro(&scalar(f32::NAN), 1);
            w.end_step(step, 1, (step == 2).then(|| scalar(f32::NAN)));
        }
        let bad = w.read(false).expect("the gradients of step 2");
        assert_eq!((bad.step, bad.what.as_str()), (2, "a gradient is NaN or inf"), "losses ignored");

        let mut w = LossWindow::new(1.0, 1);
        w.add_micro(&scalar(5.0), 1);
        w.end_step(2, 1, None);
        assert_eq!(w.read(true), None);
        assert_eq!(w.take_mean(), 3.0);
        assert_eq!((w.loss, w.steps), (0.0, 0));
    }
}
