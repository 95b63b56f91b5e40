//! `Embedding` (`nn.Embedding`): a lookup table of vectors by integer id.

use crate::init;
use crate::{Forward, Module, Parameter, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{CmpOp, DType, Device, Result, Tensor};

/// Options of [`Embedding`]; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingConfig {
    /// An id whose row starts as zeros and gets no gradient (a padding token).
    pub padding_idx: Option<usize>,
    pub dtype: DType,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig { padding_idx: None, dtype: DType::F32 }
    }
}

/// A table `weight` of shape `[num_embeddings, embedding_dim]`, initialised N(0, 1) as PyTorch
/// does (with the padding row zeroed).
#[derive(Debug)]
pub struct Embedding {
    pub weight: Parameter,
    pub padding_idx: Option<usize>,
}

impl Embedding {
    pub fn new(num_embeddings: usize, embedding_dim: usize, device: Device) -> Result<Embedding> {
        Embedding::with_config(num_embeddings, embedding_dim, EmbeddingConfig::default(), device)
    }

    pub fn with_config(
        num_embeddings: usize,
        embedding_dim: usize,
        config: EmbeddingConfig,
        device: Device,
    ) -> Result<Embedding> {
        let weight = Tensor::zeros([num_embeddings, embedding_dim], config.dtype, device)?;
        init::normal_(&weight, 0.0, 1.0, None);
        if let Some(p) = config.padding_idx {
            assert!(
                p < num_embeddings,
                "Embedding: padding_idx {p} must be less than num_embeddings ({num_embeddings})"
            );
            weight.narrow(0, p, 1).zero_();
        }
        Ok(Embedding { weight: Parameter::new(weight), padding_idx: config.padding_idx })
    }

    /// The rows for `ids` (an integer tensor of any shape): shape `ids.shape + [embedding_dim]`.
    pub fn forward_ids(&self, ids: &Tensor) -> Var {
        let out = Var::embedding(ids, &self.weight.var());
        match self.padding_idx {
            None => out,
            // Same values, but positions holding the padding id take them from a detached
            // copy, so no gradient reaches the padding row (PyTorch's padding_idx).
            Some(p) => {
                let is_pad = ids.to_dtype(DType::I64).cmp_scalar(p as f64, CmpOp::Eq).unsqueeze(-1);
                Var::where_cond(&is_pad, &out.detach(), &out)
            }
        }
    }
}

impl Module for Embedding {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("weight", &self.weight);
    }
}

impl Forward for Embedding {
    /// `x` holds the ids (a constant integer tensor).
    fn forward(&self, x: &Var) -> Var {
        self.forward_ids(x.tensor())
    }
}
