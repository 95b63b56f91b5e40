//! Matrix products fused with the elementwise work a linear layer puts around them:
//! `x @ w + b`; `gelu_tanh(x @ w + b)` keeping its input for the backward; the backward's
//! `(g @ w) * gelu_tanh'(pre)` with its column sums (the bias gradient); a weight gradient
//! with the bias gradient; and a product whose rows are padded so that the next products
//! read them aligned.
//!
//! On CUDA each is one cuBLASLt product with an epilogue (`epilogue.rs`) where the host checks
//! pass and cuBLASLt takes it; otherwise (other devices, other dtypes, unaligned buffers,
//! cuBLASLt refusing or disabled) the same values are composed from `matmul` and elementwise
//! ops. The two agree to the output dtype's rounding: an epilogue rounds once at the end, the
//! composition after each op.

use super::cuda::{gemm_epilogue, Operand};
use super::epilogue::{Epilogue, EpilogueKind};
use crate::cuda::CudaStorage;
use crate::storage::Storage;
use crate::Tensor;
use std::cell::Cell;

thread_local! {
    static EPILOGUE_PRODUCTS: Cell<usize> = const { Cell::new(0) };
}

/// How many products this thread has run with a cuBLASLt epilogue so far: a diagnostic, for
/// tests and benchmarks that check the fused paths are taken rather than their compositions.
pub fn epilogue_products_on_this_thread() -> usize {
    EPILOGUE_PRODUCTS.with(Cell::get)
}

/// The outputs of one fused product: the result, the bias (gradient) vector it wrote, and the
/// GELU input matrix it wrote.
struct Fused {
    out: CudaStorage,
    vector: Option<CudaStorage>,
    aux: Option<CudaStorage>,
}

/// Device address and unit-stride check of a 1-D tensor (a bias).
fn vector_ptr(t: &Tensor, s: &CudaStorage) -> Option<u64> {
    (t.rank() == 1 && (t.strides()[0] == 1 || t.dims()[0] <= 1))
        .then(|| s.ptr() + (t.layout().offset() * s.dtype().size_in_bytes()) as u64)
}

/// `lhs [m, k] @ rhs [k, n]` (2-D, any strides cuBLAS reads) with the `kind` epilogue: `bias`
/// is read by `Bias` and `GeluAuxBias`, `pre` (`[m, n]`, unit column stride) by the GELU
/// gradients. `None` when the epilogue cannot be used (see `cuda::gemm_epilogue`).
fn fused_cuda(
    lhs: &Tensor,
    rhs: &Tensor,
    kind: EpilogueKind,
    bias: Option<&Tensor>,
    pre: Option<&Tensor>,
) -> Option<Fused> {
    let (m, k, n) = (lhs.dims()[0], lhs.dims()[1], rhs.dims()[1]);
    let (ls, rs) = (lhs.storage(), rhs.storage());
    let (Storage::Cuda(a), Storage::Cuda(b)) = (&*ls, &*rs) else { return None };
    let (dev, dtype) = (a.device(), a.dtype());
    let alloc = |len: usize| CudaStorage::alloc(dev, dtype, len).ok();
    let bias_guard = bias.map(Tensor::storage);
    let bias_in = match (bias, bias_guard.as_deref()) {
        (Some(t), Some(Storage::Cuda(s))) if s.dtype() == dtype => Some(vector_ptr(t, s)?),
        (None, _) => None,
        _ => return None,
    };
    let pre_guard = pre.map(Tensor::storage);
    let pre_in = match (pre, pre_guard.as_deref()) {
        (Some(t), Some(Storage::Cuda(s))) if s.dtype() == dtype && (t.strides()[1] == 1 || n == 1) => {
            let offset = (t.layout().offset() * dtype.size_in_bytes()) as u64;
            Some((s.ptr() + offset, if m <= 1 { n } else { t.strides()[0] }))
        }
        (None, _) => None,
        _ => return None,
    };
    let out = alloc(m * n)?;
    let vector = match kind {
        EpilogueKind::BGradB => Some(alloc(m)?),
        EpilogueKind::BGradA | EpilogueKind::DGeluBGrad => Some(alloc(n)?),
        _ => None,
    };
    let aux = if kind == EpilogueKind::GeluAuxBias { Some(alloc(m * n)?) } else { None };
    let (aux_ptr, aux_ld) = match (&aux, pre_in) {
        (Some(s), _) => (s.ptr(), n),
        (None, Some(p)) => p,
        (None, None) => (0, 0),
    };
    let bias_ptr = bias_in.or(vector.as_ref().map(CudaStorage::ptr)).unwrap_or(0);
    let epilogue = Epilogue { kind, bias: bias_ptr, aux: aux_ptr, aux_ld };
    let operand = |t: &Tensor, s: &CudaStorage| {
        Operand::new(s, t.layout().offset(), (t.strides()[0], t.strides()[1]), 0)
    };
    let c = Operand::new(&out, 0, (n, 1), 0);
    let done = gemm_epilogue(dev, &out.stream(), (m, n, k), operand(lhs, a), operand(rhs, b), c, &epilogue);
    if done {
        EPILOGUE_PRODUCTS.with(|c| c.set(c.get() + 1));
    }
    done.then_some(Fused { out, vector, aux })
}

