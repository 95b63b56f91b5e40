//! Gradients of `batch_norm` (kernels in the tensor crate's `ops/norm`; layer norm's are in
//! `layer_norm.rs`). The training backward is the tensor crate's fused kernel
//! (`batch_norm_backward`) on either device; batch norm in eval mode composes tensor ops.

use crate::graph::sum_parts;
use crate::Var;
use oxtrain_tensor::Tensor;

impl Var {
    /// Batch norm in training mode over dim 1 of `[N, C, ...]`, normalising with the batch's
    /// statistics. Returns the output and the batch's mean and biased variance (constants, for
    /// the running statistics).
    pub fn batch_norm_training(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Tensor, Tensor) {
        self.batch_norm_training_then(weight, bias, eps, false)
    }

    /// `relu(batch_norm_training(x))` as one op: the ReLU is fused into batch norm's output
    /// pass, and the backward masks the gradient as batch norm's fused backward reads it (on
    /// CUDA for a channels-last input with the mask recomputed from x, so the output is not
    /// kept; for other CUDA inputs a separate pass). Same values as the two ops.
    pub fn batch_norm_relu_training(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Tensor, Tensor) {
        self.batch_norm_training_then(weight, bias, eps, true)
    }

    /// `relu(batch_norm_training(x) + residual)` as one op, the end of a ResNet bottleneck:
    /// one pass over the output on the CPU, and on CUDA for channels-last inputs. The backward
    /// masks the gradient with the output in batch norm's first backward pass, which writes
    /// the masked gradient: the residual's gradient.
    pub fn batch_norm_add_relu_training(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        residual: &Var,
        eps: f64,
    ) -> (Var, Tensor, Tensor) {
        let x = self.tensor().clone();
        let (w_t, b_t) = (weight.map(Var::tensor), bias.map(Var::tensor));
        let (out, mean, var) = x.batch_norm_add_relu_training(w_t, b_t, residual.tensor(), eps);
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        inputs.push(residual);
        let (saved_mean, saved_var) = (mean.clone(), var.clone());
        let w = weight.map(|w| w.tensor().clone());
        let y = out.clone();
        // The output feeds the next block twice (its first convolution and its identity), so
        // its gradient comes in two parts: the first pass adds them as it reads them.
        let var_out = Var::from_op_parts("batch_norm_add_relu", out, &inputs, move |mut parts, needs| {
            let residual_needs = needs[needs.len() - 1];
            let stats = (&saved_mean, &saved_var);
            let (dx, dw, db, masked) = if parts.len() == 2 && x.batch_norm_relu_fuses_addend() {
                let addend = parts.pop().expect("two parts");
                parts[0].batch_norm_relu_backward_plus(
                    &addend,
                    &y,
                    &x,
                    stats,
                    w.as_ref(),
                    eps,
                    needs[0],
                    residual_needs,
                )
            } else {
                let g = sum_parts(parts);
                g.batch_norm_relu_backward(&y, &x, stats, w.as_ref(), eps, needs[0], residual_needs)
            };
            let mut grads = vec![dx];
            if has_weight {
                grads.push(needs[1].then_some(dw));
            }
            if needs.len() > grads.len() + 1 {
                grads.push(needs[grads.len()].then_some(db));
            }
            grads.push(masked);
            grads
        });
        (var_out, mean, var)
    }

    fn batch_norm_training_then(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
        relu: bool,
    ) -> (Var, Tensor, Tensor) {
        let x = self.tensor().clone();
        let (w_t, b_t) = (weight.map(Var::tensor), bias.map(Var::tensor));
        // With ReLU, what its backward needs of the forward: the output, or on CUDA for a
        // channels-last input only batch norm's per-channel factors (the mask is recomputed
        // from x, so the output is freed once the next layer is done with it).
        let (out, mean, var, mask) = if relu {
            let (out, mean, var, mask) = x.batch_norm_relu_training_with_mask(w_t, b_t, eps);
            (out, mean, var, Some(mask))
        } else {
            let (out, mean, var) = x.batch_norm_training(w_t, b_t, eps);
            (out, mean, var, None)
        };
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        // The fused backward (one pass for the per-channel sums, one for dx) on either device:
        // it reads the statistics forward computed, not a recomputed x_hat.
        let (saved_mean, saved_var) = (mean.clone(), var.clone());
        let w = weight.map(|w| w.tensor().clone());
        let name = if relu { "batch_norm_relu" } else { "batch_norm" };
        let var_out = Var::from_op(name, out, &inputs, move |g, needs| {
            let stats = (&saved_mean, &saved_var);
            let (dx, dw, db) = match &mask {
                // The ReLU's mask is applied as batch norm's backward reads the gradient.
                Some(mask) => {
                    let (dx, dw, db, _) =
                        g.batch_norm_relu_backward_with(mask, &x, stats, w.as_ref(), eps, needs[0], false);
                    (dx, dw, db)
                }
                None => g.batch_norm_backward(&x, stats, w.as_ref(), eps, needs[0]),
            };
            let mut grads = vec![dx];
            if has_weight {
                grads.push(needs[1].then_some(dw));
            }
            if needs.len() > grads.len() {
                grads.push(needs[grads.len()].then_some(db));
            }
            grads
        });
        (var_out, mean, var)
    }

    /// Batch norm with given statistics (eval mode, running mean and variance), as
    /// `F.batch_norm(x, mean, var, weight, bias, training=False)`.
    pub fn batch_norm_eval(
        &self,
        mean: &Tensor,
        var: &Tensor,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Var {
        let x = self.tensor().clone();
        let out = x.batch_norm_normalize(mean, var, weight.map(Var::tensor), bias.map(Var::tensor), eps);
        let channel_shape = per_channel_shape(x.dims());
        let mean_b = mean.to_dtype(x.dtype()).reshape(channel_shape.as_slice());
        let rstd_b = var.to_dtype(x.dtype()).add_scalar(eps).rsqrt().reshape(channel_shape.as_slice());
        let w = weight.map(|w| w.tensor().to_dtype(x.dtype()).reshape(channel_shape.as_slice()));
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        Var::from_op("batch_norm", out, &inputs, move |g, needs| {
            let dims: Vec<usize> = (0..x.rank()).filter(|&d| d != 1).collect();
            let scale = match &w {
                Some(w) => rstd_b.mul(w),
                None => rstd_b.clone(),
            };
            let mut grads = vec![needs[0].then(|| g.mul(&scale))];
            if has_weight {
                grads.push(needs[1].then(|| g.mul(&x.sub(&mean_b).mul(&rstd_b)).sum(dims.as_slice(), false)));
            }
            if needs.len() > grads.len() {
                grads.push(needs[grads.len()].then(|| g.sum(dims.as_slice(), false)));
            }
            grads
        })
    }
}

/// `[1, C, 1, ...]` for an input `[N, C, ...]`: per-channel values broadcast against it.
fn per_channel_shape(dims: &[usize]) -> Vec<usize> {
    assert!(dims.len() >= 2, "batch_norm: expected an input [N, C, ...], got shape {dims:?}");
    (0..dims.len()).map(|d| if d == 1 { dims[1] } else { 1 }).collect()
}
