//! Fused scaled-dot-product attention (FlashAttention-2): `softmax(q k^T * scale + mask) v`
//! without the `[L, S]` score matrix in memory, and its backward from the saved log-sum-exp.
//!
//! On CUDA, bf16 and f16 with head dims 32, 64 and 128 run on tensor cores: one forward kernel
//! and two backward kernels, no atomics, so gradients are the same on every run. Two versions:
//! `attention_v2.cu` (the default on sm_80 and later: ldmatrix, cp.async double buffering,
//! masks only on edge tiles) and `attention.cu`, which `OXTRAIN_ATTENTION=v1` in the
//! environment selects (read once per process). On the CPU a direct loop in f64 computes the
//! same thing for any float dtype: the reference the CUDA kernels are tested against.

mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod cuda_tests;
pub(crate) mod cuda_v2;
#[cfg(test)]
mod tests;

use crate::storage::Storage;
use crate::{DType, Tensor};

/// The masks and scale of [`Tensor::flash_attention`]; `Default` is plain attention.
#[derive(Debug, Clone, Default)]
pub struct FlashAttention {
    /// Multiplies `q k^T`; `None` means `1 / sqrt(head_dim)`, PyTorch's default.
    pub scale: Option<f64>,
    /// Query `i` sees keys `0..=i` (top-left aligned, as PyTorch's `is_causal`).
    pub causal: bool,
    /// Key padding: batch row `b` sees only its first `key_lengths[b]` keys (an i64 `[B]`
    /// tensor on the inputs' device). A query that sees no key gets NaN, as in PyTorch.
    pub key_lengths: Option<Tensor>,
}

/// The checked dims `(B, H, L, S, D)` of q `[B, H, L, D]`, k and v `[B, H, S, D]`.
fn dims(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &FlashAttention,
    op: &str,
) -> (usize, usize, usize, usize, usize) {
    assert!(
        q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
        "{op}: expected q [B, H, L, D], k and v [B, H, S, D], got {:?}, {:?}, {:?}",
        q.dims(),
        k.dims(),
        v.dims()
    );
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    assert!(
        qd[0] == kd[0] && qd[1] == kd[1] && kd == vd && qd[3] == kd[3],
        "{op}: q {qd:?}, k {kd:?} and v {vd:?} must share B, H and D, and k and v their shape \
         (a different value dim needs the unfused attention)"
    );
    assert!(q.dtype().is_float(), "{op}: expected floating-point inputs, got {}", q.dtype());
    assert!(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "{op}: q, k and v must share a dtype");
    q.same_device(k, op);
    q.same_device(v, op);
    if let Some(lens) = &opts.key_lengths {
        assert!(
            lens.dtype() == DType::I64 && lens.dims() == [qd[0]],
            "{op}: key_lengths must be an i64 tensor [B] = [{}], got {} {:?}",
            qd[0],
            lens.dtype(),
            lens.dims()
        );
        q.same_device(lens, op);
    }
    (qd[0], qd[1], qd[2], kd[2], qd[3])
}

impl FlashAttention {
    /// Whether [`Tensor::flash_attention`] runs fused kernels for inputs of this device, dtype
    /// and head dim (CUDA, bf16 or f16, 32, 64 or 128); on the CPU it is a reference loop,
    /// slow for long sequences.
    pub fn is_fused(device: crate::Device, dtype: DType, head_dim: usize) -> bool {
        device.is_cuda() && cuda::supported(dtype, head_dim)
    }

    fn scale_for(&self, head_dim: usize) -> f64 {
        self.scale.unwrap_or(1.0 / (head_dim as f64).sqrt())
    }
}

