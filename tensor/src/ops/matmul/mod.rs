//! Matrix products with `torch.matmul` semantics: dot, matrix-vector, matrix-matrix and batched
//! products whose batch dims broadcast. Operands go to GEMM with their strides, so transposed,
//! narrowed and expanded views are multiplied without a copy.

pub(crate) mod cpu;
mod cublaslt;
pub(crate) mod cuda;
mod epilogue;
pub(crate) mod fused;
#[cfg(test)]
mod fused_tests;
#[cfg(test)]
pub(crate) mod tests;

use crate::shape::broadcast_shapes;
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Layout, Tensor};
use cpu::Batched;

impl Tensor {
    /// The matrix product, as `torch.matmul`:
    /// - 1-D @ 1-D is the dot product (a rank-0 tensor);
    /// - 2-D @ 2-D is the matrix product;
    /// - a 1-D left operand is a row vector `[1, k]`, a 1-D right operand a column `[k, 1]`,
    ///   and the added dim is removed from the result;
    /// - with more dims, the leading (batch) dims broadcast: `[B, 1, M, K] @ [H, K, N]` gives
    ///   `[B, H, M, N]`.
    ///
    /// Float dtypes only; bf16 and f16 are computed with f32 accumulation and rounded once (on
    /// CUDA through cuBLAS; f32 there uses TF32 only when `cuda::set_allow_tf32(true)`).
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        self.same_device(rhs, "matmul");
        self.same_dtype(rhs, "matmul");
        assert!(
            self.rank() >= 1 && rhs.rank() >= 1,
            "matmul: both arguments need at least one dim, got shapes {:?} and {:?}",
            self.dims(),
            rhs.dims()
        );
        assert!(
            self.dtype().is_float(),
            "matmul: expected floating-point tensors, got {} with shapes {:?} and {:?}",
            self.dtype(),
            self.dims(),
            rhs.dims()
        );
        if self.dtype() == DType::BF16 && self.device() == Device::Cpu {
            // No bf16 GEMM kernel exists in the gemm crate: widen to f32 (exact), multiply with
            // f32 accumulation, round once, as PyTorch's CPU bf16 matmul does.
            return self.to_dtype(DType::F32).matmul(&rhs.to_dtype(DType::F32)).to_dtype(DType::BF16);
        }
        let lhs = if self.rank() == 1 { self.unsqueeze(0) } else { self.clone() };
        let rhs2 = if rhs.rank() == 1 { rhs.unsqueeze(1) } else { rhs.clone() };
        let (lr, rr) = (lhs.rank(), rhs2.rank());
        let (m, k) = (lhs.dims()[lr - 2], lhs.dims()[lr - 1]);
        let (k2, n) = (rhs2.dims()[rr - 2], rhs2.dims()[rr - 1]);
        assert!(
            k == k2,
            "matmul: shapes {:?} and {:?} cannot be multiplied ({m}x{k} and {k2}x{n})",
            self.dims(),
            rhs.dims()
        );
        let (lhs_batch, rhs_batch) = (&lhs.dims()[..lr - 2], &rhs2.dims()[..rr - 2]);
        let broadcastable =
            lhs_batch.iter().rev().zip(rhs_batch.iter().rev()).all(|(&x, &y)| x == y || x == 1 || y == 1);
        assert!(
            broadcastable,
            "matmul: shapes {:?} and {:?} cannot be broadcast together (batch dims {lhs_batch:?} and {rhs_batch:?})",
            self.dims(),
            rhs.dims()
        );
        let batch = broadcast_shapes(lhs_batch, rhs_batch, "matmul").into_vec();
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        let out = lhs.batched_matmul(&rhs2, &batch, (m, n, k));
        let out = Tensor::from_storage(out, out_shape);
        let out = if self.rank() == 1 { out.squeeze(-2) } else { out };
        if rhs.rank() == 1 {
            out.squeeze(-1)
        } else {
            out
        }
    }

    /// Batched matrix product of two 3-D tensors with the same batch size, as `torch.bmm`
    /// (no broadcasting).
    pub fn bmm(&self, rhs: &Tensor) -> Tensor {
        assert!(
            self.rank() == 3 && rhs.rank() == 3,
            "bmm: expected two 3-D tensors, got shapes {:?} and {:?}",
            self.dims(),
            rhs.dims()
        );
        assert!(
            self.dims()[0] == rhs.dims()[0] && self.dims()[2] == rhs.dims()[1],
            "bmm: shapes {:?} and {:?} do not match ([b, m, k] and [b, k, n] expected)",
            self.dims(),
            rhs.dims()
        );
        self.matmul(rhs)
    }

    /// `self [batch.., m, k] @ rhs [batch.., k, n]` with the batch dims broadcast to `batch`.
    fn batched_matmul(&self, rhs: &Tensor, batch: &[usize], (m, n, k): (usize, usize, usize)) -> Storage {
        let plan = plan_batches(self.layout(), rhs.layout(), batch, (m, n, k));
        if let Device::Cuda(_) = self.device() {
            // cuBLAS reads a matrix in place when its rows or its columns have unit stride; any
            // other (a slice with a step on both axes, a broadcast row) is copied first.
            let (lhs_ok, rhs_ok) = cuda::plan_is_expressible(&plan);
            if !lhs_ok {
                return self.contiguous().batched_matmul(rhs, batch, (m, n, k));
            }
            if !rhs_ok {
                return self.batched_matmul(&rhs.contiguous(), batch, (m, n, k));
            }
        }
        let storage = match (&*self.storage(), &*rhs.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(match (a, b) {
                (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(cpu::batched_matmul(a, b, &plan)),
                (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(cpu::batched_matmul(a, b, &plan)),
                (CpuStorage::F16(a), CpuStorage::F16(b)) => CpuStorage::F16(cpu::batched_matmul(a, b, &plan)),
                (a, _) => unreachable!("matmul: dtype {} was checked to be f32, f64 or f16", a.dtype()),
            }),
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::batched_matmul(a, b, &plan, n)),
            _ => unreachable!("matmul: operands were checked to be on one device"),
        };
        storage
    }
}

