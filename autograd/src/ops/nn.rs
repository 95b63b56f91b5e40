//! Gradients of the neural-network primitives: `conv2d`, max and average pooling (sliding and
//! adaptive), `layer_norm` and `batch_norm`. Convolution and pooling use the tensor crate's
//! backward kernels; the norms' gradients are composed from tensor ops.

use crate::Var;
use oxtrain_tensor::{Shape, Tensor};

/// The normalisation's input gradient: `rstd * (gy - mean(gy) - xhat * mean(gy * xhat))` over
/// `dims`, where `gy` is the gradient of the normalised value `xhat`.
fn normalized_grad(gy: &Tensor, xhat: &Tensor, rstd: &Tensor, dims: &[usize]) -> Tensor {
    let mean_gy = gy.mean(dims, true);
    let mean_gy_xhat = gy.mul(xhat).mean(dims, true);
    rstd.mul(&gy.sub(&mean_gy).sub(&xhat.mul(&mean_gy_xhat)))
}

/// Sums `t` over `dims`; an empty list sums nothing (unlike `Tensor::sum`).
fn sum_over(t: &Tensor, dims: &[usize]) -> Tensor {
    if dims.is_empty() {
        t.clone()
    } else {
        t.sum(dims, false)
    }
}

impl Var {
    /// 2-D convolution of `[N, C, H, W]` with a weight `[O, C/groups, KH, KW]` and an optional
    /// bias `[O]`, as `F.conv2d`.
    pub fn conv2d(
        &self,
        weight: &Var,
        bias: Option<&Var>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Var {
        if crate::autocast_dtype().is_some() {
            let (x, w, b) = (self.autocast_lower(), weight.autocast_lower(), bias.map(Var::autocast_lower));
            return crate::autocast_disabled(|| x.conv2d(&w, b.as_ref(), stride, padding, dilation, groups));
        }
        let out =
            self.tensor().conv2d(weight.tensor(), bias.map(Var::tensor), stride, padding, dilation, groups);
        let (x, w) = (self.tensor().clone(), weight.tensor().clone());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Var::from_op("conv2d", out, &inputs, move |g, needs| {
            let x_shape = [x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]];
            let w_shape = [w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]];
            let mut grads = vec![
                needs[0].then(|| {
                    Tensor::conv2d_backward_input(g, &w, x_shape, stride, padding, dilation, groups)
                }),
                needs[1].then(|| {
                    Tensor::conv2d_backward_weight(g, &x, w_shape, stride, padding, dilation, groups)
                }),
            ];
            if needs.len() == 3 {
                grads.push(needs[2].then(|| g.sum([0, 2, 3], false)));
            }
            grads
        })
    }

    /// Max pooling, as `F.max_pool2d`; the gradient goes to each window's (first) maximum.
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Var {
        let (out, indices) = self.tensor().max_pool2d(kernel, stride, padding, dilation, ceil_mode);
        self.max_pool_var("max_pool2d", out, indices)
    }

    /// Max pooling over PyTorch's adaptive windows, as `F.adaptive_max_pool2d`.
    pub fn adaptive_max_pool2d(&self, output_size: [usize; 2]) -> Var {
        let (out, indices) = self.tensor().adaptive_max_pool2d(output_size);
        self.max_pool_var("adaptive_max_pool2d", out, indices)
    }

    fn max_pool_var(&self, name: &'static str, out: Tensor, indices: Tensor) -> Var {
        let input = Shape::from(self.dims());
        Var::from_op(name, out, &[self], move |g, _| vec![Some(g.max_pool2d_backward(&indices, &input))])
    }

    /// Average pooling, as `F.avg_pool2d`.
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: Option<usize>,
    ) -> Var {
        let out =
            self.tensor().avg_pool2d(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
        let input = Shape::from(self.dims());
        Var::from_op("avg_pool2d", out, &[self], move |g, _| {
            vec![Some(g.avg_pool2d_backward(
                &input,
                kernel,
                stride,
                padding,
                ceil_mode,
                count_include_pad,
                divisor_override,
            ))]
        })
    }

    /// Average pooling over PyTorch's adaptive windows, as `F.adaptive_avg_pool2d`.
    pub fn adaptive_avg_pool2d(&self, output_size: [usize; 2]) -> Var {
        let out = self.tensor().adaptive_avg_pool2d(output_size);
        let input = Shape::from(self.dims());
        Var::from_op("adaptive_avg_pool2d", out, &[self], move |g, _| {
            vec![Some(g.adaptive_avg_pool2d_backward(&input))]
        })
    }

    /// Layer norm over the trailing dims `normalized_shape`, as `F.layer_norm`.
    pub fn layer_norm(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Var {
        if crate::autocast_dtype().is_some() {
            let (x, w, b) = (self.autocast_f32(), weight.map(Var::autocast_f32), bias.map(Var::autocast_f32));
            return crate::autocast_disabled(|| x.layer_norm(normalized_shape, w.as_ref(), b.as_ref(), eps));
        }
        let normalized = normalized_shape.into();
        let x = self.tensor().clone();
        let (out, mean, rstd) =
            x.layer_norm(&normalized, weight.map(Var::tensor), bias.map(Var::tensor), eps);
        let axis = x.rank() - normalized.rank();
        let (mean, rstd) = (mean.to_dtype(x.dtype()), rstd.to_dtype(x.dtype()));
        let w = weight.map(|w| w.tensor().clone());
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        Var::from_op("layer_norm", out, &inputs, move |g, needs| {
            let xhat = x.sub(&mean).mul(&rstd);
            let gy = match &w {
                Some(w) => g.mul(&w.to_dtype(g.dtype())),
                None => g.clone(),
            };
            let norm_dims: Vec<usize> = (axis..x.rank()).collect();
            let lead: Vec<usize> = (0..axis).collect();
            let mut grads = vec![needs[0].then(|| normalized_grad(&gy, &xhat, &rstd, &norm_dims))];
            if has_weight {
                grads.push(needs[1].then(|| sum_over(&g.mul(&xhat), &lead)));
            }
            if needs.len() > grads.len() {
                grads.push(needs[grads.len()].then(|| sum_over(g, &lead)));
            }
            grads
        })
    }

    /// Batch norm in training mode over dim 1 of `[N, C, ...]`, normalising with the batch's
    /// statistics. Returns the output and the batch's mean and biased variance (constants, for
    /// the running statistics).
    pub fn batch_norm_training(
        &self,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Tensor, Tensor) {
        let x = self.tensor().clone();
        let (out, mean, var) = x.batch_norm_training(weight.map(Var::tensor), bias.map(Var::tensor), eps);
        let channel_shape = per_channel_shape(x.dims());
        let mean_b = mean.to_dtype(x.dtype()).reshape(channel_shape.as_slice());
        let rstd_b = var.to_dtype(x.dtype()).add_scalar(eps).rsqrt().reshape(channel_shape.as_slice());
        let w = weight.map(|w| w.tensor().to_dtype(x.dtype()).reshape(channel_shape.as_slice()));
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let var_out = Var::from_op("batch_norm", out, &inputs, move |g, needs| {
            let dims: Vec<usize> = (0..x.rank()).filter(|&d| d != 1).collect();
            let xhat = x.sub(&mean_b).mul(&rstd_b);
            let gy = match &w {
                Some(w) => g.mul(w),
                None => g.clone(),
            };
            let mut grads = vec![needs[0].then(|| normalized_grad(&gy, &xhat, &rstd_b, &dims))];
            if has_weight {
                grads.push(needs[1].then(|| g.mul(&xhat).sum(dims.as_slice(), false)));
            }
            if needs.len() > grads.len() {
                grads.push(needs[grads.len()].then(|| g.sum(dims.as_slice(), false)));
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
