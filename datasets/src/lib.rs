#![doc = include_str!("../README.md")]

pub mod dataset;
pub mod decode;
pub mod error;
pub mod gpu_decode;
pub mod image_folder;
pub mod loader;
pub mod rng;
pub mod sampler;
pub mod synthetic;
pub mod text;
pub mod token_shards;
pub mod transforms;

pub use dataset::{Dataset, Sample};
pub use decode::DecodeLimits;
pub use error::{Error, Result};
pub use image_folder::ImageFolder;
pub use loader::{
    BadFilePolicy, Batch, DataLoader, DeviceInput, EpochIter, LoaderConfig, PinMemory, PrefetchStatus,
    ToDevice,
};
pub use rng::SampleRng;
pub use sampler::{DistributedSampler, SamplerState};
pub use text::{ByteTokenizer, LmDataset, TextClassificationDataset, Tokenizer};
pub use token_shards::{TokenShards, TokenWidth};
pub use transforms::{ChannelLayout, Crop, ImageTransform, Normalize, PixelOutput};
