//! The module system: [`Module`] (named parameters, buffers and children, with PyTorch's
//! state-dict names), [`Forward`] (one input, one output, what [`Sequential`](crate::Sequential)
//! chains) and the [`Visitor`] through which a module lists what it owns.
//!
//! See [`Module`] for how to write one.

mod freeze;
mod gate;
mod params;
mod state;

pub use freeze::{freeze_matching, set_requires_grad, FreezeError};
pub use gate::{PendingValue, ValueGate};
pub use params::{Buffer, Parameter};
pub use state::{LoadError, LoadReport, ShapeMismatch};

use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a module shows of itself to [`Module::visit`]: its own parameters and buffers, and its
/// children. Names are local ("weight", "conv1", "0"); the walk joins them with dots.
pub trait Visitor {
    fn param(&mut self, name: &str, param: &Parameter);
    fn buffer(&mut self, name: &str, buffer: &Buffer);
    fn child(&mut self, name: &str, module: &dyn Module);
}

/// Whether a module is in training mode (`module.training`); starts in training mode, as
/// PyTorch modules do. An atomic, so modules stay `Sync` and `train()` works through `&self`.
#[derive(Debug)]
pub struct TrainingFlag(AtomicBool);

impl TrainingFlag {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, training: bool) {
        self.0.store(training, Ordering::Relaxed)
    }
}

impl Default for TrainingFlag {
    fn default() -> TrainingFlag {
        TrainingFlag(AtomicBool::new(true))
    }
}

/// A module with one input and one output (`nn.Module.forward(x)`); what `Sequential` chains.
pub trait Forward: Module {
    fn forward(&self, x: &Var) -> Var;
}

/// A piece of a model that owns named parameters, buffers and child modules.
///
/// Implement [`visit`](Module::visit) (and [`training_flag`](Module::training_flag) when the
/// module behaves differently in training); every other method is provided.
///
/// # Writing a module
///
/// A module is a plain struct. It implements [`Module::visit`], listing its own parameters,
/// buffers and child modules with the names PyTorch would give them, in the order PyTorch
/// registers them (the order the attributes are assigned in `__init__`):
///
/// ```
/// use oxtrain_autograd::Var;
/// use oxtrain_nn::{Forward, Linear, Module, Parameter, Visitor};
/// use oxtrain_tensor::{DType, Device, Tensor};
///
/// struct Block { fc: Linear, gain: Parameter }
///
/// impl Module for Block {
///     fn visit(&self, v: &mut dyn Visitor) {
///         v.child("fc", &self.fc);      // fc.weight, fc.bias
///         v.param("gain", &self.gain);  // gain
///     }
/// }
///
/// impl Forward for Block {
///     fn forward(&self, x: &Var) -> Var {
///         self.fc.forward(x).relu() * self.gain.var()
///     }
/// }
///
/// let block = Block {
///     fc: Linear::new(4, 4, Device::Cpu)?,
///     gain: Parameter::new(Tensor::ones(4, DType::F32, Device::Cpu)?),
/// };
/// let names: Vec<String> = block.state_dict().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["gain", "fc.weight", "fc.bias"]); // own entries first, as PyTorch orders them
/// # Ok::<(), oxtrain_tensor::Error>(())
/// ```
///
/// Everything else (`parameters`, `state_dict`, `train`/`eval`, `load_state_dict`, ...) comes
/// from the trait's provided methods. A module whose forward differs between training and
/// evaluation keeps a [`TrainingFlag`] and returns it from [`Module::training_flag`].
pub trait Module: Send + Sync {
    /// Shows this module's own parameters, buffers and children to `v`, in registration order.
    fn visit(&self, v: &mut dyn Visitor);

    /// This module's own training flag, for modules whose forward depends on the mode
    /// (dropout, batch norm). Containers need none: `train` and `eval` reach every descendant.
    fn training_flag(&self) -> Option<&TrainingFlag> {
        None
    }

    /// This module as a [`BatchNorm2d`](crate::BatchNorm2d), if it is one: how
    /// `convert_sync_batchnorm` finds the batch norms of a model (PyTorch checks
    /// `isinstance(m, _BatchNorm)`). Only `BatchNorm2d` overrides it.
    fn as_batch_norm(&self) -> Option<&crate::BatchNorm2d> {
        None
    }