/// Where each product of a broadcast batch reads its operands.
fn plan_batches(lhs: &Layout, rhs: &Layout, batch: &[usize], (m, n, k): (usize, usize, usize)) -> Batched {
    let with_batch = |l: &Layout, rows: usize, cols: usize| {
        let mut target = batch.to_vec();
        target.extend([rows, cols]);
        let b = l.broadcast_as(&target).expect("matmul: batch dims were checked to broadcast");
        let r = b.rank();
        let strides = (b.strides()[r - 2], b.strides()[r - 1]);
        (b, strides)
    };
    let (lb, lhs_strides) = with_batch(lhs, m, k);
    let (rb, rhs_strides) = with_batch(rhs, k, n);
    let nb = batch.len();
    let rhs_is_shared = rb.strides()[..nb].iter().zip(batch).all(|(&s, &d)| s == 0 || d == 1);
    // `x [B, T, C] @ w [C, N]`: when the rhs is the same matrix for every product and the lhs
    // batch dims stack its rows evenly, the whole batch is one tall product, far better for
    // GEMM than many short ones.
    if rhs_is_shared && m > 0 {
        if let Some(row_stride) = merged_stride(&lb.dims()[..=nb], &lb.strides()[..=nb]) {
            let rows = batch.iter().product::<usize>() * m;
            return Batched {
                m: rows,
                n,
                k,
                lhs_offsets: vec![lb.offset()],
                lhs_strides: (row_stride, lhs_strides.1),
                rhs_offsets: vec![rb.offset()],
                rhs_strides,
            };
        }
    }
    let batch_offsets = |l: &Layout| {
        let bl = Layout::new(batch, l.strides()[..nb].to_vec(), l.offset());
        crate::strided::offsets(&bl)
    };
    Batched {
        m,
        n,
        k,
        lhs_offsets: batch_offsets(&lb),
        lhs_strides,
        rhs_offsets: batch_offsets(&rb),
        rhs_strides,
    }
}

/// The single stride that walks `dims` in row-major order, when there is one.
fn merged_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let mut inner: Option<(usize, usize)> = None; // (stride, elements spanned) of the dims so far
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d == 1 {
            continue;
        }
        inner = match inner {
            None => Some((s, d)),
            Some((is, span)) if s == is * span => Some((is, span * d)),
            Some(_) => return None,
        };
    }
    Some(inner.map_or(1, |(s, _)| s))
}
