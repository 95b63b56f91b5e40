//! Gradients of layer norm (kernels in the tensor crate's `ops/norm`): `layer_norm`, its
//! autocast-lowered form, and the residual add fused in front of it (`add_layer_norm`), whose
//! two outputs (the sum and the normalised sum) share one backward.
//!
//! Under autocast layer norm computes in f32, as `torch.autocast` runs it, but reads its input
//! in whatever dtype it has (no widening cast in front: the kernel widens as it loads), and
//! `layer_norm_lowered` writes its output in the region's 16-bit dtype, which is
//! `layer_norm(..).autocast_lower()` with one rounding in one pass.

use crate::Var;
use oxtrain_tensor::{DType, LayerNormGradOptions, Shape, Tensor};
use std::sync::OnceLock;

/// Whether `add_layer_norm` records one op (else the add and the layer norm, the same numbers
/// in more passes): on unless `OXTRAIN_DISABLE_FUSED_ADD_LAYER_NORM` is set to other than `0`.
fn fused_add() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("OXTRAIN_DISABLE_FUSED_ADD_LAYER_NORM").is_ok_and(|v| !v.is_empty() && v != "0")
    })
}

/// The dtype layer norm writes for an input of `input`: in an autocast region f32 (or, when
/// `lowered`, the region's 16-bit dtype) unless the input is f64; outside one, the input's.
fn output_dtype(input: DType, lowered: bool) -> DType {
    match crate::autocast_dtype() {
        Some(low) if input != DType::F64 => {
            if lowered {
                low
            } else {
                DType::F32
            }
        }
        _ => input,
    }
}

/// `grads` (the gradients of the ops' leading inputs) followed by dweight and dbias for the
/// weight and bias inputs the op has, each only where `needs` asks.
fn with_param_grads(
    mut grads: Vec<Option<Tensor>>,
    params: Option<(Tensor, Tensor)>,
    has_weight: bool,
    needs: &[bool],
) -> Vec<Option<Tensor>> {
    let (dw, db) = params.unzip();
    if has_weight {
        let i = grads.len();
        grads.push(dw.filter(|_| needs[i]));
    }
    if needs.len() > grads.len() {
        let i = grads.len();
        grads.push(db.filter(|_| needs[i]));
    }
    grads
}

impl Var {
    /// Layer norm over the trailing dims `normalized_shape`, as `F.layer_norm`. In an autocast
    /// region it computes in f32 and returns f32, as PyTorch's autocast does.
    pub fn layer_norm(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Var {
        self.layer_norm_as(normalized_shape.into(), weight, bias, eps, false)
    }

    /// `self.layer_norm(..).autocast_lower()` as one op: in an autocast region layer norm
    /// computes in f32 and writes the region's 16-bit dtype, rounding once (for a consumer that
    /// is a matrix product, which would lower it anyway); outside one, [`Var::layer_norm`].
    pub fn layer_norm_lowered(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Var {
        self.layer_norm_as(normalized_shape.into(), weight, bias, eps, true)
    }

    fn layer_norm_as(
        &self,
        normalized: Shape,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
        lowered: bool,
    ) -> Var {
        let out_dtype = output_dtype(self.dtype(), lowered);
        let x = self.tensor().clone();
        let (out, mean, rstd) =
            x.layer_norm_to(&normalized, weight.map(Var::tensor), bias.map(Var::tensor), eps, out_dtype);
        let w = weight.map(|w| w.tensor().clone());
        let has_weight = weight.is_some();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        // One kernel for dx and the parameters' partial column sums, from the statistics the
        // forward saved; dx comes in the input's dtype.
        Var::from_op("layer_norm", out, &inputs, move |g, needs| {
            let opts =
                LayerNormGradOptions { skip_params: !needs[1..].contains(&true), ..Default::default() };
            let grads = g.layer_norm_backward_with(&x, (&mean, &rstd), w.as_ref(), normalized.clone(), opts);
            with_param_grads(vec![needs[0].then_some(grads.dx)], grads.params, has_weight, needs)
        })
    }

    /// `(x + y, layer_norm(x + y))` as one op, the residual add that meets a transformer's
    /// norm: the sum (the residual stream, in the promoted dtype of `x` and `y`) and its layer
    /// norm (dtype as [`Var::layer_norm`]) in one pass forward, and in one pass backward the
    /// gradient of both outputs to `x` and `y` (`y`'s written in its own dtype by the same
    /// kernel) with the parameters' column sums. The same numbers as `x.add(y)` followed by
    /// `layer_norm`. `OXTRAIN_DISABLE_FUSED_ADD_LAYER_NORM=1` records those two ops instead.
    pub fn add_layer_norm(
        &self,
        y: &Var,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Var) {
        self.add_layer_norm_as(y, normalized_shape.into(), weight, bias, eps, false)
    }

    /// [`Var::add_layer_norm`] whose normalised output is [`Var::layer_norm_lowered`]'s: in
    /// an autocast region the 16-bit dtype its matrix-product consumer wants.
    pub fn add_layer_norm_lowered(
        &self,
        y: &Var,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Var) {
        self.add_layer_norm_as(y, normalized_shape.into(), weight, bias, eps, true)
    }

    fn add_layer_norm_as(
        &self,
        y: &Var,
        normalized: Shape,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
        lowered: bool,
    ) -> (Var, Var) {
        if !fused_add() {
            let sum = self.add(y);
            let normed = sum.layer_norm_as(normalized, weight, bias, eps, lowered);
            return (sum, normed);
        }
        let out_dtype = output_dtype(crate::autocast::promoted(self.dtype(), y.dtype()), lowered);
        let (w_t, b_t) = (weight.map(Var::tensor), bias.map(Var::tensor));
        let (sum, normed, mean, rstd) =
            self.tensor().add_layer_norm(y.tensor(), &normalized, w_t, b_t, eps, out_dtype);
        let saved_sum = sum.clone();
        let y_dtype = y.dtype();
        let w = weight.map(|w| w.tensor().clone());
        let has_weight = weight.is_some();
        let mut inputs = vec![self, y];
        inputs.extend(weight);
        inputs.extend(bias);
        let outputs =
            Var::from_multi_output_op("add_layer_norm", vec![sum, normed], &inputs, move |g, needs| {
                let (d_sum, d_normed) = (g[0].as_ref(), g[1].as_ref());
                // The gradient of both addends is the sum's; y's is written in y's dtype by the
                // same kernel when that differs (the engine would cast it in a pass of its own).
                let lowered = (needs[1] && y_dtype != saved_sum.dtype()).then_some(y_dtype);
                let (dx, dy_lowered, params) = match d_normed {
                    Some(dn) => {
                        let skip_params = !needs[2..].contains(&true);
                        let opts = LayerNormGradOptions { residual: d_sum, lowered, skip_params };
                        let r = dn.layer_norm_backward_with(
                            &saved_sum,
                            (&mean, &rstd),
                            w.as_ref(),
                            normalized.clone(),
                            opts,
                        );
                        (r.dx, r.dx_lowered, r.params)
                    }
                    None => {
                        (d_sum.expect("the backward runs when an output has a gradient").clone(), None, None)
                    }
                };
                let dy = needs[1].then(|| dy_lowered.unwrap_or_else(|| dx.clone()));
                with_param_grads(vec![needs[0].then_some(dx), dy], params, has_weight, needs)
            });
        let mut outputs = outputs.into_iter();
        let sum = outputs.next().expect("two outputs");
        (sum, outputs.next().expect("two outputs"))
    }
}
