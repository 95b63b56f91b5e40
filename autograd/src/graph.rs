//! The recorded graph and the backward walk.
//!
//! Every `Var` that requires grad points at a [`Node`]: a leaf (a parameter, holding its
//! accumulated gradient and its hooks) or an op (holding its backward function, which owns the
//! tensors the op saved, and edges to the nodes of its inputs). Nodes hold no forward values
//! except what their backward saved, so the graph keeps alive only what backward needs.

use crate::callback::{BackwardError, Frame};
use crate::ops::profile;
use oxtrain_tensor::{DType, Tensor};
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Computes the gradients of an op's inputs from the gradient of its output. The second
/// argument says which inputs need one; the result has one entry per input (`None` where
/// not needed). Gradients may have the broadcast shape: the engine sums them down.
pub(crate) type BackwardFn = Box<dyn Fn(&Tensor, &[bool]) -> Vec<Option<Tensor>> + Send + Sync>;

/// A [`BackwardFn`] that takes the gradient of its output in the parts that arrived (at least
/// one, in arrival order) instead of their sum: an op that can add them as it reads them saves
/// the pass that adds them (a ResNet block's end, whose output feeds two branches).
pub(crate) type PartsBackwardFn = Box<dyn Fn(Vec<Tensor>, &[bool]) -> Vec<Option<Tensor>> + Send + Sync>;

/// The backward of an op with several outputs: the gradient of each output (`None` where none
/// reached it, at least one is set) to the gradients of the inputs, as [`BackwardFn`].
pub(crate) type MultiBackwardFn =
    Box<dyn Fn(&[Option<Tensor>], &[bool]) -> Vec<Option<Tensor>> + Send + Sync>;

/// How an op node turns the gradient of its output into its inputs' gradients.
pub(crate) enum Backward {
    /// A one-output op taking the sum of its output's gradients.
    Single(BackwardFn),
    /// A one-output op taking its output's gradient in the parts that arrived.
    Parts(PartsBackwardFn),
    /// A several-output op: each output is a node of its own ([`Backward::Output`]) whose one
    /// input is this op, so every consumer of every output runs first; their gradients wait
    /// in slots until this op's backward takes them all at once (a fused backward).
    Multi { outputs: usize, backward: MultiBackwardFn },
    /// Output `slot` of the several-output op that is this node's one input: its gradient is
    /// handed to that op's slot, unchanged.
    Output(usize),
}

/// A gradient-ready hook of a leaf.
pub(crate) type Hook = Box<dyn FnMut(&Tensor) + Send>;

/// Creation order: backward runs the most recently created ready op first, as PyTorch does,
/// so the walk goes back through layers in reverse order.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);
static NEXT_HOOK_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Node {
    seq: u64,
    /// An op whose backward takes its gradient in parts ([`Backward::Parts`]).
    takes_parts: bool,
    pub(crate) name: &'static str,
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) kind: NodeKind,
}

pub(crate) enum NodeKind {
    Leaf {
        grad: Mutex<Option<Tensor>>,
        /// Where this leaf's gradient lives when someone preallocated it (a DDP bucket view):
        /// backward copies or adds into it in place instead of allocating a new `.grad`.
        grad_buffer: Mutex<Option<Tensor>>,
        hooks: Mutex<Vec<(u64, Hook)>>,
    },
    /// `None` once a backward without `retain_graph` has run through this op.
    Op(Mutex<Option<OpState>>),
}

pub(crate) struct OpState {
    backward: Backward,
    inputs: Vec<Option<Arc<Node>>>,
}

/// Gradients of the outputs of several-output ops, per op (by [`key`]), waiting for the op.
type Slots = HashMap<usize, Vec<Option<Tensor>>>;

