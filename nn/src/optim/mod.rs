//! Optimizers (`torch.optim`): [`Sgd`], [`AdamW`], [`Lars`], the [`Optimizer`] trait they share,
//! parameter groups, gradient clipping and state save/restore.
//!
//! Each optimizer holds parameter groups (a list of parameters with their own hyper-parameters,
//! as `optimizer.param_groups` in PyTorch) and per-parameter state (momentum buffers, moments)
//! numbered by the parameter's position over all groups, as PyTorch's `state_dict` does.
//! SGD and AdamW update each parameter with one fused kernel (`Tensor::sgd_step_`,
//! `Tensor::adamw_step_`); their state is f32 (master) whatever the parameter's dtype.

mod adamw;
pub mod clip;
mod groups;
mod lars;
mod sgd;
mod state;
#[cfg(test)]
mod tests;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_grad_norm_, clip_grad_value_, total_grad_norm};
pub use groups::{decay_groups, IntoParamGroups, ParamGroup, ParamGroupSpec};
pub use lars::{Lars, LarsConfig};
pub use sgd::{Sgd, SgdConfig};
pub use state::{OptimizerState, ParamGroupState};

use oxtrain_autograd::Var;

/// What every optimizer offers a training loop and an LR scheduler (`torch.optim.Optimizer`).
pub trait Optimizer {
    /// Updates every parameter that has a gradient; parameters without one are skipped.
    fn step(&mut self);

    /// The parameters of all groups, in order (the numbering of the state).
    fn params(&self) -> Vec<Var>;

    /// Drops every gradient (`zero_grad(set_to_none=True)`, PyTorch's default): the next
    /// backward writes fresh gradients instead of adding to zeros.
    fn zero_grad(&mut self) {
        for p in self.params() {
            p.zero_grad();
        }
    }

    fn num_groups(&self) -> usize;

    /// The learning rate of group `group`.
    fn lr(&self, group: usize) -> f64;

    fn set_group_lr(&mut self, group: usize, lr: f64);

    /// Sets every group's learning rate.
    fn set_lr(&mut self, lr: f64) {
        for g in 0..self.num_groups() {
            self.set_group_lr(g, lr);
        }
    }

    /// The learning rate a scheduler started from (`group["initial_lr"]`), once one has.
    fn initial_lr(&self, group: usize) -> Option<f64>;

    fn set_initial_lr(&mut self, group: usize, lr: f64);

    /// Hyper-parameters and state as named tensors, for checkpoints.
    fn state_dict(&self) -> OptimizerState;

    /// [`Optimizer::state_dict`] without the copies: its tensors share storage with the
    /// optimizer's buffers, so the next step changes them. For a caller that copies them at
    /// once into memory of its own (a checkpoint's reused host buffers).
    fn state_dict_shared(&self) -> OptimizerState {
        self.state_dict()
    }

    /// Restores what [`Optimizer::state_dict`] saved, onto this optimizer's parameters (their
    /// devices). Fails, changing nothing, when the groups or shapes do not match.
    fn load_state_dict(&mut self, state: &OptimizerState) -> oxtrain_tensor::Result<()>;

    /// For an optimizer over slices of parameters (ZeRO-1): the L2 norms (weight, gradient) of
    /// the whole parameter each of its parameters is a slice of, in [`Optimizer::params`]
    /// order, for the next step only. True when the optimizer uses them (LARS's trust ratio);
    /// element-wise optimizers need no norms and return false.
    fn set_whole_parameter_norms(
        &mut self,
        _norms: Vec<(oxtrain_tensor::Tensor, oxtrain_tensor::Tensor)>,
    ) -> bool {
        false
    }

