//! `MultiheadSelfAttention`: `nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)`
//! used as self-attention (query = key = value), with the same parameter names, so PyTorch
//! checkpoints load unchanged.

use crate::functional::{additive_mask, causal_mask, scaled_dot_product_attention_with};
use crate::{init, Forward, Linear, LinearConfig, Module, Parameter, TrainingFlag, Visitor};
use oxtrain_autograd::Var;
use oxtrain_tensor::{DType, Device, Result, Tensor};

/// Options of [`MultiheadSelfAttention`]; `Default` is PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiheadAttentionConfig {
    /// Dropout on the attention weights, in training mode.
    pub dropout: f64,
    /// `in_proj_bias` and `out_proj.bias`.
    pub bias: bool,
    pub dtype: DType,
}

impl Default for MultiheadAttentionConfig {
    fn default() -> Self {
        MultiheadAttentionConfig { dropout: 0.0, bias: true, dtype: DType::F32 }
    }
}

/// Multi-head self-attention over `[batch, seq, embed_dim]`: one fused projection
/// `in_proj_weight` `[3 * embed_dim, embed_dim]` (rows: query, key, value) and `in_proj_bias`,
/// attention per head, then `out_proj`. Initialised as PyTorch does: Xavier-uniform
/// `in_proj_weight`, zero biases, `out_proj.weight` as a `Linear`'s.
#[derive(Debug)]
pub struct MultiheadSelfAttention {
    pub in_proj_weight: Parameter,
    pub in_proj_bias: Option<Parameter>,
    pub out_proj: Linear,
    pub num_heads: usize,
    pub dropout: f64,
    training: TrainingFlag,
}

impl MultiheadSelfAttention {
    pub fn new(embed_dim: usize, num_heads: usize, device: Device) -> Result<MultiheadSelfAttention> {
        MultiheadSelfAttention::with_config(embed_dim, num_heads, MultiheadAttentionConfig::default(), device)
    }

    pub fn with_config(
        embed_dim: usize,
        num_heads: usize,
        config: MultiheadAttentionConfig,
        device: Device,
    ) -> Result<MultiheadSelfAttention> {
        assert!(
            num_heads > 0 && embed_dim.is_multiple_of(num_heads),
            "MultiheadSelfAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
        );
        let dtype = config.dtype;
        let out_proj =
            Linear::with_config(embed_dim, embed_dim, LinearConfig { bias: config.bias, dtype }, device)?;
        let in_proj_weight = Tensor::zeros([3 * embed_dim, embed_dim], dtype, device)?;
        init::xavier_uniform_(&in_proj_weight, 1.0, None);
        let in_proj_bias = if config.bias {
            if let Some(b) = &out_proj.bias {
                b.tensor().zero_();
            }
            Some(Parameter::new(Tensor::zeros(3 * embed_dim, dtype, device)?))
        } else {
            None
        };
        Ok(MultiheadSelfAttention {
            in_proj_weight: Parameter::new(in_proj_weight),
            in_proj_bias,
            out_proj,
            num_heads,
            dropout: config.dropout,
            training: TrainingFlag::default(),
        })
    }

    pub fn embed_dim(&self) -> usize {
        self.in_proj_weight.dims()[1]
    }

    /// Attention of `x` (`[batch, seq, embed_dim]`, or `[seq, embed_dim]` unbatched) to itself,
    /// with `nn.MultiheadAttention`'s mask conventions:
    /// - `attn_mask`: `[seq, seq]` or `[batch * num_heads, seq, seq]`; bool **true = may not
    ///   attend**, or float added to the scores.
    /// - `key_padding_mask`: `[batch, seq]`; bool **true = padding, ignored as a key**, or float.
    /// - `is_causal`: position `i` attends to `0..=i` only (combined with the other masks).
    ///
    /// A query left with no key to attend gives NaN, as in PyTorch.
    pub fn forward_masked(
        &self,
        x: &Var,
        attn_mask: Option<&Tensor>,
        key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Var {
        if x.rank() == 2 {
            let kpm = key_padding_mask.map(|m| m.unsqueeze(0));
            return self.forward_masked(&x.unsqueeze(0), attn_mask, kpm.as_ref(), is_causal).squeeze(0);
        }
        let e = self.embed_dim();
        assert!(
            x.rank() == 3 && x.dims()[2] == e,
            "MultiheadSelfAttention: expected input [batch, seq, {e}], got shape {:?}",
            x.dims()
        );
        let (b, l, h) = (x.dims()[0], x.dims()[1], self.num_heads);
        let bias = self.in_proj_bias.as_ref().map(Parameter::var);
        let qkv = crate::functional::linear(x, &self.in_proj_weight.var(), bias.as_ref());
        // [b, l, e] -> [b, h, l, e / h]
        let heads = |t: &Var| t.reshape([b, l, h, e / h]).transpose(1, 2);
        let parts = qkv.chunk(3, -1);
        let (q, k, v) = (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]));
        let mask = self.merged_mask(attn_mask, key_padding_mask, is_causal, [b, h, l], x.dtype(), x.device());
        let p = if self.training.get() { self.dropout } else { 0.0 };
        let attn = scaled_dot_product_attention_with(&q, &k, &v, mask.as_ref(), p, false, None);
        self.out_proj.forward(&attn.transpose(1, 2).reshape([b, l, e]))
    }

    /// All masks as one additive float mask broadcasting to `[b, h, l, l]`.
    fn merged_mask(
        &self,
        attn_mask: Option<&Tensor>,
        key_padding_mask: Option<&Tensor>,
        is_causal: bool,
        [b, h, l]: [usize; 3],
        dtype: DType,
        device: Device,
    ) -> Option<Tensor> {
        let mut merged: Option<Tensor> = None;
        let mut add = |m: Tensor| {
            merged = Some(match merged.take() {
                Some(prev) => prev.add(&m),
                None => m,
            })
        };
        if let Some(m) = attn_mask {
            let m = additive_mask(m, true, dtype);
            add(match m.rank() {
                2 => m,
                3 if m.dims()[0] == b * h => m.reshape([b, h, l, l]),
                _ => panic!(
                    "MultiheadSelfAttention: attn_mask must be [{l}, {l}] or [{}, {l}, {l}], got shape {:?}",
                    b * h,
                    m.dims()
                ),
            });
        }
        if let Some(m) = key_padding_mask {
            assert_eq!(
                m.dims(),
                [b, l],
                "MultiheadSelfAttention: key_padding_mask must be [batch, seq] = [{b}, {l}], got shape {:?}",
                m.dims()
            );
            add(additive_mask(m, true, dtype).reshape([b, 1, 1, l]));
        }
        if is_causal {
            add(additive_mask(&causal_mask(l, l, device), true, dtype));
        }
        merged
    }
}

impl Module for MultiheadSelfAttention {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("in_proj_weight", &self.in_proj_weight);
        if let Some(b) = &self.in_proj_bias {
            v.param("in_proj_bias", b);
        }
        v.child("out_proj", &self.out_proj);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

impl Forward for MultiheadSelfAttention {
    /// Unmasked self-attention.
    fn forward(&self, x: &Var) -> Var {
        self.forward_masked(x, None, None, false)
    }
}
