//! Layer norm: `layer_norm` as `torch.native_layer_norm`, with the output in a dtype of the
//! caller's choice (`layer_norm_to`: autocast's f32 layer norm and the cast its consumer
//! wants, in one pass), the residual add in front of it fused (`add_layer_norm`), and a backward
//! that also adds a residual gradient and writes a lowered copy of dx
//! (`layer_norm_backward_with`).
//!
//! On CUDA, rows of at most 1024 elements of f32, bf16 or f16 go to the register kernels of
//! `layer_rows.cu` (f32 statistics and arithmetic, as PyTorch's CUDA kernels); other inputs, and
//! every input when `OXTRAIN_DISABLE_FAST_LAYER_NORM=1`, go to the f64-accumulating kernels of
//! `norm.cu` and the CPU's, composed with casts and adds where the fused forms ask for them.

use super::layer_rows::{self, Backward, Forward};
use super::{
    check_param, cpu, cuda, device_param, float_input, layer_backward, param, stats_dtype, stats_tensor,
};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Element, Tensor};

/// Options of [`Tensor::layer_norm_backward_with`]; `Default` is layer norm's own backward.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayerNormGradOptions<'a> {
    /// A gradient that reached the normalised input by another path (the residual stream's,
    /// when that input is also an output of [`Tensor::add_layer_norm`]), of the input's shape:
    /// added to dx before dx is rounded to the input's dtype.
    pub residual: Option<&'a Tensor>,
    /// Also return dx rounded to this dtype (the gradient of an addend of another dtype).
    pub lowered: Option<DType>,
    /// Leave out the weight and bias gradients.
    pub skip_params: bool,
}

/// What [`Tensor::layer_norm_backward_with`] returns.
#[derive(Debug)]
pub struct LayerNormGrads {
    /// The input's gradient (plus the residual gradient), in the input's dtype.
    pub dx: Tensor,
    /// The same values rounded to [`LayerNormGradOptions::lowered`].
    pub dx_lowered: Option<Tensor>,
    /// `(dweight, dbias)` of shape `normalized_shape` in the compute dtype (f32, or f64 when
    /// the input or the output gradient is f64); `None` with `skip_params`.
    pub params: Option<(Tensor, Tensor)>,
}

