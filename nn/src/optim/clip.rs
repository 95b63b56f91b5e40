//! Gradient clipping (`torch.nn.utils.clip_grad_norm_`, `clip_grad_value_`).

use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Tensor};

/// Scales all gradients together so that their global `norm_type`-norm (2.0, any p > 0, or
/// `f64::INFINITY`) is at most `max_norm`, as `torch.nn.utils.clip_grad_norm_`:
/// `g *= min(1, max_norm / (total + 1e-6))`. Returns the total norm before clipping as an f32
/// rank-0 tensor on the gradients' device; nothing is read back to the host, so no sync (call
/// `.item()` when you want the number). Parameters without a gradient are skipped; with no
/// gradients at all the norm is 0.
pub fn clip_grad_norm_(params: &[Var], max_norm: f64, norm_type: f64) -> Tensor {
    let total = total_grad_norm(params, norm_type);
    let coef = total.add_scalar(1e-6).recip().mul_scalar(max_norm).clamp(f64::NEG_INFINITY, 1.0);
    for g in params.iter().filter_map(Var::grad) {
        g.mul_(&coef.to_dtype(g.dtype()));
    }
    total
}

/// The global `norm_type`-norm of all gradients, as if they were one vector
/// (`torch.nn.utils.get_total_norm`): an f32 rank-0 tensor on the gradients' device, nothing
/// read back to the host. Parameters without a gradient are skipped; with none the norm is 0.
pub fn total_grad_norm(params: &[Var], norm_type: f64) -> Tensor {
    let op = "total_grad_norm";
    assert!(norm_type > 0.0, "{op}: norm_type must be positive (or infinity), got {norm_type}");
    let grads: Vec<Tensor> = params.iter().filter_map(Var::grad).collect();
    let Some(first) = grads.first() else {
        return Tensor::zeros(
            (),
            DType::F32,
            params.first().map_or(oxtrain_tensor::Device::Cpu, Var::device),
        )
        .expect("a scalar");
    };
    let device = first.device();
    // One partial per gradient, each a rank-0 f32 tensor, combined on the device.
    let partials: Vec<Tensor> = grads
        .iter()
        .map(|g| {
            assert!(
                g.device() == device,
                "{op}: gradients are on different devices ({} and {device})",
                g.device()
            );
            let a = g.to_dtype(DType::F32).abs();
            if norm_type.is_infinite() {
                a.max_all()
            } else if norm_type == 2.0 {
                a.square().sum_all()
            } else if norm_type == 1.0 {
                a.sum_all()
            } else {
                a.powf(norm_type).sum_all()
            }
        })
        .collect();
    let stacked = Tensor::stack(&partials, 0);
    if norm_type.is_infinite() {
        stacked.max_all()
    } else if norm_type == 2.0 {
        stacked.sum_all().sqrt()
    } else if norm_type == 1.0 {
        stacked.sum_all()
    } else {
        stacked.sum_all().powf(1.0 / norm_type)
    }
}

/// Clamps every gradient into `[-clip_value, clip_value]` in place
/// (`torch.nn.utils.clip_grad_value_`).
pub fn clip_grad_value_(params: &[Var], clip_value: f64) {
    assert!(clip_value >= 0.0, "clip_grad_value_: clip_value must be non-negative, got {clip_value}");
    for g in params.iter().filter_map(Var::grad) {
        g.copy_(&g.clamp(-clip_value, clip_value));
    }
}
