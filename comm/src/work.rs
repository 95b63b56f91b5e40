//! The handle a collective returns (`torch.distributed.Work`).
//!
//! CPU backends run collectives on a worker thread in call order and the handle waits for
//! the result. GPU backends enqueue on a stream and return at once; their handle wraps
//! whatever says the stream work is done (an event), through [`WorkWaiter`].

use crate::error::{CommError, Result};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

/// What a backend plugs into a [`Work`] when completion is not a CPU thread's answer.
pub trait WorkWaiter: Send {
    /// Blocks until the operation is complete (for a GPU backend: until the caller's
    /// stream is ordered after it, as NCCL's `work.wait()` does).
    fn wait(self: Box<Self>) -> Result<()>;
    fn is_completed(&mut self) -> bool;
    /// Blocks the host until the operation has finished on the device (`wait` by default).
    fn synchronize(self: Box<Self>) -> Result<()> {
        self.wait()
    }
}

enum State {
    Done(Result<()>),
    Pending { rx: Receiver<Result<()>>, op: &'static str, timeout: Duration },
    Custom(Box<dyn WorkWaiter>),
}

/// A collective in flight. Dropping it without `wait()` lets the operation finish on its own.
#[must_use = "a collective's result is only known after work.wait()"]
pub struct Work {
    state: State,
}

impl Work {
    /// Already finished with `result`.
    pub fn done(result: Result<()>) -> Work {
        Work { state: State::Done(result) }
    }

    /// Finished when the worker sends on `rx`. `timeout` bounds the wait beyond the
    /// backend's own timeouts, so a wedged worker also becomes an error.
    pub(crate) fn pending(rx: Receiver<Result<()>>, op: &'static str, timeout: Duration) -> Work {
        Work { state: State::Pending { rx, op, timeout } }
    }

    /// A backend-defined completion (GPU events).
    pub fn from_waiter(waiter: Box<dyn WorkWaiter>) -> Work {
        Work { state: State::Custom(waiter) }
    }

    /// Blocks until the operation has finished and returns its result.
    pub fn wait(self) -> Result<()> {
        match self.state {
            State::Done(r) => r,
            State::Pending { rx, op, timeout } => match rx.recv_timeout(timeout) {
                Ok(r) => r,
                Err(_) => Err(CommError::Aborted(format!(
                    "{op}: the communicator's worker gave no answer within {timeout:?}"
                ))),
            },
            State::Custom(w) => w.wait(),
        }
    }

    /// Blocks the host until the operation has finished everywhere it runs. Same as `wait()`
    /// for CPU backends; for GPU backends `wait()` only orders the caller's current stream
    /// after the collective (as `torch.distributed`'s `work.wait()`), this waits for the device.
    pub fn synchronize(self) -> Result<()> {
        match self.state {
            State::Custom(w) => w.synchronize(),
            _ => self.wait(),
        }
    }

    /// Whether `wait()` would return at once.
    pub fn is_completed(&mut self) -> bool {
        match &mut self.state {
            State::Done(_) => true,
            State::Pending { rx, .. } => match rx.try_recv() {
                Ok(r) => {
                    self.state = State::Done(r);
                    true
                }
                Err(TryRecvError::Empty) => false,
                Err(TryRecvError::Disconnected) => true,
            },
            State::Custom(w) => w.is_completed(),
        }
    }
}
