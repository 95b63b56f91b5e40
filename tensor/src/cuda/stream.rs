//! Streams and events in the API, because communication runs on its own stream beside compute.
//!
//! Every op is queued on the *current* stream of its device: the device's default stream,
//! unless a [`StreamGuard`] made another current on this thread (as `torch.cuda.stream(s)`).

use super::device::{device, CudaDevice};
use super::host_waits::Wait;
use crate::{Error, Result};
use cudarc::driver::{sys, CudaEvent, CudaStream};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

thread_local! {
    static CURRENT: RefCell<HashMap<usize, Arc<CudaStream>>> = RefCell::new(HashMap::new());
}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Msg(format!("{what}: {e:?}"))
}

/// A CUDA stream of one device.
#[derive(Clone)]
pub struct Stream {
    device: Arc<CudaDevice>,
    inner: Arc<CudaStream>,
}

impl Stream {
    /// A new stream on device `ordinal` (`torch.cuda.Stream()`).
    pub fn new(ordinal: usize) -> Result<Stream> {
        let device = device(ordinal)?;
        let inner = device.context().new_stream().map_err(|e| err("creating a stream", e))?;
        Ok(Stream { device, inner })
    }

    /// The stream ops on `ordinal` are queued on now, on this thread.
    pub fn current(ordinal: usize) -> Result<Stream> {
        let device = device(ordinal)?;
        let inner = current_raw(&device);
        Ok(Stream { device, inner })
    }

    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    pub fn raw(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// The handle, as the caching allocator identifies streams.
    pub fn id(&self) -> usize {
        self.inner.cu_stream() as usize
    }

    /// Records an event at the current end of this stream's queue.
    pub fn record_event(&self) -> Result<Event> {
        let ev = self
            .inner
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| err("recording an event", e))?;
        Ok(Event { inner: ev, device: self.device.clone() })
    }

    /// Makes later work on this stream wait for `event` (without blocking the host).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.inner.wait(&event.inner).map_err(|e| err("waiting for an event", e))
    }

    /// Makes later work on this stream wait for everything queued on `other` so far.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        self.wait_event(&other.record_event()?)
    }

    /// Blocks the host until this stream's queued work is done.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().map_err(|e| err("synchronizing a stream", e))?;
        self.device.waited(Wait::Synchronization);
        Ok(())
    }

    /// Makes this stream current on this thread until the guard drops.
    pub fn make_current(&self) -> StreamGuard {
        let ordinal = self.ordinal();
        let previous = CURRENT.with(|c| c.borrow_mut().insert(ordinal, self.inner.clone()));
        StreamGuard { ordinal, previous }
    }
}

/// Restores the previously current stream when dropped.
pub struct StreamGuard {
    ordinal: usize,
    previous: Option<Arc<CudaStream>>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            match self.previous.take() {
                Some(p) => c.insert(self.ordinal, p),
                None => c.remove(&self.ordinal),
            };
        });
    }
}

/// The current stream of `device` on this thread.
pub(crate) fn current_raw(device: &CudaDevice) -> Arc<CudaStream> {
    CURRENT
        .with(|c| c.borrow().get(&device.ordinal()).cloned())
        .unwrap_or_else(|| device.default_stream().clone())
}

/// A point in a stream's queue.
pub struct Event {
    inner: CudaEvent,
    device: Arc<CudaDevice>,
}

impl Event {
    /// Blocks the host until the event has happened.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().map_err(|e| err("synchronizing an event", e))?;
        self.device.waited(Wait::Synchronization);
        Ok(())
    }

    /// Whether the work before the event has finished.
    pub fn query(&self) -> bool {
        self.inner.is_complete()
    }

    /// Milliseconds between two events recorded with timing (for benchmarks).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.inner.elapsed_ms(&end.inner).map_err(|e| err("reading event times", e))
    }
}