/// The dtype layer norm computes in for tensors of `dtypes`: f64 when one is f64, else f32.
fn compute_dtype(dtypes: &[DType]) -> DType {
    if dtypes.contains(&DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

/// The dtype of `a + b` for floats, as PyTorch promotes: the wider, and f32 for bf16 with f16.
fn promoted(a: DType, b: DType) -> DType {
    match (a, b) {
        _ if a == b => a,
        (DType::F64, _) | (_, DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

/// An input seen as rows normalised over its trailing `normalized` dims.
struct Rows {
    /// Elements per row.
    len: usize,
    /// The input's shape with the normalised dims set to 1 (the statistics' shape).
    stats_shape: Vec<usize>,
}

fn rows_of(x: &Tensor, normalized: &Shape, op: &str) -> Rows {
    let axis = x.rank().checked_sub(normalized.rank());
    assert!(
        axis.is_some_and(|a| x.dims()[a..] == *normalized.dims()) && normalized.rank() > 0,
        "{op}: normalized_shape {:?} must be a non-empty tail of the input's shape {:?}",
        normalized.dims(),
        x.dims()
    );
    let mut stats_shape = x.dims().to_vec();
    stats_shape[axis.unwrap_or(0)..].iter_mut().for_each(|d| *d = 1);
    Rows { len: normalized.elem_count(), stats_shape }
}

/// A weight or bias as the register kernels read it: contiguous f32 of `shape`.
fn f32_param(t: Option<&Tensor>, shape: &Shape, what: &str, op: &str, input: &Tensor) -> Option<Tensor> {
    t.map(|t| {
        check_param(t, shape.dims(), what, op, input);
        t.to_dtype(DType::F32).contiguous()
    })
}

impl Tensor {
    /// Layer norm over the trailing dims `normalized_shape`, as `torch.native_layer_norm`:
    /// returns `(output, mean, rstd)`, where `rstd = 1 / sqrt(biased var + eps)` and `mean` and
    /// `rstd` have the input's shape with the normalised dims set to 1. `weight` and `bias`, when
    /// given, have shape `normalized_shape`.
    pub fn layer_norm(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> (Tensor, Tensor, Tensor) {
        self.layer_norm_to(normalized_shape, weight, bias, eps, self.dtype())
    }

    /// [`Tensor::layer_norm`] with the output in `out_dtype`: the input is read in its own
    /// dtype, statistics and arithmetic are f32 (f64 when the input or `out_dtype` is f64) and
    /// the output is rounded once. Equal to widening the input to that compute dtype, layer norm
    /// there, and casting the output: autocast's layer norm (which runs in f32) with the cast
    /// its consumer wants. `mean` and `rstd` come in the compute dtype.
    pub fn layer_norm_to(
        &self,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        out_dtype: DType,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "layer_norm";
        float_input(self, op);
        assert!(out_dtype.is_float(), "{op}: the output dtype must be a float dtype, got {out_dtype}");
        let normalized = normalized_shape.into();
        let rows = rows_of(self, &normalized, op);
        if self.device().is_cuda() && layer_rows::takes(rows.len, &[self.dtype(), out_dtype]) {
            let x = self.contiguous();
            let weight = f32_param(weight, &normalized, "weight", op, self);
            let bias = f32_param(bias, &normalized, "bias", op, self);
            let f = Forward {
                x: &x,
                y: None,
                sum_dtype: x.dtype(),
                out_dtype,
                weight: weight.as_ref(),
                bias: bias.as_ref(),
                eps,
                len: rows.len,
            };
            let (_, out, mean, rstd) = layer_rows::forward(&f, &rows.stats_shape);
            return (out, mean, rstd);
        }
        if out_dtype == self.dtype() {
            return self.layer_norm_in_own_dtype(&normalized, weight, bias, eps, &rows);
        }
        let c = compute_dtype(&[self.dtype(), out_dtype]);
        let (out, mean, rstd) =
            self.to_dtype(c).layer_norm_in_own_dtype(&normalized, weight, bias, eps, &rows);
        (out.to_dtype(out_dtype), mean, rstd)
    }

    /// `x + y` and layer norm of the sum, as one pass over both on CUDA (the residual add in
    /// front of a transformer block's norm): returns `(sum, out, mean, rstd)`. `sum` has the
    /// promoted dtype of `x` and `y` (the residual stream's) and is rounded to it before it is
    /// normalised; `out`, `mean` and `rstd` are `sum.layer_norm_to(.., out_dtype)`'s, which is
    /// what this computes elsewhere. `y` broadcasts against `x` there; the fused kernel takes
    /// equal shapes.
    pub fn add_layer_norm(
        &self,
        y: &Tensor,
        normalized_shape: impl Into<Shape>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        out_dtype: DType,
    ) -> (Tensor, Tensor, Tensor, Tensor) {
        let op = "add_layer_norm";
        float_input(self, op);
        float_input(y, op);
        self.same_device(y, op);
        let sum_dtype = promoted(self.dtype(), y.dtype());
        let normalized = normalized_shape.into();
        if self.device().is_cuda() && self.dims() == y.dims() {
            let rows = rows_of(self, &normalized, "layer_norm");
            if layer_rows::takes(rows.len, &[self.dtype(), y.dtype(), out_dtype]) {
                let (x, y) = (self.contiguous(), y.contiguous());
                let weight = f32_param(weight, &normalized, "weight", "layer_norm", self);
                let bias = f32_param(bias, &normalized, "bias", "layer_norm", self);
                let f = Forward {
                    x: &x,
                    y: Some(&y),
                    sum_dtype,
                    out_dtype,
                    weight: weight.as_ref(),
                    bias: bias.as_ref(),
                    eps,
                    len: rows.len,
                };
                let (sum, out, mean, rstd) = layer_rows::forward(&f, &rows.stats_shape);
                return (sum.expect("the kernel wrote the sum"), out, mean, rstd);
            }
        }
        let sum = self.to_dtype(sum_dtype).add(&y.to_dtype(sum_dtype));
        let (out, mean, rstd) = sum.layer_norm_to(normalized, weight, bias, eps, out_dtype);
        (sum, out, mean, rstd)
    }

    /// Layer norm in the input's dtype on the f64-accumulating kernels (CUDA's `norm.cu`, the
    /// CPU's `cpu.rs`).
    fn layer_norm_in_own_dtype(
        &self,
        normalized: &Shape,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        rows: &Rows,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "layer_norm";
        let (row_len, stats_shape) = (rows.len, &rows.stats_shape);
        if self.device().is_cuda() {
            let weight = weight.map(|w| device_param(w, normalized, "weight", op, self));
            let bias = bias.map(|b| device_param(b, normalized, "bias", op, self));
            let x = self.contiguous();
            let (out, mean, rstd) = match &*x.storage() {
                Storage::Cuda(s) => {
                    cuda::layer_norm(s, row_len, (weight.as_ref(), bias.as_ref()), eps, stats_shape)
                }
                Storage::Cpu(_) => unreachable!("a CUDA tensor's copy is on the CUDA device"),
            };
            let dtype = stats_dtype(self.dtype());
            return (
                Tensor::from_storage(Storage::Cuda(out), self.dims()),
                mean.to_dtype(dtype),
                rstd.to_dtype(dtype),
            );
        }
        let weight = weight.map(|w| param(w, normalized, "weight", op, self));
        let bias = bias.map(|b| param(b, normalized, "bias", op, self));
        let x = self.contiguous();
        let (out, mean, rstd) = match &*x.storage() {
            Storage::Cpu(s) => with_float_storage!(s, op, v, T => {
                let (out, mean, rstd) = cpu::layer_norm(v, row_len, weight.as_deref(), bias.as_deref(), eps);
                (T::into_storage(out), mean, rstd)
            }),
            Storage::Cuda(_) => unreachable!("a CPU tensor's copy is on the CPU"),
        };
        (
            Tensor::from_cpu(out, self.dims()),
            stats_tensor(mean, stats_shape.as_slice(), self.dtype()),
            stats_tensor(rstd, stats_shape.as_slice(), self.dtype()),
        )
    }

    /// Layer norm's gradients, `self` being the output gradient: `(dx, dweight, dbias)` for an
    /// input `x` normalised over its trailing dims `normalized_shape` with the `mean` and `rstd`
    /// that [`Tensor::layer_norm`] returned, and `weight` (1 when `None`). With
    /// `x_hat = (x - mean) * rstd` and `gy = dy * weight`, `dx = rstd * (gy - mean(gy) - x_hat *
    /// mean(gy * x_hat))`, each mean over a row; `dweight = sum(dy * x_hat)` and `dbias =
    /// sum(dy)` over the rows, of shape `normalized_shape`. All in `x`'s dtype: one pass over
    /// the rows on CUDA (see [`Tensor::layer_norm_backward_with`]), f64 sums elsewhere.
    pub fn layer_norm_backward(
        &self,
        x: &Tensor,
        (mean, rstd): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        normalized_shape: impl Into<Shape>,
    ) -> (Tensor, Tensor, Tensor) {
        let g = self.layer_norm_backward_with(x, (mean, rstd), weight, normalized_shape, Default::default());
        let (dw, db) = g.params.expect("asked for the parameter gradients");
        (g.dx, dw.to_dtype(x.dtype()), db.to_dtype(x.dtype()))
    }

    /// Layer norm's backward as [`Tensor::layer_norm_backward`] for an output gradient `self`
    /// and input `x` of any float dtypes (the op computed in f32, or f64 when one is f64), with
    /// the extras of `opts`: a residual gradient added to dx, dx also rounded to a second dtype,
    /// the parameter gradients left out. dx is computed in the compute dtype and rounded once
    /// to `x`'s dtype. On CUDA rows of at most 1024 elements take one kernel for all of it (the
    /// parameter gradients as per-block partial sums, then a small fixed-order reduction, so the
    /// result does not depend on timing); elsewhere the f64-accumulating backward, an add and
    /// casts.
    pub fn layer_norm_backward_with(
        &self,
        x: &Tensor,
        (mean, rstd): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        normalized_shape: impl Into<Shape>,
        opts: LayerNormGradOptions,
    ) -> LayerNormGrads {
        let op = "layer_norm_backward";
        let normalized = normalized_shape.into();
        self.check_layer_norm_backward(x, (mean, rstd), &normalized, opts.residual, op);
        let len = normalized.elem_count();
        let mut dtypes = vec![self.dtype(), x.dtype()];
        dtypes.extend(opts.residual.map(Tensor::dtype));
        dtypes.extend(opts.lowered);
        if x.device().is_cuda() && layer_rows::takes(len, &dtypes) {
            let (dy, xc) = (self.contiguous(), x.contiguous());
            let (mean, rstd) =
                (mean.to_dtype(DType::F32).contiguous(), rstd.to_dtype(DType::F32).contiguous());
            let weight = f32_param(weight, &normalized, "weight", op, x);
            let residual = opts.residual.map(Tensor::contiguous);
            let bw = Backward {
                dy: &dy,
                x: &xc,
                mean: &mean,
                rstd: &rstd,
                weight: weight.as_ref(),
                residual: residual.as_ref(),
                dx_dtype: x.dtype(),
                lowered: opts.lowered,
                param_grads: !opts.skip_params,
                len,
            };
            let (dx, dx_lowered, params) = layer_rows::backward(&bw);
            let params =
                params.map(|(dw, db)| (dw.reshape(normalized.dims()), db.reshape(normalized.dims())));
            return LayerNormGrads { dx, dx_lowered, params };
        }
        let c = compute_dtype(&[self.dtype(), x.dtype()]);
        let (dx, dw, db) = self.to_dtype(c).layer_norm_backward_in_own_dtype(
            &x.to_dtype(c),
            (mean, rstd),
            weight,
            &normalized,
        );
        let dx = match opts.residual {
            Some(r) => dx.add(&r.to_dtype(c)),
            None => dx,
        };
        LayerNormGrads {
            dx_lowered: opts.lowered.map(|d| dx.to_dtype(d)),
            dx: dx.to_dtype(x.dtype()),
            params: (!opts.skip_params).then_some((dw, db)),
        }
    }

    /// Panics unless `self` (dy), `x`, the statistics and the residual gradient fit together.
    fn check_layer_norm_backward(
        &self,
        x: &Tensor,
        (mean, rstd): (&Tensor, &Tensor),
        normalized: &Shape,
        residual: Option<&Tensor>,
        op: &str,
    ) {
        float_input(self, op);
        float_input(x, op);
        self.same_device(x, op);
        assert!(
            self.dims() == x.dims()
                && normalized.rank() > 0
                && x.rank() >= normalized.rank()
                && x.dims()[x.rank() - normalized.rank()..] == *normalized.dims(),
            "{op}: the output gradient {:?} and input {:?} must have one shape ending in normalized_shape {:?}",
            self.dims(),
            x.dims(),
            normalized.dims()
        );
        let rows = x.elem_count().checked_div(normalized.elem_count()).unwrap_or(0);
        for (t, what) in [(mean, "mean"), (rstd, "rstd")] {
            x.same_device(t, op);
            assert!(
                t.elem_count() == rows,
                "{op}: {what} must have one value per row ({rows}), got shape {:?}",
                t.dims()
            );
        }
        if let Some(r) = residual {
            x.same_device(r, op);
            float_input(r, op);
            assert!(
                r.dims() == x.dims(),
                "{op}: the residual gradient {:?} must have the input's shape {:?}",
                r.dims(),
                x.dims()
            );
        }
    }

    /// The f64-accumulating backward for `self` and `x` of one dtype: `(dx, dweight, dbias)` in
    /// that dtype (one kernel for dx and one for the column sums on CUDA).
    fn layer_norm_backward_in_own_dtype(
        &self,
        x: &Tensor,
        (mean, rstd): (&Tensor, &Tensor),
        weight: Option<&Tensor>,
        normalized: &Shape,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "layer_norm_backward";
        let len = normalized.elem_count();
        let rows = x.elem_count().checked_div(len).unwrap_or(0);
        let (dy, xc) = (self.contiguous(), x.contiguous());
        let (dx, dw, db) = if x.device().is_cuda() {
            let stats = |t: &Tensor| t.to_dtype(DType::F64).contiguous();
            let (mean, rstd) = (stats(mean), stats(rstd));
            let weight = weight.map(|w| device_param(w, normalized, "weight", op, x));
            let (dx, dw, db) = match (&*dy.storage(), &*xc.storage()) {
                (Storage::Cuda(g), Storage::Cuda(v)) => {
                    cuda::layer_norm_backward(g, v, (rows, len), (&mean, &rstd, weight.as_ref()))
                }
                _ => unreachable!("{op}: checked to be on one device"),
            };
            (Tensor::from_storage(Storage::Cuda(dx), x.dims()), dw, db)
        } else {
            let (mean, rstd) = (mean.kernel_f64_values(), rstd.kernel_f64_values());
            let weight = weight.map(|w| param(w, normalized, "weight", op, x));
            let st = layer_backward::RowStats { mean: &mean, rstd: &rstd, weight: weight.as_deref() };
            let (dx, (dw, db)) = match (&*dy.storage(), &*xc.storage()) {
                (Storage::Cpu(g), Storage::Cpu(v)) => with_float_storage!(g, op, gv, T => {
                    let xv = v.as_slice::<T>();
                    (T::into_storage(layer_backward::input_grad(gv, xv, len, &st)),
                        layer_backward::param_grads(gv, xv, len, &st))
                }),
                _ => unreachable!("{op}: checked to be on one device"),
            };
            let f64s = |v: Vec<f64>| Tensor::from_cpu(f64::into_storage(v), [len]);
            (Tensor::from_cpu(dx, x.dims()), f64s(dw), f64s(db))
        };
        let param = |t: Tensor| t.to_dtype(x.dtype()).reshape(normalized.dims());
        (dx, param(dw), param(db))
    }
}
