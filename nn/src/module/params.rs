//! `Parameter` and `Buffer`: the named state a module owns.
//!
//! Both hold their value behind a lock so that whole-model operations that must swap the
//! value for a new one (`to_device`, `to_dtype`) work through `&self`, like everything else on
//! a module (modules are shared between threads by DDP). Everyday updates (optimizer steps,
//! running statistics, `load_state_dict`) do not swap anything: they write into the existing
//! storage with `Tensor::copy_`, so every clone of the `Var` sees them.
//!
//! A parameter's value may also be on its way (ZeRO-1 all-gathers the updated parameters while
//! the next forward starts): its [`ValueGate`] is then armed, and reading the value waits for it.

use super::gate::ValueGate;
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::{Arc, PoisonError, RwLock};

/// A learnable tensor of a module (`nn.Parameter`): a `Var` leaf that collects a gradient.
pub struct Parameter {
    var: RwLock<Var>,
    /// Passed before every read of the value ([`Parameter::var`], [`Parameter::tensor`]).
    gate: Arc<ValueGate>,
}

impl Parameter {
    /// A new leaf that requires grad; `tensor` must be floating-point.
    pub fn new(tensor: Tensor) -> Parameter {
        Parameter::wrap(Var::parameter(tensor))
    }

    fn wrap(var: Var) -> Parameter {
        Parameter { var: RwLock::new(var), gate: Arc::new(ValueGate::new()) }
    }

    /// Wraps an existing parameter `Var`, e.g. to tie one weight into two modules (GPT-2's
    /// embedding and output head). Both modules then report the same storage.
    pub fn from_var(var: Var) -> Parameter {
        assert!(
            var.requires_grad() && var.is_leaf(),
            "Parameter::from_var: expected a leaf that requires grad (made with Var::parameter), got {var:?}"
        );
        Parameter::wrap(var)
    }

    /// The parameter as a `Var` for use in a forward pass (a cheap clone sharing the leaf and
    /// its gradient). Waits first for a value still on its way (an armed [`ValueGate`]).
    pub fn var(&self) -> Var {
        self.gate.pass();
        self.current_leaf()
    }

    /// The leaf as it is, without passing the gate: for what does not depend on the value.
    fn current_leaf(&self) -> Var {
        self.var.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The gate every read of the value passes: whoever produces the value later (ZeRO-1's
    /// parameter all-gather) keeps it and arms it. A clone of the `Var` taken earlier does not
    /// pass it: read values through the module.
    pub fn gate(&self) -> &Arc<ValueGate> {
        &self.gate
    }

    /// The current value (shares storage with the parameter). Owned, where `Var::tensor`
    /// borrows: the value sits behind a lock (so `to_device` can swap it through `&self`) and a
    /// borrow could not outlive the guard; the clone is an `Arc`, as cheap as the borrow. The
    /// same holds for [`Buffer::tensor`].
    pub fn tensor(&self) -> Tensor {
        self.var().tensor().clone()
    }

    pub fn dims(&self) -> Vec<usize> {
        self.current_leaf().dims().to_vec()
    }

    /// Whether the parameter learns (`param.requires_grad`). A frozen one is left out of
    /// [`Module::named_parameters`](crate::Module::named_parameters) (so out of optimizers and
    /// DDP's buckets) and gets no gradient, but stays in the state dict.
    pub fn requires_grad(&self) -> bool {
        self.current_leaf().requires_grad()
    }

    /// Freezes (`false`) or unfreezes the parameter (`param.requires_grad_(flag)`). The value
    /// keeps its storage, so every holder of the tensor sees later loads; the leaf is new, so
    /// build optimizers after freezing, as with `to_device`.
    pub fn set_requires_grad(&self, requires_grad: bool) {
        if self.requires_grad() == requires_grad {
            return;
        }
        let tensor = self.tensor();
        self.replace(leaf(tensor, requires_grad));
    }

    /// Swaps in a new leaf (dropping the old gradient). Used by `Module::to_device` /
    /// `to_dtype`; an optimizer built before holds the old `Var`.
    pub(crate) fn replace(&self, var: Var) {
        *self.var.write().unwrap_or_else(PoisonError::into_inner) = var;
    }
}

impl std::fmt::Debug for Parameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Parameter({:?})", self.var())
    }
}

/// A leaf holding `tensor`: a parameter that learns, or a frozen one that gets no gradient but
/// still keeps its autocast copies (it is used as often as a learning one).
pub(crate) fn leaf(tensor: Tensor, requires_grad: bool) -> Var {
    if requires_grad {
        Var::parameter(tensor)
    } else {
        tensor.keep_casts();
        Var::constant(tensor)
    }
}

/// A tensor of a module's state that is not learned (`register_buffer`): BatchNorm's running
/// statistics and batch counter. Saved in the state dict after the module's parameters.
pub struct Buffer(RwLock<Tensor>);

impl Buffer {
    pub fn new(tensor: Tensor) -> Buffer {
        Buffer(RwLock::new(tensor))
    }

    /// The current value; update it in place with `copy_` so the module sees the change.
    pub fn tensor(&self) -> Tensor {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(crate) fn replace(&self, tensor: Tensor) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = tensor;
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?})", self.tensor())
    }
}

/// The value moved to `device` and, for floating-point values, converted to `dtype`.
pub(crate) fn moved(t: &Tensor, device: Device, dtype: Option<DType>) -> oxtrain_tensor::Result<Tensor> {
    let t = match dtype {
        Some(d) if t.dtype().is_float() && t.dtype() != d => t.to_dtype(d),
        _ => t.clone(),
    };
    if t.device() == device {
        Ok(t)
    } else {
        t.to_device(device)
    }
}
