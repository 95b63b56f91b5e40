//! A batch as the loader hands it over: images in host memory (page-locked when CUDA is there,
//! so the upload runs asynchronously at full speed) and i64 labels.

use crate::error::Result;
use oxtrain_tensor::cuda::{Event, PinnedBuffer};
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::{Arc, Mutex};

/// Page-locked buffers that batches borrow and give back when dropped.
pub(crate) struct PinnedPool {
    pub ordinal: usize,
    free: Mutex<Vec<PinnedBuffer>>,
}

impl PinnedPool {
    pub fn new(ordinal: usize) -> PinnedPool {
        PinnedPool { ordinal, free: Mutex::new(Vec::new()) }
    }

    /// A buffer of at least `bytes`, reused when one is free.
    pub fn take(&self, bytes: usize) -> Result<PinnedBuffer> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter().position(|b| b.len_bytes() >= bytes).map(|i| free.swap_remove(i))
        };
        match reused {
            Some(b) => Ok(b),
            None => Ok(PinnedBuffer::new(self.ordinal, bytes)?),
        }
    }

    fn give_back(&self, buf: PinnedBuffer) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
    }
}

pub(crate) enum Images {
    Cpu(Tensor),
    Pinned {
        buf: Option<PinnedBuffer>,
        pool: Arc<PinnedPool>,
    },
    /// Decoded on the GPU by a worker, on its own stream: `ready` marks the end of that work.
    Device {
        tensor: Tensor,
        ready: Event,
    },
}

/// One batch: `images` of shape `[n, ...sample shape]` and `labels` of shape `[n]` (i64).
pub struct Batch {
    pub(crate) images: Images,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) labels: Vec<i64>,
    /// The dataset indices of the samples, in batch order (skipped bad files left out).
    pub indices: Vec<usize>,
    /// Per sample: whether the device is to mirror it (a transform with `flip_on_device`).
    pub(crate) flips: Vec<bool>,
    /// Bad files met loading it, counted into the loader's total when it is handed out.
    pub(crate) bad_files: usize,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Shape of the images tensor.
    pub fn images_shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the images sit in page-locked memory.
    pub fn is_pinned(&self) -> bool {
        matches!(self.images, Images::Pinned { .. })
    }

    /// The images as a CPU tensor (a copy when they sit in pinned memory).
    pub fn images(&mut self) -> Tensor {
        match &mut self.images {
            Images::Cpu(t) => t.clone(),
            Images::Device { tensor, .. } => {
                tensor.to_device(Device::Cpu).expect("copying GPU-decoded images to the host")
            }
            Images::Pinned { buf, .. } => {
                let buf = buf.as_mut().expect("a pinned batch keeps its buffer until dropped");
                Tensor::from_pinned(buf, self.shape.clone(), self.dtype, Device::Cpu)
                    .expect("a CPU copy of pinned memory")
            }
        }
    }

    /// For images decoded on the GPU, the event after which they are there (the work of a
    /// worker's stream, which the stream that reads them is to wait for).
    pub fn device_ready(&self) -> Option<&Event> {
        match &self.images {
            Images::Device { ready, .. } => Some(ready),
            _ => None,
        }
    }

    /// Per sample, whether it is still to be mirrored left to right (drawn on the host, left to
    /// the device by a transform with `flip_on_device`; all false otherwise).
    pub fn flips(&self) -> &[bool] {
        &self.flips
    }

    /// The labels, `[n]` i64 on the CPU.
    pub fn labels(&self) -> Tensor {
        Tensor::from_vec(self.labels.clone(), [self.labels.len()], Device::Cpu).expect("labels on the CPU")
    }

    /// `(images, labels)` on `device`. From pinned memory the copies are queued on the device's
    /// current stream and this returns at once (`non_blocking=True`); the pinned buffer is
    /// reused only after its copy has finished.
    pub fn to(mut self, device: Device) -> Result<(Tensor, Tensor)> {
        let labels = self.labels().to_device_non_blocking(device)?;
        let images = match &mut self.images {
            Images::Cpu(t) => t.to_device_non_blocking(device)?,
            Images::Device { tensor, .. } => tensor.to_device_non_blocking(device)?,
            Images::Pinned { buf, .. } => {
                let buf = buf.as_mut().expect("a pinned batch keeps its buffer until dropped");
                Tensor::from_pinned(buf, self.shape.clone(), self.dtype, device)?
            }
        };
        Ok((images, labels))
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Images::Pinned { buf, pool } = &mut self.images {
            if let Some(b) = buf.take() {
                pool.give_back(b);
            }
        }
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Batch({:?} {}, pinned: {}, indices: {:?})",
            self.shape,
            self.dtype,
            self.is_pinned(),
            self.indices
        )
    }
}
