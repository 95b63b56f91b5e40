//! What the GPU backends (nccl, nvshmem) share: a communication stream ordered after the
//! caller's compute stream, the [`Work`] that orders the caller back after it, and the raw
//! view of a CUDA tensor's elements.
//!
//! Stream semantics are PyTorch's: a collective first makes the communicator's own stream
//! wait for everything queued so far on the caller's current stream (an event, no host
//! blocking), runs there, and returns at once. `work.wait()` makes the caller's current
//! stream wait for the collective (again without blocking the host); `work.synchronize()`
//! blocks the host until it has finished. A caller already running on the communication
//! stream (see `comm_stream()` on the backends) pays for no cross-stream event at all.

use crate::error::{CommError, Result};
use crate::op::shard_range;
use crate::work::{Work, WorkWaiter};
use oxtrain_tensor::cuda::{Event, Stream};
use oxtrain_tensor::{DType, Device, Storage, Tensor};

pub(crate) fn cuda_err(what: impl Into<String>, e: impl std::fmt::Display) -> CommError {
    CommError::Library { library: "cuda", what: what.into(), message: e.to_string() }
}

/// A contiguous CUDA tensor's elements as the device sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CudaView {
    /// Address of the first element.
    pub ptr: u64,
    pub len: usize,
    pub dtype: DType,
}

impl CudaView {
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
}

/// The elements of `t`, which must be a contiguous tensor on `cuda:{ordinal}`; marks its
/// memory as used by `comm` so the caching allocator does not hand it out again before the
/// collective is done (`Tensor.record_stream`).
pub(crate) fn cuda_view(op: &str, t: &Tensor, ordinal: usize, comm: &Stream) -> Result<CudaView> {
    match t.device() {
        Device::Cuda(n) if n == ordinal => {}
        other => {
            return Err(CommError::Unsupported(format!(
            "{op}: this communicator works on tensors on cuda:{ordinal}, got one on {other:?}; move it with \
                 .to_device(Device::Cuda({ordinal}))"
        )))
        }
    }
    if !t.is_contiguous() {
        return Err(CommError::Unsupported(format!(
            "{op}: GPU collectives take contiguous tensors (as torch.distributed with NCCL); got shape {:?} with \
             strides {:?}: call .contiguous() first",
            t.dims(),
            t.layout().strides()
        )));
    }
    let offset = t.layout().offset();
    let mut guard = t.storage_mut();
    match &mut *guard {
        Storage::Cuda(s) => {
            s.record_stream(comm.id());
            Ok(CudaView {
                ptr: s.ptr() + (offset * s.dtype().size_in_bytes()) as u64,
                len: t.elem_count(),
                dtype: t.dtype(),
            })
        }
        Storage::Cpu(_) => unreachable!("a tensor on a CUDA device has CUDA storage"),
    }
}

/// The shape checks every backend makes, with the CPU backends' messages.
pub(crate) fn check_shards(op: &str, whole: &Tensor, part: &Tensor, world: usize, rank: usize) {
    assert_eq!(
        whole.dtype(),
        part.dtype(),
        "{op}: output dtype {} differs from input dtype {}",
        part.dtype(),
        whole.dtype()
    );
    let want = shard_range(whole.elem_count(), world, rank).len();
    assert_eq!(
        part.elem_count(),
        want,
        "{op}: rank {rank}'s shard has shape {:?} ({} elements) but its part of the tensor of shape {:?} has {want}",
        part.dims(),
        part.elem_count(),
        whole.dims()
    );
}

pub(crate) fn check_root(op: &str, root: usize, world: usize) {
    assert!(root < world, "{op}: root rank {root} is out of range for world size {world}");
}

/// The communication stream of one GPU backend.
pub(crate) struct CommStream {
    pub ordinal: usize,
    pub stream: Stream,
    device: std::sync::Arc<oxtrain_tensor::cuda::CudaDevice>,
}