/// Panics naming `op` unless `x [.., k] @ w [k, n]` fits and `x`, `w` (and `extra`) share
/// dtype and device; returns `(rows, k, n)` with `rows` the product of `x`'s leading dims.
fn check_linear(op: &str, x: &Tensor, w: &Tensor, extra: &[&Tensor]) -> (usize, usize, usize) {
    assert!(
        x.rank() >= 1 && w.rank() == 2 && x.dims()[x.rank() - 1] == w.dims()[0],
        "{op}: input of shape {:?} does not fit a weight of shape {:?} ([in, out])",
        x.dims(),
        w.dims()
    );
    assert!(x.dtype().is_float(), "{op}: expected floating-point tensors, got {}", x.dtype());
    for t in std::iter::once(&w).chain(extra) {
        x.same_device(t, op);
        x.same_dtype(t, op);
    }
    let k = w.dims()[0];
    (x.elem_count().checked_div(k).unwrap_or(0), k, w.dims()[1])
}

/// The output shape of `x [.., k] @ w [k, n]`: `x`'s leading dims and `n`.
fn out_dims(x: &Tensor, n: usize) -> Vec<usize> {
    let mut dims = x.dims()[..x.rank() - 1].to_vec();
    dims.push(n);
    dims
}

impl Tensor {
    /// On CUDA, the fused product of `self` as `[rows, k]` with `rhs [k, n]`; `None` off CUDA,
    /// for empty products and whenever the epilogue cannot be used.
    fn try_fused(
        &self,
        rhs: &Tensor,
        kind: EpilogueKind,
        bias: Option<&Tensor>,
        pre: Option<&Tensor>,
    ) -> Option<Fused> {
        let (k, n) = (rhs.dims()[0], rhs.dims()[1]);
        let rows = self.elem_count().checked_div(k).unwrap_or(0);
        if !self.device().is_cuda() || rows * k * n == 0 {
            return None;
        }
        let lhs = self.reshape([rows, k]);
        let pre = pre.map(|p| p.reshape([rows, n]));
        fused_cuda(&lhs, rhs, kind, bias, pre.as_ref())
    }

    /// `self @ weight + bias` for `self [.., k]`, `weight [k, n]` and `bias [n]` of one dtype
    /// (a linear layer with its weight stored `[in, out]`; pass `w.t()` for `[out, in]`). On
    /// CUDA the bias is added in the product's epilogue.
    pub fn matmul_bias(&self, weight: &Tensor, bias: &Tensor) -> Tensor {
        let (_, _, n) = check_linear("matmul_bias", self, weight, &[bias]);
        assert!(bias.dims() == [n], "matmul_bias: bias of shape {:?} for {n} outputs", bias.dims());
        match self.try_fused(weight, EpilogueKind::Bias, Some(bias), None) {
            Some(f) => Tensor::from_storage(Storage::Cuda(f.out), out_dims(self, n)),
            None => self.matmul(weight).add(bias),
        }
    }

    /// `(gelu_tanh(pre), pre)` with `pre = self @ weight + bias` (shapes as
    /// [`matmul_bias`](Tensor::matmul_bias)): GPT-2's MLP input layer, `pre` kept for the
    /// backward. On CUDA one product writes both.
    pub fn matmul_bias_gelu_tanh(&self, weight: &Tensor, bias: &Tensor) -> (Tensor, Tensor) {
        let (_, _, n) = check_linear("matmul_bias_gelu_tanh", self, weight, &[bias]);
        assert!(bias.dims() == [n], "matmul_bias_gelu_tanh: bias of shape {:?} for {n} outputs", bias.dims());
        match self.try_fused(weight, EpilogueKind::GeluAuxBias, Some(bias), None) {
            Some(Fused { out, aux: Some(aux), .. }) => {
                let dims = out_dims(self, n);
                (
                    Tensor::from_storage(Storage::Cuda(out), dims.as_slice()),
                    Tensor::from_storage(Storage::Cuda(aux), dims),
                )
            }
            _ => {
                let pre = self.matmul_bias(weight, bias);
                (pre.gelu_tanh(), pre)
            }
        }
    }