    /// The optimizer as `Any`, for a caller that knows a wrapper's concrete type (the trainer
    /// reaches ZeRO-1's sharded checkpoints so). None where an optimizer does not offer it.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

/// A boxed optimizer is one (`Box<dyn Optimizer>` where the optimizer is picked at run time,
/// wrapped by a generic one such as ZeRO's).
impl<O: Optimizer + ?Sized> Optimizer for Box<O> {
    fn step(&mut self) {
        (**self).step()
    }
    fn params(&self) -> Vec<Var> {
        (**self).params()
    }
    fn zero_grad(&mut self) {
        (**self).zero_grad()
    }
    fn num_groups(&self) -> usize {
        (**self).num_groups()
    }
    fn lr(&self, group: usize) -> f64 {
        (**self).lr(group)
    }
    fn set_group_lr(&mut self, group: usize, lr: f64) {
        (**self).set_group_lr(group, lr)
    }
    fn set_lr(&mut self, lr: f64) {
        (**self).set_lr(lr)
    }
    fn initial_lr(&self, group: usize) -> Option<f64> {
        (**self).initial_lr(group)
    }
    fn set_initial_lr(&mut self, group: usize, lr: f64) {
        (**self).set_initial_lr(group, lr)
    }
    fn state_dict(&self) -> OptimizerState {
        (**self).state_dict()
    }
    fn state_dict_shared(&self) -> OptimizerState {
        (**self).state_dict_shared()
    }
    fn load_state_dict(&mut self, state: &OptimizerState) -> oxtrain_tensor::Result<()> {
        (**self).load_state_dict(state)
    }
    fn set_whole_parameter_norms(
        &mut self,
        norms: Vec<(oxtrain_tensor::Tensor, oxtrain_tensor::Tensor)>,
    ) -> bool {
        (**self).set_whole_parameter_norms(norms)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        (**self).as_any()
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        (**self).as_any_mut()
    }
}

/// Implements the bookkeeping part of [`Optimizer`] for a type with `held: groups::Groups<C>`,
/// and its `param_groups` accessors; the type provides
/// `fn update(&mut self)`.
macro_rules! impl_optimizer {
    ($ty:ty, $config:ty) => {
        $crate::optim::impl_optimizer!($ty, $config, {});
    };
    ($ty:ty, $config:ty, { $($extra:tt)* }) => {
        impl $ty {
            pub fn param_groups(&self) -> &[$crate::optim::ParamGroup<$config>] {
                &self.held.groups
            }

            /// The groups, to change hyper-parameters between steps
            /// (`opt.param_groups[i]["lr"] = ..`).
            pub fn param_groups_mut(&mut self) -> &mut [$crate::optim::ParamGroup<$config>] {
                &mut self.held.groups
            }
        }

        impl $crate::optim::Optimizer for $ty {
            fn step(&mut self) {
                oxtrain_autograd::no_grad(|| self.update())
            }
            fn params(&self) -> Vec<oxtrain_autograd::Var> {
                self.held.groups.iter().flat_map(|g| g.params.iter().cloned()).collect()
            }
            fn num_groups(&self) -> usize {
                self.held.groups.len()
            }
            fn lr(&self, group: usize) -> f64 {
                self.held.groups[group].config.lr
            }
            fn set_group_lr(&mut self, group: usize, lr: f64) {
                self.held.groups[group].config.lr = lr;
            }
            fn initial_lr(&self, group: usize) -> Option<f64> {
                self.held.groups[group].initial_lr
            }
            fn set_initial_lr(&mut self, group: usize, lr: f64) {
                self.held.groups[group].initial_lr = Some(lr);
            }
            fn state_dict(&self) -> $crate::optim::OptimizerState {
                self.held.state.to_state(&self.held.groups, false)
            }
            fn state_dict_shared(&self) -> $crate::optim::OptimizerState {
                self.held.state.to_state(&self.held.groups, true)
            }
            fn load_state_dict(
                &mut self,
                state: &$crate::optim::OptimizerState,
            ) -> oxtrain_tensor::Result<()> {
                self.held.state.load(&mut self.held.groups, state)
            }
            $($extra)*
        }
    };
}
pub(crate) use impl_optimizer;
