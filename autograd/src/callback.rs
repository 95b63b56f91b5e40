//! End-of-backward callbacks, as PyTorch's `Variable._execution_engine.queue_callback`: code
//! running inside a backward pass (a gradient-ready hook, an op's backward) queues work that
//! runs once the whole pass is done, on the same thread, before `backward` returns. DDP's
//! reducer waits for its last buckets this way, so user code stays `loss.backward()`.
//!
//! A callback may fail; the first failure is what [`Var::try_backward`](crate::Var::try_backward)
//! returns (and what [`Var::backward`](crate::Var::backward) panics with).

use std::cell::RefCell;
use std::error::Error as StdError;
use std::fmt;

type Callback = Box<dyn FnOnce() -> Result<(), BackwardError>>;

thread_local! {
    /// One queue per backward pass running on this thread (a hook may start a nested one).
    static FRAMES: RefCell<Vec<Vec<Callback>>> = const { RefCell::new(Vec::new()) };
}

/// Why a backward pass failed after computing its gradients: a callback queued with
/// [`queue_callback`] returned an error (a collective that timed out, a parameter DDP
/// expected a gradient for). Wraps the original error, which `source()` returns.
pub struct BackwardError(Box<dyn StdError + Send + Sync>);

impl BackwardError {
    pub fn new(error: impl Into<Box<dyn StdError + Send + Sync>>) -> BackwardError {
        BackwardError(error.into())
    }

    /// The original error, to match on its type (`downcast_ref::<CommError>()`).
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    pub fn into_inner(self) -> Box<dyn StdError + Send + Sync> {
        self.0
    }
}

impl fmt::Display for BackwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for BackwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackwardError({:?})", self.0)
    }
}

impl StdError for BackwardError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// Queues `callback` to run when the backward pass now running on this thread has finished
/// (every gradient computed and every hook fired), in the order queued. Callbacks may queue
/// further callbacks, which run in the same pass.
///
/// # Panics
/// Outside a backward pass (as PyTorch, which refuses "final callbacks" outside backward):
/// check [`in_backward`] first when unsure.
pub fn queue_callback(callback: impl FnOnce() -> Result<(), BackwardError> + 'static) {
    FRAMES.with(|f| {
        let mut frames = f.borrow_mut();
        let frame = frames
            .last_mut()
            .unwrap_or_else(|| panic!("queue_callback: no backward pass is running on this thread"));
        frame.push(Box::new(callback));
    })
}

/// Whether a backward pass is running on this thread (so [`queue_callback`] may be called).
pub fn in_backward() -> bool {
    FRAMES.with(|f| !f.borrow().is_empty())
}

/// The queue of one backward pass. Dropped without `finish` (backward panicked), it discards
/// its callbacks, so a later pass never runs an earlier one's.
pub(crate) struct Frame {
    depth: usize,
}

impl Frame {
    pub(crate) fn open() -> Frame {
        let depth = FRAMES.with(|f| {
            let mut frames = f.borrow_mut();
            frames.push(Vec::new());
            frames.len()
        });
        Frame { depth }
    }

    /// Runs the queued callbacks (and those they queue) in order; every callback runs, the
    /// first error is returned.
    pub(crate) fn finish(self) -> Result<(), BackwardError> {
        let mut first_error = None;
        loop {
            let next = FRAMES.with(|f| {
                let mut frames = f.borrow_mut();
                let frame = &mut frames[self.depth - 1];
                (!frame.is_empty()).then(|| frame.remove(0))
            });
            let Some(callback) = next else { break };
            if let Err(e) = callback() {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        FRAMES.with(|f| {
            let mut frames = f.borrow_mut();
            frames.truncate(self.depth - 1);
        });
    }
}
