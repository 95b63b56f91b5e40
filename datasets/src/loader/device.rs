//! Batches onto the device through a copy stream of their own: a batch's copy runs beside the
//! compute stream's queued work, and the compute stream waits for it only where it needs it. Images of raw bytes (a transform `for_device_normalize`) are flipped and
//! normalised there by `Tensor::normalize_images`.

use super::batch::Batch;
use crate::error::Result;
use oxtrain_tensor::cuda::{Event, Stream};
use oxtrain_tensor::ops::image::ImageNorm;
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::Mutex;

/// How raw u8 `[N, H, W, 3]` images become the network's input on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceInput {
    pub norm: ImageNorm,
    /// f32 (what the CPU path gives), bf16 or f16.
    pub dtype: DType,
    /// Channels-last in memory (the `[N, 3, H, W]` shape either way).
    pub channels_last: bool,
}

impl DeviceInput {
    /// torchvision's ImageNet normalisation into contiguous f32 NCHW: the values of the CPU
    /// path's `ImageTransform::imagenet_train`, bit for bit.
    pub const IMAGENET_F32: DeviceInput =
        DeviceInput { norm: ImageNorm::IMAGENET, dtype: DType::F32, channels_last: false };
}

/// The copy stream of device `ordinal`, one per process: blocks the caching allocator keeps for
/// a stream serve that stream's later allocations, so a stream per epoch would strand them.
fn copy_stream(ordinal: usize) -> Result<Stream> {
    static STREAMS: Mutex<Vec<(usize, Stream)>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = streams.iter().find(|(n, _)| *n == ordinal) {
        return Ok(s.clone());
    }
    let s = Stream::new(ordinal)?;
    streams.push((ordinal, s.clone()));
    Ok(s)
}

/// A batch whose copies are queued, with the event that marks their end on the copy stream.
struct Uploaded {
    images: Tensor,
    labels: Tensor,
    flips: Vec<bool>,
    copied: Option<Event>,
}

/// `(images, labels)` on `device` from an iterator of batches. A batch is taken from the
/// loader only when the step asks for it, so the loader's position (what a checkpoint saves)
/// counts the batches trained on; the overlap comes from the host queueing the step's kernels
/// ahead of the GPU: the next batch's copy runs on the copy stream while the GPU still works
/// on the last step.
pub struct ToDevice<I> {
    batches: I,
    device: Device,
    input: Option<DeviceInput>,
    /// The copy stream (CUDA only).
    copy: Option<Stream>,
}

impl<I: Iterator<Item = Result<Batch>>> ToDevice<I> {
    /// `input`: how to turn raw byte images into the input (None: the images are the input
    /// already, normalised on the host).
    pub fn new(batches: I, device: Device, input: Option<DeviceInput>) -> Result<Self> {
        let copy = match device {
            Device::Cuda(n) => Some(copy_stream(n)?),
            Device::Cpu => None,
        };
        Ok(ToDevice { batches, device, input, copy })
    }

    fn upload(&self, mut batch: Batch) -> Result<Uploaded> {
        let flips = batch.flips().to_vec();
        let Some(copy) = &self.copy else {
            let (images, labels) = (batch.images(), batch.labels());
            return Ok(Uploaded { images, labels, flips, copied: None });
        };
        let _on_copy_stream = copy.make_current();
        if let Some(decoded) = batch.device_ready() {
            // Decoded on a worker's stream: the copy stream's event then covers that work too.
            copy.wait_event(decoded)?;
        }
        let (images, labels) = batch.to(self.device)?;
        Ok(Uploaded { images, labels, flips, copied: Some(copy.record_event()?) })
    }

    /// The uploaded batch as the compute stream's input.
    fn finish(&self, u: Uploaded) -> Result<(Tensor, Tensor)> {
        if let (Some(event), Device::Cuda(n)) = (&u.copied, self.device) {
            let compute = Stream::current(n)?;
            compute.wait_event(event)?;
            // Made on the copy stream, read on the compute stream: their memory is not to be
            // reused before the compute stream's work on them is done.
            u.images.record_stream(&compute);
            u.labels.record_stream(&compute);
        }
        let images = match self.input {
            Some(i) => u.images.normalize_images(&u.flips, i.norm, i.dtype, i.channels_last),
            None => u.images,
        };
        Ok((images, u.labels))
    }
}

impl<I: Iterator<Item = Result<Batch>>> Iterator for ToDevice<I> {
    type Item = Result<(Tensor, Tensor)>;

    fn next(&mut self) -> Option<Result<(Tensor, Tensor)>> {
        let batch = self.batches.next()?;
        Some(batch.and_then(|b| self.upload(b)).and_then(|u| self.finish(u)))
    }
}
