//! `Var`: a tensor plus its place in the recorded graph, and the `no_grad` scope.

use crate::callback::BackwardError;
use crate::graph::{self, Backward, BackwardFn, MultiBackwardFn, Node, PartsBackwardFn};
use oxtrain_tensor::Tensor;
use std::cell::Cell;
use std::sync::{Arc, Weak};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record the graph (false inside [`no_grad`]).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with recording on on this thread, as `with torch.enable_grad():` (a checkpointed
/// piece recomputed during a backward that runs under `no_grad`).
pub(crate) fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(true)));
    f()
}

/// Whether an op with `inputs` records a node. When it does not because recording is off,
/// a checkpointed forward running here learns which graph nodes the op read.
fn records(inputs: &[&Var]) -> bool {
    if !is_grad_enabled() {
        crate::checkpoint::note_reads(inputs.iter().filter_map(|v| v.node.as_ref()));
        return false;
    }
    inputs.iter().any(|v| v.node.is_some())
}

/// Runs `f` with recording off on this thread, as `with torch.no_grad():`. Ops inside give
/// constants. Nests, and restores the previous state even when `f` panics.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// A tensor that autograd tracks: a parameter (a leaf that collects a gradient), a constant,
/// or the result of ops on those. Cloning is cheap and shares the graph node, so a clone of a
/// parameter sees the same `.grad()`.
#[derive(Clone)]
pub struct Var {
    tensor: Tensor,
    node: Option<Arc<Node>>,
}

/// Removes a hook registered with [`Var::register_hook`].
pub struct HookHandle {
    node: Weak<Node>,
    id: u64,
}

impl HookHandle {
    pub fn remove(self) {
        if let Some(node) = self.node.upgrade() {
            node.remove_hook(self.id);
        }
    }
}

impl Var {
    /// A leaf that requires grad (`nn.Parameter`); its gradient collects in [`Var::grad`].
    /// Its storage keeps the casts made of it (`Tensor::keep_casts`): autocast lowers it once
    /// per change, not at every use.
    pub fn parameter(tensor: Tensor) -> Var {
        assert!(
            tensor.dtype().is_float(),
            "parameter: only floating-point tensors can require grad, got {} with shape {:?}",
            tensor.dtype(),
            tensor.dims()
        );
        tensor.keep_casts();
        let node = Node::leaf(&tensor);
        Var { tensor, node: Some(node) }
    }

    /// A leaf standing for `tensor` in a recomputed piece of graph: unlike a parameter, its
    /// storage is not marked to keep casts.
    pub(crate) fn fresh_leaf(tensor: Tensor) -> Var {
        let node = Node::leaf(&tensor);
        Var { tensor, node: Some(node) }
    }

    pub(crate) fn from_node(tensor: Tensor, node: Option<Arc<Node>>) -> Var {
        Var { tensor, node }
    }

    pub(crate) fn node(&self) -> Option<&Arc<Node>> {
        self.node.as_ref()
    }

    /// A value that gets no gradient (inputs, targets, masks).
    pub fn constant(tensor: Tensor) -> Var {
        Var { tensor, node: None }
    }

    /// The value.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The value, without the graph (`x.detach()`): shares storage with `self`.
    pub fn detach(&self) -> Var {
        Var::constant(self.tensor.clone())
    }

    /// Whether a gradient flows back through this value.
    pub fn requires_grad(&self) -> bool {
        self.node.is_some()
    }

    /// Whether this is a parameter (a leaf that requires grad).
    pub fn is_leaf(&self) -> bool {
        self.node.as_ref().is_none_or(|n| n.is_leaf())
    }

    /// The gradient accumulated by backward passes so far (leaves only; `None` before any).
    pub fn grad(&self) -> Option<Tensor> {
        self.node.as_ref().and_then(|n| n.grad())
    }

    /// Forgets the gradient (`param.grad = None`): the next backward starts from nothing.
    pub fn zero_grad(&self) {
        if let Some(n) = &self.node {
            if n.is_leaf() {
                n.set_grad(None);
            }
        }
    }

