//! Activation checkpointing, as `torch.utils.checkpoint.checkpoint`: a piece of the forward
//! pass (a transformer block, a ResNet stage) runs without recording, so none of its inner
//! activations stay alive; the graph keeps only the piece's inputs and one node. When
//! backward reaches that node it runs the piece again from the saved inputs, this time
//! recording, and backpropagates through the recomputed graph. Memory for a block's
//! activations is traded for a second forward of it.
//!
//! The recomputation sees what the first forward saw: the random generator is set back to its
//! state at the first forward (dropout draws the same masks, as PyTorch's
//! `preserve_rng_state`) and restored afterwards, so the run's random stream goes on as
//! without checkpointing; the autocast dtype of the first forward is restored too. One
//! generator serves every device, so this holds on CPU and CUDA alike.
//!
//! Which parameters the piece uses is learnt while it runs: every op executed without
//! recording tells this module which graph nodes it read ([`note_reads`]), and those become
//! inputs of the checkpoint's node. Backward through the recomputed graph stops at them and
//! hands their gradients to the main walk, which adds them into `.grad` and fires the hooks
//! exactly once per backward, as without checkpointing; the gradients are summed in the same
//! order, so they are bit for bit those of the run without checkpointing.

use crate::graph::{self, Backward, MultiBackwardFn, Node};
use crate::{autocast, autocast_disabled, autocast_dtype, is_grad_enabled, no_grad, Var};
use oxtrain_tensor::{default_generator_state, set_default_generator_state, DType, GeneratorState, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The piece of forward pass a checkpoint reruns: its inputs to its outputs.
type Piece = Arc<dyn Fn(&[Var]) -> Vec<Var> + Send + Sync>;

/// The graph nodes read by the ops of the checkpointed forwards running on this thread
/// (nested ones each have their own list), in first-read order, without repeats.
#[derive(Default)]
struct Reads {
    nodes: Vec<Arc<Node>>,
    seen: HashSet<usize>,
}

thread_local! {
    static READS: RefCell<Vec<Reads>> = const { RefCell::new(Vec::new()) };
    static RECOMPUTING: Cell<usize> = const { Cell::new(0) };
}

/// Called by every op that runs with recording off: inside a checkpointed forward, the graph
/// nodes it read become inputs of the checkpoint.
pub(crate) fn note_reads<'a>(nodes: impl Iterator<Item = &'a Arc<Node>>) {
    READS.with(|r| {
        let mut frames = r.borrow_mut();
        if let Some(reads) = frames.last_mut() {
            for node in nodes {
                if reads.seen.insert(graph::node_key(node)) {
                    reads.nodes.push(node.clone());
                }
            }
        }
    })
}

/// Whether this thread is recomputing a checkpointed piece for backward. Layers with side
/// effects in their forward (batch norm's running statistics) skip them then, so that a
/// checkpointed step updates them once, as a step without checkpointing does.
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(Cell::get) > 0
}

/// Runs `f` on `x` without keeping its activations, as `torch.utils.checkpoint.checkpoint(f,
/// x, use_reentrant=False)`: backward recomputes them (see the [module docs](self)). `f` must
/// do the same ops each time it runs on the same input: it is called once now and once more
/// in backward. Anything it captures is kept until then; capture parameters by `Arc` or
/// clone (not by reference, it must be `'static`). Outside recording (inside [`no_grad`],
/// or nested in another checkpoint's first forward) it simply calls `f`.
pub fn checkpoint(f: impl Fn(&Var) -> Var + Send + Sync + 'static, x: &Var) -> Var {
    let mut out = checkpoint_many(move |xs: &[Var]| vec![f(&xs[0])], &[x]);
    out.pop().expect("one output")
}

