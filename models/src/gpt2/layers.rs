//! GPT-2's pieces with Hugging Face's names: `Conv1D` (a linear layer whose weight is stored
//! `[in, out]`), the causal self-attention `attn.c_attn`/`attn.c_proj`, the MLP
//! `mlp.c_fc`/`mlp.c_proj`, and the pre-norm block `h.{i}`.

use super::Gpt2Config;
use crate::mask::additive_mask;
use crate::ModelError;
use oxtrain_autograd::Var;
use oxtrain_nn::functional::{dropout, scaled_dot_product_attention_with};
use oxtrain_nn::lora::{LoraHost, LoraSlot};
use oxtrain_nn::{init, Forward, LayerNorm, LayerNormConfig, Module, Parameter, TrainingFlag, Visitor};
use oxtrain_tensor::{DType, Device, Tensor};

/// Hugging Face's `Conv1D`: `y = x @ weight + bias` with `weight` `[in, out]` (the transpose of
/// `nn.Linear`'s), initialised N(0, std) with a zero bias.
#[derive(Debug)]
pub struct Conv1D {
    pub weight: Parameter,
    pub bias: Parameter,
    /// A LoRA adapter once `LoraModel` adds one (PEFT's `fan_in_fan_out`; not in the state dict).
    pub lora: LoraSlot,
}

impl Conv1D {
    pub fn new(nx: usize, nf: usize, std: f64, device: Device) -> oxtrain_tensor::Result<Conv1D> {
        let weight = Tensor::zeros([nx, nf], DType::F32, device)?;
        init::normal_(&weight, 0.0, std, None);
        Ok(Conv1D {
            weight: Parameter::new(weight),
            bias: Parameter::new(Tensor::zeros(nf, DType::F32, device)?),
            lora: LoraSlot::default(),
        })
    }
}

impl Module for Conv1D {
    fn visit(&self, v: &mut dyn Visitor) {
        v.param("weight", &self.weight);
        v.param("bias", &self.bias);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        self.lora.training_flag()
    }

    fn lora_host(&self) -> Option<LoraHost<'_>> {
        Some(LoraHost { weight: &self.weight, slot: &self.lora, fan_in_fan_out: true })
    }
}

impl Forward for Conv1D {
    fn forward(&self, x: &Var) -> Var {
        // One op (on CUDA the bias is added in the product's epilogue). Under autocast the bias
        // joins the product's 16-bit dtype, as in HF's `torch.addmm`, rather than promoting the
        // sum (and every op after it) to f32.
        self.lora.add_to(x, x.matmul_bias(&self.weight.var(), &self.bias.var()))
    }
}

/// The MLP's nonlinearity, from `config.activation_function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation GPT-2 was trained with.
    GeluTanh,
    /// `gelu`: the exact erf form.
    Gelu,
    Relu,
}

impl Activation {
    pub fn parse(name: &str) -> Result<Activation, ModelError> {
        match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::Gelu),
            "relu" => Ok(Activation::Relu),
            other => Err(ModelError::BadFile {
                path: "config.json".into(),
                reason: format!(
                    "activation_function `{other}` is not supported; use gelu_new, gelu_pytorch_tanh, gelu or relu"
                ),
            }),
        }
    }

    pub fn apply(self, x: &Var) -> Var {
        match self {
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Gelu => x.gelu(),
            Activation::Relu => x.relu(),
        }
    }
}

pub(crate) fn layer_norm(n: usize, eps: f64, device: Device) -> oxtrain_tensor::Result<LayerNorm> {
    LayerNorm::with_config([n], LayerNormConfig { eps, ..Default::default() }, device)
}

/// Causal multi-head self-attention (`GPT2Attention`).
#[derive(Debug)]
pub struct Gpt2Attention {
    pub c_attn: Conv1D,
    pub c_proj: Conv1D,
    pub n_head: usize,
    attn_pdrop: f64,
    resid_pdrop: f64,
    scale: bool,
    training: TrainingFlag,
}

impl Gpt2Attention {
    pub(crate) fn new(c: &Gpt2Config, device: Device) -> oxtrain_tensor::Result<Gpt2Attention> {
        let e = c.n_embd;
        assert!(
            c.n_head > 0 && e.is_multiple_of(c.n_head),
            "GPT-2: n_embd ({e}) must be divisible by n_head ({})",
            c.n_head
        );
        Ok(Gpt2Attention {
            c_attn: Conv1D::new(e, 3 * e, c.initializer_range, device)?,
            // GPT-2's scaled init of the projections that feed the residual stream.
            c_proj: Conv1D::new(e, e, c.initializer_range / (2.0 * c.n_layer as f64).sqrt(), device)?,
            n_head: c.n_head,
            attn_pdrop: c.attn_pdrop,
            resid_pdrop: c.resid_pdrop,
            scale: c.scale_attn_weights,
            training: TrainingFlag::default(),
        })
    }