impl Tensor {
    /// Attention of the queries `self` `[B, H, L, D]` over keys `k` and values `v`
    /// `[B, H, S, D]`: returns `(out [B, H, L, D], lse [B, H, L])`, `lse` being the f32
    /// log-sum-exp of each query's scaled scores, which [`Tensor::flash_attention_backward`]
    /// takes. On CUDA `out` is a view of `[B, L, H, D]` memory, so merging the heads
    /// (`out.transpose(1, 2).reshape([B, L, H * D])`) copies nothing.
    pub fn flash_attention(&self, k: &Tensor, v: &Tensor, opts: &FlashAttention) -> (Tensor, Tensor) {
        let op = "flash_attention";
        let (b, h, l, s, d) = dims(self, k, v, opts, op);
        let scale = opts.scale_for(d);
        if self.device().is_cuda() {
            assert!(
                FlashAttention::is_fused(self.device(), self.dtype(), d),
                "{op}: CUDA runs bf16 or f16 with head dim 32, 64 or 128, got {} with {d}; use \
                 the unfused attention (nn's scaled_dot_product_attention picks it)",
                self.dtype()
            );
            let (q, k, v) = (cuda::prepared(self), cuda::prepared(k), cuda::prepared(v));
            let lens = opts.key_lengths.as_ref().map(Tensor::contiguous);
            let (out, lse) =
                cuda::forward((&q, &k, &v), lens.as_ref(), (b, h, l, s, d), scale, opts.causal, op);
            let out = Tensor::from_storage(Storage::Cuda(out), [b, l, h, d]).permute([0, 2, 1, 3]);
            return (out, Tensor::from_storage(Storage::Cuda(lse), [b, h, l]));
        }
        let lens = opts.key_lengths.as_ref().map(|t| t.to_vec::<i64>());
        let (out, lse) = cpu::forward(self, k, v, lens.as_deref(), scale, opts.causal);
        (
            Tensor::from_vec(out, [b, h, l, d], self.device()).expect("a CPU tensor").to_dtype(self.dtype()),
            Tensor::from_vec(lse, [b, h, l], self.device()).expect("a CPU tensor"),
        )
    }

    /// The gradients `(dq, dk, dv)` of [`Tensor::flash_attention`] for the output gradient
    /// `self`, from its inputs, its output and its `lse` (the same `opts`). Shaped as q, k and
    /// v, in their dtype; on CUDA views of `[B, T, H, D]` memory.
    pub fn flash_attention_backward(
        &self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        (out, lse): (&Tensor, &Tensor),
        opts: &FlashAttention,
    ) -> (Tensor, Tensor, Tensor) {
        let op = "flash_attention_backward";
        let (b, h, l, s, d) = dims(q, k, v, opts, op);
        assert!(
            self.dims() == q.dims() && out.dims() == q.dims() && lse.dims() == [b, h, l],
            "{op}: expected dout and out {:?} and lse [{b}, {h}, {l}], got {:?}, {:?} and {:?}",
            q.dims(),
            self.dims(),
            out.dims(),
            lse.dims()
        );
        assert!(lse.dtype() == DType::F32, "{op}: lse is f32 (as flash_attention returns it)");
        let scale = opts.scale_for(d);
        if q.device().is_cuda() {
            assert!(
                FlashAttention::is_fused(q.device(), q.dtype(), d),
                "{op}: not a fused configuration ({} with head dim {d})",
                q.dtype()
            );
            let prep = |t: &Tensor| cuda::prepared(&t.to_dtype(q.dtype()));
            let (dout, out) = (prep(self), prep(out));
            let (q, k, v) = (cuda::prepared(q), cuda::prepared(k), cuda::prepared(v));
            let lens = opts.key_lengths.as_ref().map(Tensor::contiguous);
            let (dq, dk, dv) = cuda::backward(
                (&q, &k, &v),
                (&dout, &out, &lse.contiguous()),
                lens.as_ref(),
                (b, h, l, s, d),
                scale,
                opts.causal,
                op,
            );
            let view =
                |st, t: usize| Tensor::from_storage(Storage::Cuda(st), [b, t, h, d]).permute([0, 2, 1, 3]);
            return (view(dq, l), view(dk, s), view(dv, s));
        }
        let lens = opts.key_lengths.as_ref().map(|t| t.to_vec::<i64>());
        let (dq, dk, dv) = cpu::backward(self, (q, k, v), (out, lse), lens.as_deref(), scale, opts.causal);
        let make = |g: Vec<f64>, t: usize| {
            Tensor::from_vec(g, [b, h, t, d], q.device()).expect("a CPU tensor").to_dtype(q.dtype())
        };
        (make(dq, l), make(dk, s), make(dv, s))
    }
}