impl OpState {
    /// The gradients of this op's inputs from `grad`, the gradient that reached it (or, for a
    /// several-output op, from its outputs' gradients waiting in `slots` under `node_key`).
    /// An output node hands its gradient on to its op's slot and gives its input none.
    fn input_grads(&self, node_key: usize, grad: Option<Pending>, slots: &mut Slots) -> Vec<Option<Tensor>> {
        let needs: Vec<bool> = self.inputs.iter().map(Option::is_some).collect();
        match (&self.backward, grad) {
            (Backward::Single(f), Some(Pending::Sum(g))) => f(&g, &needs),
            (Backward::Parts(f), Some(Pending::Parts(parts))) => f(parts, &needs),
            (Backward::Single(_) | Backward::Parts(_), Some(_)) => {
                unreachable!("a node's pending gradient matches its backward")
            }
            (Backward::Multi { outputs, backward }, _) => {
                let mut outs = slots.remove(&node_key).unwrap_or_default();
                outs.resize(*outputs, None);
                if outs.iter().any(Option::is_some) {
                    backward(&outs, &needs)
                } else {
                    vec![None; needs.len()]
                }
            }
            (Backward::Output(slot), grad) => {
                if let (Some(g), Some(op)) = (grad, &self.inputs[0]) {
                    let outs = slots.entry(key(op)).or_default();
                    if outs.len() <= *slot {
                        outs.resize(slot + 1, None);
                    }
                    outs[*slot] = Some(g.into_sum());
                }
                vec![None]
            }
            (_, None) => vec![None; needs.len()],
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Node {
    pub(crate) fn leaf(tensor: &Tensor) -> Arc<Node> {
        Arc::new(Node {
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
            takes_parts: false,
            name: "leaf",
            dims: tensor.dims().to_vec(),
            dtype: tensor.dtype(),
            kind: NodeKind::Leaf {
                grad: Mutex::new(None),
                grad_buffer: Mutex::new(None),
                hooks: Mutex::new(Vec::new()),
            },
        })
    }

    pub(crate) fn op(
        name: &'static str,
        output: &Tensor,
        inputs: Vec<Option<Arc<Node>>>,
        backward: Backward,
    ) -> Arc<Node> {
        Arc::new(Node {
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
            takes_parts: matches!(backward, Backward::Parts(_)),
            name,
            dims: output.dims().to_vec(),
            dtype: output.dtype(),
            kind: NodeKind::Op(Mutex::new(Some(OpState { backward, inputs }))),
        })
    }

    pub(crate) fn is_leaf(&self) -> bool {
        matches!(self.kind, NodeKind::Leaf { .. })
    }

    pub(crate) fn grad(&self) -> Option<Tensor> {
        match &self.kind {
            NodeKind::Leaf { grad, .. } => lock(grad).clone(),
            NodeKind::Op(_) => None,
        }
    }

    pub(crate) fn set_grad(&self, value: Option<Tensor>) {
        match &self.kind {
            NodeKind::Leaf { grad, .. } => *lock(grad) = value,
            NodeKind::Op(_) => {
                panic!("set_grad: only leaves (parameters) keep a gradient; this is a {} result", self.name)
            }
        }
    }

    pub(crate) fn set_grad_buffer(&self, buffer: Option<Tensor>) {
        match &self.kind {
            NodeKind::Leaf { grad_buffer, .. } => *lock(grad_buffer) = buffer,
            NodeKind::Op(_) => panic!(
                "set_grad_buffer: only leaves (parameters) keep a gradient; this is a {} result",
                self.name
            ),
        }
    }

    pub(crate) fn grad_buffer(&self) -> Option<Tensor> {
        match &self.kind {
            NodeKind::Leaf { grad_buffer, .. } => lock(grad_buffer).clone(),
            NodeKind::Op(_) => None,
        }
    }

    pub(crate) fn add_hook(&self, hook: Hook) -> u64 {
        match &self.kind {
            NodeKind::Leaf { hooks, .. } => {
                let id = NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed);
                lock(hooks).push((id, hook));
                id
            }
            NodeKind::Op(_) => panic!(
                "register_hook: gradient-ready hooks go on leaves (parameters); this is a {} result",
                self.name
            ),
        }
    }

    pub(crate) fn remove_hook(&self, id: u64) {
        if let NodeKind::Leaf { hooks, .. } = &self.kind {
            lock(hooks).retain(|(h, _)| *h != id);
        }
    }

    /// The nodes this op reads; panics when an earlier backward freed them.
    fn input_nodes(&self) -> Vec<Arc<Node>> {
        match &self.kind {
            NodeKind::Leaf { .. } => vec![],
            NodeKind::Op(state) => match &*lock(state) {
                Some(s) => s.inputs.iter().flatten().cloned().collect(),
                None => panic!("{}", freed_message(self.name)),
            },
        }
    }

    /// Adds a final gradient to a leaf's `.grad`, then fires its hooks with the result.
    fn finish_leaf(&self, g: Tensor) {
        let NodeKind::Leaf { grad, grad_buffer, hooks } = &self.kind else {
            unreachable!("finish_leaf on an op")
        };
        let total = {
            let mut slot = lock(grad);
            let buffer = lock(grad_buffer).clone();
            let total = match (slot.take(), buffer) {
                // The gradient lives in a preallocated buffer: accumulate there in place, so
                // `.grad()` stays a view of it (DDP's gradient as bucket view).
                (Some(old), Some(buf)) if old.same_storage(&buf) && old.layout() == buf.layout() => {
                    buf.add_(&g);
                    buf
                }
                (old, Some(buf)) => {
                    match old {
                        Some(old) => buf.copy_(&old.add(&g)),
                        None => buf.copy_(&g),
                    };
                    buf
                }
                (Some(old), None) => old.add(&g),
                // A gradient some other node also holds (an add passes its gradient through to
                // both inputs) gets a copy, so updating one `.grad` in place cannot change another.
                (None, None) if g.is_contiguous() && g.storage_ref_count() == 1 => g,
                (None, None) => g.copy(),
            };
            *slot = Some(total.clone());
            total
        };
        // Hooks run without the lock held, so a hook may register or remove hooks.
        let mut running = std::mem::take(&mut *lock(hooks));
        for (_, hook) in running.iter_mut() {
            hook(&total);
        }
        let mut slot = lock(hooks);
        running.append(&mut slot);
        *slot = running;
    }
}

fn freed_message(name: &str) -> String {
    format!(
        "backward: trying to backward through the graph a second time (the saved tensors of `{name}` were \
         freed by the first backward); pass retain_graph = true to the first backward_with if you need \
         to run backward twice"
    )
}

impl Drop for Node {
    // A long chain of nodes would otherwise drop recursively, one stack frame per op.
    fn drop(&mut self) {
        let NodeKind::Op(state) = &mut self.kind else { return };
        let take_inputs = |s: &mut Mutex<Option<OpState>>| -> Vec<Arc<Node>> {
            let slot = s.get_mut().unwrap_or_else(|e| e.into_inner());
            slot.take().map(|s| s.inputs.into_iter().flatten().collect()).unwrap_or_default()
        };
        let mut stack = take_inputs(state);
        while let Some(node) = stack.pop() {
            if let Some(mut inner) = Arc::into_inner(node) {
                if let NodeKind::Op(s) = &mut inner.kind {
                    stack.extend(take_inputs(s));
                }
            }
        }
    }
}

/// The gradient `g` made to fit `node`: its dtype, and its shape when `g` has the broadcast shape.
fn conform(g: Tensor, node: &Node) -> Tensor {
    let g = if g.dtype() == node.dtype { g } else { g.to_dtype(node.dtype) };
    if g.dims() == node.dims.as_slice() {
        g
    } else {
        sum_to_shape(&g, &node.dims)
    }
}

/// Sums `g` over the dims that broadcasting added or stretched, giving shape `target`.
pub fn sum_to_shape(g: &Tensor, target: &[usize]) -> Tensor {
    let rank = g.rank();
    let compatible = rank >= target.len()
        && g.dims()[rank - target.len()..].iter().zip(target).all(|(&d, &t)| d == t || t == 1);
    if !compatible {
        assert_eq!(
            g.elem_count(),
            target.iter().product::<usize>(),
            "backward: a gradient of shape {:?} cannot be reduced to shape {target:?}",
            g.dims()
        );
        return g.reshape(target);
    }
    let lead = rank - target.len();
    let dims: Vec<usize> =
        (0..rank).filter(|&i| i < lead || (target[i - lead] == 1 && g.dims()[i] != 1)).collect();
    if dims.is_empty() {
        return g.reshape(target);
    }
    g.sum(dims, true).reshape(target)
}

/// `prev + g` for two partial gradients of one node, added into `prev` when no other tensor
/// can see it (its own storage, contiguous, the sum's shape and dtype): the residual stream
/// and a tied embedding sum several gradients, and a fresh tensor per sum is one more
/// allocation and pass over memory each (51 MB for GPT-2's tied token embedding).
fn accumulate(prev: Tensor, g: &Tensor) -> Tensor {
    let private = prev.storage_ref_count() == 1 && prev.is_contiguous() && !prev.same_storage(g);
    if private && prev.dims() == g.dims() && prev.dtype() == g.dtype() {
        prev.add_(g);
        prev
    } else {
        prev.add(g)
    }
}

/// The sum of gradient parts, in their order, as the walk sums the parts of other nodes.
pub(crate) fn sum_parts(parts: Vec<Tensor>) -> Tensor {
    let mut parts = parts.into_iter();
    let first = parts.next().expect("a gradient has at least one part");
    parts.fold(first, |acc, g| profile::region("backward", "(gradient sum)", || accumulate(acc, &g)))
}

/// A node's gradient so far: the sum of the parts that arrived, or for an op that takes its
/// gradient in parts, the parts themselves.
enum Pending {
    Sum(Tensor),
    Parts(Vec<Tensor>),
}

impl Pending {
    fn first(node: &Node, g: Tensor) -> Pending {
        if node.takes_parts {
            Pending::Parts(vec![g])
        } else {
            Pending::Sum(g)
        }
    }

    fn add(self, g: Tensor) -> Pending {
        match self {
            Pending::Sum(prev) => Pending::Sum(sum_parts(vec![prev, g])),
            Pending::Parts(mut parts) => {
                parts.push(g);
                Pending::Parts(parts)
            }
        }
    }

    /// The sum (leaves take only sums).
    fn into_sum(self) -> Tensor {
        match self {
            Pending::Sum(g) => g,
            Pending::Parts(_) => unreachable!("only ops take their gradient in parts"),
        }
    }
}

/// Orders ready ops by creation, newest first.
struct Ready(Arc<Node>);
impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        self.0.seq == o.0.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.seq.cmp(&o.0.seq)
    }
}