    /// `x [B, T, E]`; `attention_mask [B, T]` of 1 (token) and 0 (padding), optional.
    pub fn forward_masked(&self, x: &Var, attention_mask: Option<&Tensor>) -> Var {
        let (b, t, e) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let h = self.n_head;
        // q, k and v from column slices of c_attn (the same arithmetic as splitting its output):
        // each comes out contiguous, so the head split is a view, and the backward slices the
        // small weight rather than scattering three gradients into a [B, T, 3E] buffer.
        let (w, bias) = (self.c_attn.weight.var(), self.c_attn.bias.var());
        // Under autocast the input is lowered once here, not once per product (three casts
        // forward, three gradients widened and summed backward).
        let x = &x.autocast_lower();
        // A LoRA adapter's update to all three, computed once and sliced as the weight is.
        let delta = self.c_attn.lora.get().map(|a| a.delta(x));
        let proj = |i: usize| {
            let y = x.matmul_bias(&w.narrow(1, i * e, e), &bias.narrow(0, i * e, e));
            match &delta {
                Some(d) => y.add(&d.narrow(2, i * e, e)),
                None => y,
            }
        };
        let heads = |v: &Var| v.reshape([b, t, h, e / h]).transpose(1, 2);
        let (q, k, v) = (heads(&proj(0)), heads(&proj(1)), heads(&proj(2)));
        let training = self.training.get();
        let p = if training { self.attn_pdrop } else { 0.0 };
        let scale = if self.scale { 1.0 / ((e / h) as f64).sqrt() } else { 1.0 };
        // Without padding the mask is the causal one, which sdpa applies itself (fused on CUDA,
        // no [T, T] mask built); with padding, HF's additive mask (the dtype's minimum).
        let y = if attention_mask.is_none() {
            scaled_dot_product_attention_with(&q, &k, &v, None, p, true, Some(scale))
        } else {
            let mask = additive_mask(attention_mask, true, [t, t], x.dtype(), "GPT-2")
                .map(|m| m.to_device(x.device()).expect("the mask on the input's device"));
            scaled_dot_product_attention_with(&q, &k, &v, mask.as_ref(), p, false, Some(scale))
        };
        let y = self.c_proj.forward(&y.transpose(1, 2).reshape([b, t, e]));
        dropout(&y, self.resid_pdrop, training)
    }
}

impl Module for Gpt2Attention {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("c_attn", &self.c_attn);
        v.child("c_proj", &self.c_proj);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

/// `GPT2MLP`: `c_fc`, activation, `c_proj`, dropout.
#[derive(Debug)]
pub struct Gpt2Mlp {
    pub c_fc: Conv1D,
    pub c_proj: Conv1D,
    pub act: Activation,
    resid_pdrop: f64,
    training: TrainingFlag,
}

impl Module for Gpt2Mlp {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("c_fc", &self.c_fc);
        v.child("c_proj", &self.c_proj);
    }

    fn training_flag(&self) -> Option<&TrainingFlag> {
        Some(&self.training)
    }
}

impl Forward for Gpt2Mlp {
    fn forward(&self, x: &Var) -> Var {
        let (fc, proj) = (&self.c_fc, &self.c_proj);
        let y = match self.act {
            // One op whose products carry the biases, the GELU and its derivative, and the
            // bias gradients in their epilogues on CUDA.
            Activation::GeluTanh => {
                x.gelu_tanh_mlp(&fc.weight.var(), &fc.bias.var(), &proj.weight.var(), &proj.bias.var())
            }
            act => proj.forward(&act.apply(&fc.forward(x))),
        };
        dropout(&y, self.resid_pdrop, self.training.get())
    }
}

/// One pre-norm transformer block (`GPT2Block`): `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Debug)]
pub struct Gpt2Block {
    pub ln_1: LayerNorm,
    pub attn: Gpt2Attention,
    pub ln_2: LayerNorm,
    pub mlp: Gpt2Mlp,
}

impl Gpt2Block {
    pub(crate) fn new(c: &Gpt2Config, act: Activation, device: Device) -> oxtrain_tensor::Result<Gpt2Block> {
        let (e, eps) = (c.n_embd, c.layer_norm_epsilon);
        Ok(Gpt2Block {
            ln_1: layer_norm(e, eps, device)?,
            attn: Gpt2Attention::new(c, device)?,
            ln_2: layer_norm(e, eps, device)?,
            mlp: Gpt2Mlp {
                c_fc: Conv1D::new(e, c.inner_dim(), c.initializer_range, device)?,
                c_proj: Conv1D::new(
                    c.inner_dim(),
                    e,
                    c.initializer_range / (2.0 * c.n_layer as f64).sqrt(),
                    device,
                )?,
                act,
                resid_pdrop: c.resid_pdrop,
                training: TrainingFlag::default(),
            },
        })
    }

    pub fn forward_masked(&self, x: &Var, attention_mask: Option<&Tensor>) -> Var {
        let (x, mlp_out) = self.forward_deferred(x, None, attention_mask);
        x.add(&mlp_out)
    }

    /// The block with its last residual add left to the caller, who fuses it with the norm
    /// that follows: `(h, m)` with `h = x + attn(ln_1(x))` and `m = mlp(ln_2(h))`, the block's
    /// output being `h + m`. `pending`, the previous block's `m`, is added to `x` first, fused
    /// with `ln_1`. Each add runs with the norm after it (one pass forward and backward), and
    /// the norms write the 16-bit dtype of the products they feed under autocast.
    pub fn forward_deferred(
        &self,
        x: &Var,
        pending: Option<&Var>,
        attention_mask: Option<&Tensor>,
    ) -> (Var, Var) {
        let (x, normed) = match pending {
            Some(p) => self.ln_1.forward_add_lowered(x, p),
            None => (x.clone(), self.ln_1.forward_lowered(x)),
        };
        let (h, normed) =
            self.ln_2.forward_add_lowered(&x, &self.attn.forward_masked(&normed, attention_mask));
        (h, self.mlp.forward(&normed))
    }
}

impl Module for Gpt2Block {
    fn visit(&self, v: &mut dyn Visitor) {
        v.child("ln_1", &self.ln_1);
        v.child("attn", &self.attn);
        v.child("ln_2", &self.ln_2);
        v.child("mlp", &self.mlp);
    }
}