    /// This module as a layer LoRA can adapt (`Linear`, GPT-2's `Conv1D`): its weight and the
    /// slot its adapter goes in. Only such layers override it.
    fn lora_host(&self) -> Option<crate::lora::LoraHost<'_>> {
        None
    }

    /// Every module below this one (not itself) with its dotted name, depth first, in
    /// registration order (`named_modules()` without the root).
    fn visit_modules(&self, on: &mut dyn FnMut(&str, &dyn Module)) {
        walk(&|v| self.visit(v), "", &mut |name, item| {
            if let Item::Module(m) = item {
                on(name, m);
            }
        });
    }

    /// Every parameter with its state-dict name (`layer1.0.conv1.weight`), in PyTorch's order:
    /// a module's own parameters first, then its children's, depth first. A parameter shared
    /// by two modules (tied weights) appears once, under its first name, as in PyTorch. Frozen
    /// parameters are listed too; [`Module::trainable_named_parameters`] leaves them out.
    fn named_parameters(&self) -> Vec<(String, Var)> {
        let mut out: Vec<(String, Var)> = Vec::new();
        walk(&|v| self.visit(v), "", &mut |name, item| {
            if let Item::Param(p) = item {
                let var = p.var();
                if !out.iter().any(|(_, v)| same_tensor(v.tensor(), var.tensor())) {
                    out.push((name.to_string(), var));
                }
            }
        });
        out
    }

    /// Every parameter (what an optimizer takes), in [`named_parameters`](Module::named_parameters) order.
    fn parameters(&self) -> Vec<Var> {
        self.named_parameters().into_iter().map(|(_, v)| v).collect()
    }

    /// Every buffer with its state-dict name (`bn1.running_mean`).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        walk(&|v| self.visit(v), "", &mut |name, item| {
            if let Item::Buffer(b) = item {
                out.push((name.to_string(), b.tensor()));
            }
        });
        out
    }

    /// The direct children with their local names (`named_children()`).
    fn child_names(&self) -> Vec<String> {
        struct Names(Vec<String>);
        impl Visitor for Names {
            fn param(&mut self, _: &str, _: &Parameter) {}
            fn buffer(&mut self, _: &str, _: &Buffer) {}
            fn child(&mut self, name: &str, _: &dyn Module) {
                self.0.push(name.to_string());
            }
        }
        let mut names = Names(Vec::new());
        self.visit(&mut names);
        names.0
    }

    /// Parameters and buffers by name, in PyTorch's `state_dict()` order: per module its own
    /// parameters, then its own buffers, then its children recursively. Tensors share storage
    /// with the module (a snapshot needs `.copy()`). Tied parameters appear under every name.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        walk(&|v| self.visit(v), "", &mut |name, item| match item {
            Item::Param(p) => out.push((name.to_string(), p.tensor())),
            Item::Buffer(b) => out.push((name.to_string(), b.tensor())),
            Item::Module(_) => {}
        });
        out
    }

    /// The parameters that learn (not frozen by [`Parameter::set_requires_grad`]), named:
    /// PyTorch's `[(n, p) for n, p in model.named_parameters() if p.requires_grad]`, the list
    /// an optimizer and DDP take.
    fn trainable_named_parameters(&self) -> Vec<(String, Var)> {
        self.named_parameters().into_iter().filter(|(_, v)| v.requires_grad()).collect()
    }

    /// The number of scalar parameters, frozen ones included (tied ones counted once).
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Var::elem_count).sum()
    }

    /// Sets training mode on this module and every descendant (`module.train(mode)`).
    fn train(&self, training: bool) {
        if let Some(flag) = self.training_flag() {
            flag.set(training);
        }
        walk(&|v| self.visit(v), "", &mut |_, item| {
            if let Item::Module(m) = item {
                if let Some(flag) = m.training_flag() {
                    flag.set(training);
                }
            }
        });
    }

    /// Evaluation mode (`module.eval()`): dropout off, batch norm on its running statistics.
    fn eval(&self) {
        self.train(false)
    }

    /// Whether this module is in training mode: its own flag, else the first flag among its
    /// descendants (`train`/`eval` keep them all equal), else `true` (PyTorch's default).
    fn is_training(&self) -> bool {
        let mut found = self.training_flag().map(TrainingFlag::get);
        walk(&|v| self.visit(v), "", &mut |_, item| {
            if let (None, Item::Module(m)) = (found, item) {
                found = m.training_flag().map(TrainingFlag::get);
            }
        });
        found.unwrap_or(true)
    }

    /// Forgets every parameter's gradient (`zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// Copies `state` into this module's parameters and buffers in place (`copy_`), so
    /// optimizers and DDP holding the parameters see the new values. Values are moved to each
    /// parameter's device and converted to its dtype.
    ///
    /// Every missing, unexpected and mis-shaped name is reported at once in the error. With
    /// `strict`, any of them means nothing is loaded; without, shape mismatches still fail
    /// (nothing loaded), while missing and unexpected names are returned in the report.
    fn load_state_dict(
        &self,
        state: &HashMap<String, Tensor>,
        strict: bool,
    ) -> Result<LoadReport, LoadError> {
        state::load(&|v| self.visit(v), state, strict)
    }

    /// Writes the state dict to a safetensors file that PyTorch's `safetensors.torch.load_file`
    /// reads with the same names.
    fn save_safetensors(&self, path: impl AsRef<Path>) -> oxtrain_tensor::Result<()>
    where
        Self: Sized,
    {
        let entries = self.state_dict();
        let refs: Vec<(&str, &Tensor)> = entries.iter().map(|(n, t)| (n.as_str(), t)).collect();
        oxtrain_tensor::safetensors::save(&refs, None, path)
    }

    /// Loads a safetensors file through [`load_state_dict`](Module::load_state_dict).
    fn load_safetensors(&self, path: impl AsRef<Path>, strict: bool) -> Result<LoadReport, LoadError>
    where
        Self: Sized,
    {
        let state: HashMap<String, Tensor> =
            oxtrain_tensor::safetensors::load_all(path)?.into_iter().collect();
        self.load_state_dict(&state, strict)
    }

    /// Moves every parameter and buffer to `device` (`module.to(device)`). Parameters become
    /// new leaves: build optimizers after moving the model, as PyTorch recommends.
    fn to_device(&self, device: Device) -> oxtrain_tensor::Result<()> {
        convert(&|v| self.visit(v), Some(device), None)
    }

    /// Converts every floating-point parameter and buffer to `dtype` (`module.to(dtype)`);
    /// integer buffers (`num_batches_tracked`) keep theirs.
    fn to_dtype(&self, dtype: DType) -> oxtrain_tensor::Result<()> {
        assert!(dtype.is_float(), "to_dtype: modules convert to floating-point dtypes only, got {dtype}");
        convert(&|v| self.visit(v), None, Some(dtype))
    }
}