    /// Replaces a leaf's gradient (a DDP reducer writing back averaged gradients).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        if let Some(g) = &grad {
            assert!(
                g.dims() == self.dims(),
                "set_grad: gradient of shape {:?} for a parameter of shape {:?}",
                g.dims(),
                self.dims()
            );
        }
        match &self.node {
            Some(n) => n.set_grad(grad),
            None => panic!("set_grad: a constant has no gradient; make it with Var::parameter"),
        }
    }

    pub fn dims(&self) -> &[usize] {
        self.tensor.dims()
    }

    pub fn rank(&self) -> usize {
        self.tensor.rank()
    }

    pub fn dtype(&self) -> oxtrain_tensor::DType {
        self.tensor.dtype()
    }

    pub fn device(&self) -> oxtrain_tensor::Device {
        self.tensor.device()
    }

    pub fn elem_count(&self) -> usize {
        self.tensor.elem_count()
    }

    /// Backward from a one-element output (a loss), with gradient 1, freeing the graph.
    ///
    /// # Panics
    /// When an end-of-backward callback fails (under DDP: a collective that failed or a
    /// parameter that got no gradient), with its message; [`try_backward`](Var::try_backward)
    /// returns that error instead.
    pub fn backward(&self) {
        if let Err(e) = self.try_backward() {
            panic!("backward: {e}");
        }
    }

    /// [`backward`](Var::backward) that returns the error of a failed end-of-backward
    /// callback (see [`queue_callback`](crate::queue_callback)) instead of panicking. The
    /// gradients are computed either way.
    pub fn try_backward(&self) -> Result<(), BackwardError> {
        assert!(
            self.elem_count() == 1,
            "backward: the output has shape {:?}; backward() needs one element, use backward_with for others",
            self.dims()
        );
        self.try_backward_with(self.tensor.ones_like(), false)
    }

    /// Backward with the output's gradient `grad`. With `retain_graph` the saved tensors stay,
    /// so backward can run through the graph again; without it they are freed as it goes.
    /// Panics as [`backward`](Var::backward) does when a callback fails.
    pub fn backward_with(&self, grad: Tensor, retain_graph: bool) {
        if let Err(e) = self.try_backward_with(grad, retain_graph) {
            panic!("backward: {e}");
        }
    }

    /// [`backward_with`](Var::backward_with) returning a failed callback's error.
    pub fn try_backward_with(&self, grad: Tensor, retain_graph: bool) -> Result<(), BackwardError> {
        let node = self.node.as_ref().unwrap_or_else(|| {
            panic!("backward: this value does not require grad (no parameter leads to it, or it came from no_grad)")
        });
        graph::backward(node, grad, retain_graph)
    }

    /// Makes backward accumulate this parameter's gradient in place into `buffer` (same shape
    /// and dtype), so [`grad`](Var::grad) is `buffer` itself (sharing its storage) instead of
    /// a fresh tensor: DDP's gradient as bucket view. When `.grad()` is empty (after
    /// `zero_grad`) backward copies the new gradient into `buffer`; when it is `buffer`,
    /// backward adds to it. `None` goes back to allocating gradients.
    pub fn set_grad_buffer(&self, buffer: Option<Tensor>) {
        if let Some(b) = &buffer {
            assert!(
                b.dims() == self.dims() && b.dtype() == self.dtype() && b.device() == self.device(),
                "set_grad_buffer: a buffer of shape {:?} ({}, {:?}) for a parameter of shape {:?} ({}, {:?})",
                b.dims(),
                b.dtype(),
                b.device(),
                self.dims(),
                self.dtype(),
                self.device()
            );
        }
        match &self.node {
            Some(n) if n.is_leaf() => n.set_grad_buffer(buffer),
            _ => panic!("set_grad_buffer: only parameters (leaves made with Var::parameter) keep a gradient"),
        }
    }

    /// The buffer set with [`set_grad_buffer`](Var::set_grad_buffer), if any.
    pub fn grad_buffer(&self) -> Option<Tensor> {
        self.node.as_ref().and_then(|n| n.grad_buffer())
    }

    /// Calls `hook` with the leaf's accumulated gradient the moment a backward pass has
    /// finished adding to it (every path into it done), once per backward, on the thread
    /// running backward, before backward returns.
    pub fn register_hook(&self, hook: impl FnMut(&Tensor) + Send + 'static) -> HookHandle {
        let node = self.node.as_ref().unwrap_or_else(|| {
            panic!("register_hook: a constant gets no gradient; make it with Var::parameter")
        });
        let id = node.add_hook(Box::new(hook));
        HookHandle { node: Arc::downgrade(node), id }
    }

    /// The result of an op: records `backward` when grad is enabled and an input requires
    /// grad, else a constant. This is how other crates add differentiable ops (what
    /// `torch.autograd.Function` is in PyTorch): `backward(grad_output, needs)` returns one
    /// gradient per input, `None` where `needs[i]` is false; a gradient may have the
    /// broadcast shape of its input, the engine sums it down. `backward` must capture tensors
    /// only, never `Var`s, or the graph would keep itself alive.
    pub fn from_op(
        name: &'static str,
        output: Tensor,
        inputs: &[&Var],
        backward: impl Fn(&Tensor, &[bool]) -> Vec<Option<Tensor>> + Send + Sync + 'static,
    ) -> Var {
        crate::ops::profile::forward_done(name);
        if !records(inputs) {
            return Var::constant(output);
        }
        let edges = inputs.iter().map(|v| v.node.clone()).collect();
        let boxed: BackwardFn = Box::new(move |g: &Tensor, needs: &[bool]| {
            crate::ops::profile::timed(name, || backward(g, needs))
        });
        let node = Node::op(name, &output, edges, Backward::Single(boxed));
        Var { tensor: output, node: Some(node) }
    }

    /// [`Var::from_op`] for an op whose backward takes the gradient of its output in the parts
    /// that arrived (one or more, in arrival order) rather than their sum, so it can add them
    /// as it reads them instead of a pass of their own.
    pub fn from_op_parts(
        name: &'static str,
        output: Tensor,
        inputs: &[&Var],
        backward: impl Fn(Vec<Tensor>, &[bool]) -> Vec<Option<Tensor>> + Send + Sync + 'static,
    ) -> Var {
        crate::ops::profile::forward_done(name);
        if !records(inputs) {
            return Var::constant(output);
        }
        let edges = inputs.iter().map(|v| v.node.clone()).collect();
        let boxed: PartsBackwardFn = Box::new(move |parts: Vec<Tensor>, needs: &[bool]| {
            crate::ops::profile::timed(name, || backward(parts, needs))
        });
        let node = Node::op(name, &output, edges, Backward::Parts(boxed));
        Var { tensor: output, node: Some(node) }
    }

    /// The results of an op with several outputs, as [`Var::from_op`] records one: `backward(
    /// grad_outputs, needs)` gets the gradient of each output (conformed to its shape and
    /// dtype; `None` for an output no gradient reached, and it is called only when one did)
    /// and returns one gradient per input. Every consumer of every output runs before it, so
    /// one backward call sees all of them: a fused backward that would otherwise add the
    /// gradients of two outputs in a pass of its own (`torch.autograd.Function` with several
    /// outputs).
    pub fn from_multi_output_op(
        name: &'static str,
        outputs: Vec<Tensor>,
        inputs: &[&Var],
        backward: impl Fn(&[Option<Tensor>], &[bool]) -> Vec<Option<Tensor>> + Send + Sync + 'static,
    ) -> Vec<Var> {
        assert!(!outputs.is_empty(), "from_multi_output_op: {name} has no outputs");
        crate::ops::profile::forward_done(name);
        if !records(inputs) {
            return outputs.into_iter().map(Var::constant).collect();
        }
        let edges = inputs.iter().map(|v| v.node.clone()).collect();
        let boxed: MultiBackwardFn = Box::new(move |g: &[Option<Tensor>], needs: &[bool]| {
            crate::ops::profile::timed(name, || backward(g, needs))
        });
        let op =
            Node::op(name, &outputs[0], edges, Backward::Multi { outputs: outputs.len(), backward: boxed });
        outputs
            .into_iter()
            .enumerate()
            .map(|(slot, tensor)| {
                let node = Node::op(name, &tensor, vec![Some(op.clone())], Backward::Output(slot));
                Var { tensor, node: Some(node) }
            })
            .collect()
    }
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.node {
            None => "constant".to_string(),
            Some(n) if n.is_leaf() => "parameter".to_string(),
            Some(n) => format!("grad_fn={}", n.name),
        };
        write!(f, "Var({kind}, {:?})", self.tensor)
    }
}
