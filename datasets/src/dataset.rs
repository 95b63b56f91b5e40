//! What the loader needs from a dataset: a length, the shape of one sample, and a way to write
//! sample `i` into a slot of the batch.

use crate::error::{Error, Result};
use crate::gpu_decode::{GpuDecoding, PlannedFile};
use crate::rng::SampleRng;
use oxtrain_tensor::DType;

/// The fixed shape and element type of every sample of a dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Sample {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// A map-style dataset (`torch.utils.data.Dataset`) of fixed-size samples with an i64 label.
pub trait Dataset: Send + Sync + 'static {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sample(&self) -> Sample;

    /// Writes sample `index` into `out` (exactly `sample().bytes()` bytes, aligned for the
    /// dtype, native-endian) drawing any randomness from `rng`, and returns its label.
    /// A file that is not a usable image returns [`crate::Error::BadImage`], which the
    /// loader skips or reports as its [`crate::BadFilePolicy`] says.
    fn load_into(&self, index: usize, rng: &mut SampleRng, out: &mut [u8]) -> Result<i64>;

    /// As `load_into`, also saying whether the device is to mirror the sample: a dataset that
    /// draws its flip on the host and leaves the pixel work to the GPU returns true for the
    /// samples drawn flipped. Datasets that flip themselves (or never) keep this default.
    fn load_with_flip(&self, index: usize, rng: &mut SampleRng, out: &mut [u8]) -> Result<(i64, bool)> {
        self.load_into(index, rng, out).map(|label| (label, false))
    }

    /// Set when the samples are decoded on a GPU ([`crate::gpu_decode`]): the loader's workers
    /// then read and plan each sample ([`Dataset::plan_sample`]) and decode whole batches there.
    fn gpu_decoding(&self) -> Option<&GpuDecoding> {
        None
    }

    /// Sample `index` as its encoded file with the random choices drawn for it from `rng`, and
    /// its label: the host's part of GPU decoding.
    fn plan_sample(&self, index: usize, _rng: &mut SampleRng) -> Result<(PlannedFile, i64)> {
        Err(Error::Config(format!("sample {index}: this dataset does not decode on the GPU")))
    }
}