impl CommStream {
    pub fn new(ordinal: usize) -> Result<CommStream> {
        let device = oxtrain_tensor::cuda::device(ordinal)
            .map_err(|e| cuda_err(format!("opening cuda:{ordinal}"), e))?;
        let stream =
            Stream::new(ordinal).map_err(|e| cuda_err(format!("creating a stream on cuda:{ordinal}"), e))?;
        Ok(CommStream { ordinal, stream, device })
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.device
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the CUDA context", format!("{e:?}")))
    }

    fn current(&self) -> Result<Stream> {
        Stream::current(self.ordinal).map_err(|e| cuda_err("the current stream", e))
    }

    /// Orders the communication stream after the caller's current stream (call before
    /// enqueuing a collective); returns the [`Caller`] to hand to `finish`.
    pub fn begin(&self) -> Result<Caller> {
        let cur = self.current()?;
        let on_comm_stream = cur.id() == self.stream.id();
        if !on_comm_stream {
            let ev =
                cur.record_event().map_err(|e| cuda_err("recording an event on the current stream", e))?;
            self.stream.wait_event(&ev).map_err(|e| cuda_err("ordering the communication stream", e))?;
        }
        Ok(Caller { on_comm_stream })
    }

    /// The handle of a collective just enqueued. `blocking`: `wait()` also blocks the host
    /// (barrier).
    pub fn finish(&self, caller: Caller, blocking: bool) -> Result<Work> {
        if !blocking && caller.on_comm_stream {
            // The caller queues on the communication stream itself, so its later work is
            // already ordered after this collective: no event per call (creating and recording
            // one was a good part of a small message's time).
            return Ok(Work::from_waiter(Box::new(SameStreamWork { stream: self.stream.clone() })));
        }
        let event = self
            .stream
            .record_event()
            .map_err(|e| cuda_err("recording an event on the communication stream", e))?;
        Ok(Work::from_waiter(Box::new(GpuWork {
            event,
            ordinal: self.ordinal,
            comm_id: self.stream.id(),
            blocking,
        })))
    }
}

/// What `begin` learnt about the caller (the current stream is looked up once per call).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    on_comm_stream: bool,
}

struct GpuWork {
    event: Event,
    ordinal: usize,
    comm_id: usize,
    blocking: bool,
}

// SAFETY: a CUDA event handle may be used from any thread of the process.
unsafe impl Send for GpuWork {}

impl WorkWaiter for GpuWork {
    fn wait(self: Box<Self>) -> Result<()> {
        if self.blocking {
            return self.synchronize();
        }
        let cur = Stream::current(self.ordinal).map_err(|e| cuda_err("the current stream", e))?;
        if cur.id() != self.comm_id {
            cur.wait_event(&self.event).map_err(|e| cuda_err("waiting for a collective", e))?;
        }
        Ok(())
    }

    fn is_completed(&mut self) -> bool {
        self.event.query()
    }

    fn synchronize(self: Box<Self>) -> Result<()> {
        self.event.synchronize().map_err(|e| cuda_err("waiting for a collective on the host", e))
    }
}

/// A collective queued while its own stream was current (see [`CommStream::finish`]).
struct SameStreamWork {
    stream: Stream,
}

// SAFETY: a CUDA stream handle may be used from any thread of the process.
unsafe impl Send for SameStreamWork {}

impl WorkWaiter for SameStreamWork {
    fn wait(self: Box<Self>) -> Result<()> {
        let cur = Stream::current(self.stream.ordinal()).map_err(|e| cuda_err("the current stream", e))?;
        if cur.id() != self.stream.id() {
            // The caller moved to another stream since: order it after everything queued on
            // the communication stream so far, which includes the collective.
            cur.wait_stream(&self.stream).map_err(|e| cuda_err("waiting for a collective", e))?;
        }
        Ok(())
    }

    fn is_completed(&mut self) -> bool {
        // SAFETY: a live stream of this process.
        let status = unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.raw().cu_stream()) };
        status == cudarc::driver::sys::CUresult::CUDA_SUCCESS
    }

    fn synchronize(self: Box<Self>) -> Result<()> {
        self.stream.synchronize().map_err(|e| cuda_err("waiting for a collective on the host", e))
    }
}
