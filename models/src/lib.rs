//! oxtrain-models: ResNet (torchvision), GPT-2 and BERT (Hugging Face) on oxtrain-nn, with
//! the state-dict names of the originals so their safetensors checkpoints load as they are.
#![doc = include_str!("../README.md")]

pub mod bert;
mod error;
pub mod gpt2;
mod linear_cross_entropy;
mod list;
pub mod loading;
pub mod loss;
mod mask;
pub mod resnet;
pub mod tokenizer;

pub use bert::{BertConfig, BertForSequenceClassification, BertModel};
pub use error::{ModelError, Result};
pub use gpt2::{Gpt2Config, Gpt2LMHeadModel, Gpt2Model};
pub use linear_cross_entropy::{linear_cross_entropy, LinearCrossEntropyOptions, DEFAULT_CHUNK_ELEMENTS};
pub use resnet::{BlockKind, ResNet, ResNetConfig};
pub use tokenizer::{Encoded, Padding, Tokenizer};