/// Every parameter of `module` (tied ones under each of their names: each name has its own
/// [`Parameter`], so its own gate), as the `Var` it holds and its [`ValueGate`]: what a producer
/// of the values (ZeRO-1's all-gather) arms. Frozen parameters are listed too.
pub fn parameter_gates(module: &dyn Module) -> Vec<(Var, Arc<ValueGate>)> {
    let mut out = Vec::new();
    walk(&|v| module.visit(v), "", &mut |_, item| {
        if let Item::Param(p) = item {
            out.push((p.var(), p.gate().clone()));
        }
    });
    out
}

/// A thing found by [`walk`], with its full dotted name.
pub(crate) enum Item<'a> {
    Param(&'a Parameter),
    Buffer(&'a Buffer),
    Module(&'a dyn Module),
}

/// `prefix.name`, or `name` at the root.
fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Walks everything below the module whose [`Module::visit`] is `visit`, in PyTorch's
/// state-dict order: the module's own parameters, then its own buffers, then each child (the
/// child itself, then everything below it). Three passes over `visit` give that order whatever
/// order `visit` lists things in.
pub(crate) fn walk(visit: &dyn Fn(&mut dyn Visitor), prefix: &str, on: &mut dyn FnMut(&str, Item<'_>)) {
    #[derive(PartialEq)]
    enum Pass {
        Params,
        Buffers,
        Children,
    }
    struct Walker<'p, 'f> {
        pass: Pass,
        prefix: &'p str,
        on: &'f mut dyn FnMut(&str, Item<'_>),
    }
    impl Visitor for Walker<'_, '_> {
        fn param(&mut self, name: &str, param: &Parameter) {
            if self.pass == Pass::Params {
                (self.on)(&join(self.prefix, name), Item::Param(param));
            }
        }
        fn buffer(&mut self, name: &str, buffer: &Buffer) {
            if self.pass == Pass::Buffers {
                (self.on)(&join(self.prefix, name), Item::Buffer(buffer));
            }
        }
        fn child(&mut self, name: &str, module: &dyn Module) {
            if self.pass == Pass::Children {
                let full = join(self.prefix, name);
                (self.on)(&full, Item::Module(module));
                walk(&|v| module.visit(v), &full, self.on);
            }
        }
    }
    for pass in [Pass::Params, Pass::Buffers, Pass::Children] {
        visit(&mut Walker { pass, prefix, on: &mut *on });
    }
}

/// Whether two tensors are the same values in memory (one parameter seen twice).
pub(crate) fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.same_storage(b) && a.layout() == b.layout()
}

/// Moves and/or converts every parameter and buffer below `visit`; stops at the first error.
/// Parameters shared by several modules (tied weights) stay shared: each gets the one new leaf.
pub(crate) fn convert(
    visit: &dyn Fn(&mut dyn Visitor),
    device: Option<Device>,
    dtype: Option<DType>,
) -> oxtrain_tensor::Result<()> {
    let mut result = Ok(());
    let mut converted: Vec<(Tensor, Var)> = Vec::new();
    walk(visit, "", &mut |_, item| {
        if result.is_err() {
            return;
        }
        let current = match &item {
            Item::Param(p) => p.tensor(),
            Item::Buffer(b) => b.tensor(),
            Item::Module(_) => return,
        };
        let target_device = device.unwrap_or(current.device());
        let changes_dtype = dtype.is_some_and(|d| current.dtype().is_float() && current.dtype() != d);
        if target_device == current.device() && !changes_dtype {
            return;
        }
        if let Item::Param(p) = item {
            if let Some((_, var)) = converted.iter().find(|(old, _)| same_tensor(old, &current)) {
                p.replace(var.clone());
                return;
            }
        }
        match params::moved(&current, target_device, dtype) {
            Ok(t) => match item {
                Item::Param(p) => {
                    let var = params::leaf(t, p.requires_grad());
                    converted.push((current, var.clone()));
                    p.replace(var);
                }
                Item::Buffer(b) => b.replace(t),
                Item::Module(_) => {}
            },
            Err(e) => result = Err(e),
        }
    });
    result
}

impl<T: Module + ?Sized> Module for Box<T> {
    fn visit(&self, v: &mut dyn Visitor) {
        (**self).visit(v)
    }
    fn lora_host(&self) -> Option<crate::lora::LoraHost<'_>> {
        (**self).lora_host()
    }
    fn train(&self, training: bool) {
        (**self).train(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        (**self).training_flag()
    }
    fn as_batch_norm(&self) -> Option<&crate::BatchNorm2d> {
        (**self).as_batch_norm()
    }
}

impl<T: Forward + ?Sized> Forward for Box<T> {
    fn forward(&self, x: &Var) -> Var {
        (**self).forward(x)
    }
}

impl<T: Module + ?Sized> Module for &T {
    fn visit(&self, v: &mut dyn Visitor) {
        (**self).visit(v)
    }
    fn lora_host(&self) -> Option<crate::lora::LoraHost<'_>> {
        (**self).lora_host()
    }
    fn train(&self, training: bool) {
        (**self).train(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        (**self).training_flag()
    }
    fn as_batch_norm(&self) -> Option<&crate::BatchNorm2d> {
        (**self).as_batch_norm()
    }
}

impl<T: Module + ?Sized> Module for std::sync::Arc<T> {
    fn visit(&self, v: &mut dyn Visitor) {
        (**self).visit(v)
    }
    fn lora_host(&self) -> Option<crate::lora::LoraHost<'_>> {
        (**self).lora_host()
    }
    fn train(&self, training: bool) {
        (**self).train(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn training_flag(&self) -> Option<&TrainingFlag> {
        (**self).training_flag()
    }
    fn as_batch_norm(&self) -> Option<&crate::BatchNorm2d> {
        (**self).as_batch_norm()
    }
}

impl<T: Forward + ?Sized> Forward for std::sync::Arc<T> {
    fn forward(&self, x: &Var) -> Var {
        (**self).forward(x)
    }
}

#[cfg(test)]
mod tests;