/// [`checkpoint`] for a piece with several inputs and outputs (a block that hands on two
/// tensors). Inputs that require no gradient get none.
pub fn checkpoint_many(f: impl Fn(&[Var]) -> Vec<Var> + Send + Sync + 'static, inputs: &[&Var]) -> Vec<Var> {
    let owned: Vec<Var> = inputs.iter().map(|v| (*v).clone()).collect();
    if !is_grad_enabled() {
        return f(&owned);
    }
    let rng = default_generator_state();
    let cast = autocast_dtype();
    let detached: Vec<Var> = owned.iter().map(Var::detach).collect();
    READS.with(|r| r.borrow_mut().push(Reads::default()));
    // Pops this forward's list even when `f` panics.
    struct PopReads;
    impl Drop for PopReads {
        fn drop(&mut self) {
            READS.with(|r| r.borrow_mut().pop());
        }
    }
    let pop = PopReads;
    let outputs = no_grad(|| f(&detached));
    assert!(!outputs.is_empty(), "checkpoint: the checkpointed function returned no outputs");
    let read = READS.with(|r| r.borrow_mut().last_mut().map(std::mem::take)).unwrap_or_default().nodes;
    drop(pop);
    let mut edges: Vec<Option<Arc<Node>>> = owned.iter().map(|v| v.node().cloned()).collect();
    if edges.iter().all(Option::is_none) && read.is_empty() {
        return outputs;
    }
    let read_keys: Vec<usize> = read.iter().map(graph::node_key).collect();
    edges.extend(read.into_iter().map(Some));
    let saved = Saved {
        piece: Arc::new(f),
        inputs: owned.iter().map(|v| v.tensor().clone()).collect(),
        read_keys,
        rng,
        cast,
    };
    let tensors: Vec<Tensor> = outputs.iter().map(|v| v.tensor().clone()).collect();
    let backward: MultiBackwardFn = Box::new(move |grads, needs| saved.backward(grads, needs));
    let node =
        Node::op("checkpoint", &tensors[0], edges, Backward::Multi { outputs: tensors.len(), backward });
    tensors
        .into_iter()
        .enumerate()
        .map(|(slot, t)| {
            let out = Node::op("checkpoint", &t, vec![Some(node.clone())], Backward::Output(slot));
            Var::from_node(t, Some(out))
        })
        .collect()
}

/// What a checkpoint's node keeps for backward: the piece and its inputs, not its activations.
struct Saved {
    piece: Piece,
    inputs: Vec<Tensor>,
    /// The nodes the first forward read, by identity, in the order of the node's edges after
    /// the inputs.
    read_keys: Vec<usize>,
    rng: GeneratorState,
    cast: Option<DType>,
}

impl Saved {
    /// Reruns the piece recording, then backpropagates `grads` (one per output) to the
    /// piece's inputs and the nodes it read.
    fn backward(&self, grads: &[Option<Tensor>], needs: &[bool]) -> Vec<Option<Tensor>> {
        let leaves: Vec<Var> = self
            .inputs
            .iter()
            .zip(needs)
            .map(|(t, &need)| if need { Var::fresh_leaf(t.clone()) } else { Var::constant(t.clone()) })
            .collect();
        let first_seq = graph::next_seq();
        let outputs = self.recompute(&leaves);
        assert_eq!(
            outputs.len(),
            grads.len(),
            "checkpoint: the recomputed piece returned {} outputs, the first forward {}; a checkpointed \
             function must do the same thing each time it runs",
            outputs.len(),
            grads.len()
        );
        let roots: Vec<_> = outputs
            .iter()
            .zip(grads)
            .filter_map(|(out, g)| Some((out.node()?.clone(), g.clone()?)))
            .collect();
        let mut reached =
            if roots.is_empty() { HashMap::new() } else { graph::backward_to_boundary(roots, first_seq) };
        let leaf_keys = leaves.iter().map(|v| v.node().map(graph::node_key));
        let mut result: Vec<Option<Tensor>> = leaf_keys.map(|k| k.and_then(|k| reached.remove(&k))).collect();
        result.extend(self.read_keys.iter().map(|k| reached.remove(k)));
        assert!(
            reached.is_empty(),
            "checkpoint: the recomputed piece used {} tensor(s) that require grad which the first forward did \
             not; a checkpointed function must do the same ops each time it runs",
            reached.len()
        );
        result
    }

    /// The piece run again with recording on, from the first forward's random state and
    /// autocast dtype; the generator is put back afterwards.
    fn recompute(&self, leaves: &[Var]) -> Vec<Var> {
        struct Restore {
            rng: GeneratorState,
        }
        impl Drop for Restore {
            fn drop(&mut self) {
                set_default_generator_state(self.rng);
                RECOMPUTING.with(|r| r.set(r.get() - 1));
            }
        }
        let _restore = Restore { rng: default_generator_state() };
        RECOMPUTING.with(|r| r.set(r.get() + 1));
        set_default_generator_state(self.rng);
        crate::var::enable_grad(|| match self.cast {
            Some(dtype) => autocast(dtype, || (self.piece)(leaves)),
            None => autocast_disabled(|| (self.piece)(leaves)),
        })
    }
}