    /// `(d, column sums of d)` with `d = (self @ rhs) * gelu_tanh'(pre)`, for `self [.., k]`,
    /// `rhs [k, n]` and `pre` of the output's shape `[.., n]`: the gradient at a GELU's input
    /// (`pre`) from the gradient `self` of the product it feeds, and the gradient of the bias
    /// added before the GELU. On CUDA the GELU's derivative (and the sums) are the product's
    /// epilogue.
    pub fn matmul_gelu_tanh_backward(&self, rhs: &Tensor, pre: &Tensor) -> (Tensor, Tensor) {
        let op = "matmul_gelu_tanh_backward";
        let (rows, _, n) = check_linear(op, self, rhs, &[pre]);
        let dims = out_dims(self, n);
        assert!(
            pre.dims() == dims.as_slice(),
            "{op}: pre of shape {:?} for an output of {dims:?}",
            pre.dims()
        );
        if dgelu_epilogue() {
            if let Some(Fused { out, vector: Some(sums), .. }) =
                self.try_fused(rhs, EpilogueKind::DGeluBGrad, None, Some(pre))
            {
                return (
                    Tensor::from_storage(Storage::Cuda(out), dims),
                    Tensor::from_storage(Storage::Cuda(sums), [n]),
                );
            }
        }
        let fused =
            if dgelu_epilogue() { self.try_fused(rhs, EpilogueKind::DGelu, None, Some(pre)) } else { None };
        let d = match fused {
            Some(f) => Tensor::from_storage(Storage::Cuda(f.out), dims),
            None => self.matmul(rhs).gelu_backward(pre, true),
        };
        let sums = d.reshape([rows, n]).sum(0, false);
        (d, sums)
    }

    /// `(self @ rhs, rhs summed over its rows)` for 2-D `self [m, k]` and `rhs [k, n]`: a weight
    /// gradient `x^T @ g` with the bias gradient `sum of g's rows` (`self = x.t()`, `rhs = g`).
    /// On CUDA the sums come from the product's epilogue.
    pub fn matmul_and_rhs_col_sums(&self, rhs: &Tensor) -> (Tensor, Tensor) {
        let (m, n) = check_2d("matmul_and_rhs_col_sums", self, rhs);
        match self.try_fused(rhs, EpilogueKind::BGradA, None, None) {
            Some(Fused { out, vector: Some(sums), .. }) => (
                Tensor::from_storage(Storage::Cuda(out), [m, n]),
                Tensor::from_storage(Storage::Cuda(sums), [n]),
            ),
            _ => (self.matmul(rhs), rhs.sum(0, false)),
        }
    }

    /// `(self @ rhs, self summed over its columns)` for 2-D `self [m, k]` and `rhs [k, n]`: the
    /// transposed weight gradient `g^T @ x` of a weight stored `[out, in]`, with the bias
    /// gradient (`self = g.t()`, `rhs = x`). On CUDA the sums come from the product's epilogue.
    pub fn matmul_and_lhs_row_sums(&self, rhs: &Tensor) -> (Tensor, Tensor) {
        let (m, n) = check_2d("matmul_and_lhs_row_sums", self, rhs);
        match self.try_fused(rhs, EpilogueKind::BGradB, None, None) {
            Some(Fused { out, vector: Some(sums), .. }) => (
                Tensor::from_storage(Storage::Cuda(out), [m, n]),
                Tensor::from_storage(Storage::Cuda(sums), [m]),
            ),
            _ => (self.matmul(rhs), self.sum(1, false)),
        }
    }
}

/// Whether the GELU backward runs as the product's epilogue (`OXTRAIN_DGELU_EPILOGUE=1`). Off by
/// default: on the H200 cuBLASLt's DGELU_BGRAD product of GPT-2's MLP took four times the plain
/// product, more than the product, the separate GELU backward pass and the bias sum together
/// (`gpt2_matmuls`' epilogue table).
fn dgelu_epilogue() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("OXTRAIN_DGELU_EPILOGUE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// `(m, n)` after checking `lhs [m, k] @ rhs [k, n]` are 2-D, fit, and share dtype and device.
fn check_2d(op: &str, lhs: &Tensor, rhs: &Tensor) -> (usize, usize) {
    assert!(
        lhs.rank() == 2 && rhs.rank() == 2 && lhs.dims()[1] == rhs.dims()[0],
        "{op}: expected [m, k] and [k, n], got shapes {:?} and {:?}",
        lhs.dims(),
        rhs.dims()
    );
    check_linear(op, lhs, rhs, &[]);
    (lhs.dims()[0], rhs.dims()[1])
}