fn key(node: &Arc<Node>) -> usize {
    Arc::as_ptr(node) as usize
}

/// Runs backward from `root` with gradient `grad`, then the callbacks queued during it.
pub(crate) fn backward(root: &Arc<Node>, grad: Tensor, retain_graph: bool) -> Result<(), BackwardError> {
    assert!(
        grad.dims() == root.dims.as_slice(),
        "backward: the gradient has shape {:?}, the output has shape {:?}",
        grad.dims(),
        root.dims
    );
    let frame = Frame::open();
    walk_backward(vec![(root.clone(), grad)], retain_graph, None);
    frame.finish()
}

/// The sequence number the next node will get: nodes made before this moment have smaller ones.
pub(crate) fn next_seq() -> u64 {
    NEXT_SEQ.load(Ordering::Relaxed)
}

/// A backward walk from several `roots` (nodes with their outputs' gradients) that stops at
/// every node made before `first_seq`: such a node's inputs are not visited and its gradient
/// (the sum of the parts that reached it) is returned, keyed by [`node_key`], instead of being
/// propagated or put into a leaf's `.grad`. Activation checkpointing backpropagates through a
/// recomputed piece of graph this way, as `torch.autograd.grad(outputs, inputs)`.
pub(crate) fn backward_to_boundary(
    roots: Vec<(Arc<Node>, Tensor)>,
    first_seq: u64,
) -> HashMap<usize, Tensor> {
    walk_backward(roots, false, Some(first_seq))
}

