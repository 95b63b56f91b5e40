//! The layers, one file per family.

mod activation;
mod attention;
mod container;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod norm;
mod pool;
mod shape;

pub use activation::{GeluApproximate, ReLU, SiLU, GELU};
pub use attention::{MultiheadAttentionConfig, MultiheadSelfAttention};
pub use container::{ModuleList, Sequential};
pub use conv::{Conv2d, Conv2dConfig};
pub use dropout::Dropout;
pub use embedding::{Embedding, EmbeddingConfig};
pub use linear::{Linear, LinearConfig};
pub use norm::{BatchNorm2d, BatchNormConfig, CrossReplicaNorm, LayerNorm, LayerNormConfig, RunningStats};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
pub use shape::{Flatten, Identity};

#[cfg(test)]
pub(crate) mod tests;