/// The identity of a node, as [`backward_to_boundary`] keys its results.
pub(crate) fn node_key(node: &Arc<Node>) -> usize {
    key(node)
}

/// The roots' gradients into `grads` (summed where a root comes twice); the distinct roots.
fn seed_roots(roots: Vec<(Arc<Node>, Tensor)>, grads: &mut HashMap<usize, Pending>) -> Vec<Arc<Node>> {
    let mut distinct = Vec::new();
    for (root, grad) in roots {
        let k = key(&root);
        let grad = conform(grad, &root);
        let acc = match grads.remove(&k) {
            Some(prev) => prev.add(grad),
            None => {
                distinct.push(root.clone());
                Pending::first(&root, grad)
            }
        };
        grads.insert(k, acc);
    }
    distinct
}

/// Pass 1 of the walk: how many consumers inside the graph of `roots` each node has (a node's
/// gradient is complete once all of them have run). Nodes `outside` are counted, not entered.
fn count_consumers(roots: Vec<Arc<Node>>, outside: &impl Fn(&Node) -> bool) -> HashMap<usize, usize> {
    let mut pending: HashMap<usize, usize> = HashMap::new();
    let mut seen: std::collections::HashSet<usize> = roots.iter().map(key).collect();
    let mut stack = roots;
    while let Some(node) = stack.pop() {
        if outside(&node) {
            continue;
        }
        for input in node.input_nodes() {
            *pending.entry(key(&input)).or_default() += 1;
            if seen.insert(key(&input)) {
                stack.push(input);
            }
        }
    }
    pending
}

/// The backward walk itself, without recursion. With `boundary`, nodes made before that
/// sequence number are outside: their gradients are returned rather than used.
fn walk_backward(
    roots: Vec<(Arc<Node>, Tensor)>,
    retain_graph: bool,
    boundary: Option<u64>,
) -> HashMap<usize, Tensor> {
    let outside = |node: &Node| boundary.is_some_and(|first| node.seq < first);
    let mut pending = count_consumers(roots.iter().map(|(n, _)| n.clone()).collect(), &outside);

    // Pass 2: Kahn's walk. Partial gradients wait in `grads` until their node is ready; the
    // gradients of a several-output op's outputs wait in `slots` until the op is.
    let mut grads: HashMap<usize, Pending> = HashMap::new();
    let mut slots: Slots = HashMap::new();
    let mut reached: HashMap<usize, Tensor> = HashMap::new();
    let mut ready = BinaryHeap::new();
    // A node whose gradient is complete: collected when outside, put into `.grad` when a
    // leaf, else run.
    let mut complete =
        |node: Arc<Node>, grads: &mut HashMap<usize, Pending>, ready: &mut BinaryHeap<Ready>| {
            if outside(&node) {
                if let Some(g) = grads.remove(&key(&node)) {
                    reached.insert(key(&node), g.into_sum());
                }
            } else if node.is_leaf() {
                if let Some(g) = grads.remove(&key(&node)) {
                    profile::region("backward", "(gradient into .grad)", || node.finish_leaf(g.into_sum()));
                }
            } else {
                ready.push(Ready(node));
            }
        };
    // A root that no other root's graph reads has its whole gradient now; the others wait
    // for their consumers like any node.
    for root in seed_roots(roots, &mut grads) {
        if !pending.contains_key(&key(&root)) {
            complete(root, &mut grads, &mut ready);
        }
    }
    while let Some(Ready(node)) = ready.pop() {
        let NodeKind::Op(state) = &node.kind else { unreachable!("leaves are finished when ready") };
        let grad = grads.remove(&key(&node));
        let mut guard = lock(state);
        let (inputs, input_grads) = {
            let s = guard.as_ref().unwrap_or_else(|| panic!("{}", freed_message(node.name)));
            // The gradient is dropped in there, as soon as the op's backward is done with it.
            let input_grads = s.input_grads(key(&node), grad, &mut slots);
            assert_eq!(
                input_grads.len(),
                s.inputs.len(),
                "backward of {}: wrong number of gradients",
                node.name
            );
            (s.inputs.clone(), input_grads)
        };
        if !retain_graph {
            // Frees the tensors this op saved for backward.
            *guard = None;
        }
        drop(guard);
        for (input, g) in inputs.into_iter().zip(input_grads) {
            let Some(input) = input else { continue };
            let k = key(&input);
            if let Some(g) = g {
                let g = profile::region("backward", "(gradient to input shape/dtype)", || conform(g, &input));
                let acc = match grads.remove(&k) {
                    Some(prev) => prev.add(g),
                    None => Pending::first(&input, g),
                };
                grads.insert(k, acc);
            }
            let count = pending.get_mut(&k).expect("every input was counted");
            *count -= 1;
            if *count == 0 {
                pending.remove(&k);
                complete(input, &mut grads, &mut ready);
            }
        }
    }
    reached
}
