//! The output projection and the cross-entropy as one autograd node, computed in chunks of
//! rows (Liger Kernel's fused linear cross-entropy, torchtune's chunked output loss).
//!
//! A language model's logits `[tokens, vocab]` are the largest activation of a small or
//! long-sequence model: GPT-2's vocabulary of 50257 makes them 200 MB in f32 for 1024 tokens,
//! and the plain head keeps them for backward and then makes their gradient, as large again.
//! Here no more than one chunk of logits exists at a time. Forward runs over chunks of rows and
//! keeps, per row, only the log-sum-exp. Backward runs over blocks of classes: with the
//! log-sum-exp known, a block's softmax needs only that block's logits, made again, so each
//! block of the weight's gradient is one product written once (no `[classes, features]`
//! partial sums), and the hidden states' gradient adds up block by block. Each block's
//! `softmax - onehot` is one pass ([`Tensor::cross_entropy_block_backward`], the targets
//! counted from the block's first class); label smoothing's two other terms are added
//! afterwards from rows of the weight and of the hidden states. The price is the head's
//! forward product once more (about a third of the head's time).
//!
//! The chunks run in a fixed order and each is the same computation in forward and backward,
//! so the result does not depend on anything but the inputs and the chunk size: a run with
//! activation checkpointing gets the same gradients, bit for bit, as one without.

use crate::loss::IGNORE_INDEX;
use oxtrain_autograd::Var;
use oxtrain_nn::loss::Reduction;
use oxtrain_tensor::{CmpOp, DType, Tensor};

/// Options of [`linear_cross_entropy`]: those of the cross-entropy, and how to chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearCrossEntropyOptions {
    /// Targets equal to this contribute no loss and no gradient, and are not counted by the
    /// mean (-100, as PyTorch and Hugging Face).
    pub ignore_index: i64,
    /// In `[0, 1]`: the target distribution is `(1 - s) * one_hot + s / classes`.
    pub label_smoothing: f64,
    /// `Mean` (over targets not ignored) or `Sum`; `None` is not offered (the per-row losses
    /// of every chunk would be one more tensor kept for backward).
    pub reduction: Reduction,
    /// Logits made at a time, in elements (rows of all classes in forward, blocks of classes
    /// for all rows in backward); 0: [`DEFAULT_CHUNK_ELEMENTS`], or a 32nd of the logits when
    /// that is more.
    pub chunk_elements: usize,
    /// Runs the products over the weight padded with zero rows to a multiple of this many
    /// classes (1: unpadded); see `gpt2::head` for why CUDA wants 128 with GPT-2's vocabulary.
    pub pad_classes_to: usize,
}

impl Default for LinearCrossEntropyOptions {
    fn default() -> Self {
        LinearCrossEntropyOptions {
            ignore_index: IGNORE_INDEX,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
            chunk_elements: 0,
            pad_classes_to: 1,
        }
    }
}

/// The smallest default chunk: 16 MiB of f32 logits.
pub const DEFAULT_CHUNK_ELEMENTS: usize = 1 << 22;

/// `F.cross_entropy(hidden @ weight.T, target)` for `hidden [N, E]`, `weight [C, E]` and int64
/// `target [N]`, without ever holding the `[N, C]` logits whole: forward keeps a log-sum-exp
/// per row, backward makes the logits again block by block of classes. Under autocast the products run in the autocast dtype and the loss in f32,
/// as the unfused head and cross-entropy do.
pub fn linear_cross_entropy(
    hidden: &Var,
    weight: &Var,
    target: &Tensor,
    opts: &LinearCrossEntropyOptions,
) -> Var {
    if oxtrain_autograd::autocast_dtype().is_some() {
        // The loss in f32, as the cross-entropy gives it under autocast.
        let (h, w) = (hidden.autocast_lower(), weight.autocast_lower());
        return oxtrain_autograd::autocast_disabled(|| fused(&h, &w, target, opts, DType::F32));
    }
    fused(hidden, weight, target, opts, hidden.dtype())
}

/// [`linear_cross_entropy`] on operands of one dtype, the loss given in `out_dtype`.
fn fused(
    hidden: &Var,
    weight: &Var,
    target: &Tensor,
    opts: &LinearCrossEntropyOptions,
    out_dtype: DType,
) -> Var {
    let head = Head::new(hidden.tensor(), weight.tensor(), target, opts);
    let (mut per_row, mut lse) = (Vec::new(), Vec::new());
    for (start, len) in head.chunks() {
        let (loss, l) = head.logits(start, len).cross_entropy_rows(
            &head.targets(start, len),
            opts.ignore_index,
            opts.label_smoothing,
        );
        per_row.push(loss);
        lse.push(l);
    }
    let (per_row, lse) = (Tensor::cat(&per_row, 0), Tensor::cat(&lse, 0));
    let compute = per_row.dtype();
    let count = head.target.cmp_scalar(opts.ignore_index as f64, CmpOp::Ne).to_dtype(compute).sum_all();
    let mean = opts.reduction == Reduction::Mean;
    let loss = if mean { per_row.sum_all().div(&count) } else { per_row.sum_all() };
    Var::from_op("linear_cross_entropy", loss.to_dtype(out_dtype), &[hidden, weight], move |g, needs| {
        let g = g.to_dtype(compute);
        let scale = if mean { g.div(&count) } else { g };
        let row_weights = scale.broadcast_as(head.rows()).contiguous();
        head.backward(&lse, &row_weights, (needs[0], needs[1]))
    })
}

/// The operands of one [`linear_cross_entropy`], shared by its forward and its backward.
struct Head {
    /// `[N, E]`.
    h: Tensor,
    /// `[padded C, E]`: the weight, or a copy with zero rows up to a multiple of the padding.
    w: Tensor,
    classes: usize,
    target: Tensor,
    /// Logits per chunk, in elements.
    chunk: usize,
    ignore_index: i64,
    label_smoothing: f64,
}

impl Head {
    fn new(h: &Tensor, w: &Tensor, target: &Tensor, opts: &LinearCrossEntropyOptions) -> Head {
        let op = "linear_cross_entropy";
        assert!(
            h.rank() == 2 && w.rank() == 2 && h.dims()[1] == w.dims()[1],
            "{op}: expected hidden [N, E] and weight [C, E], got {:?} and {:?}",
            h.dims(),
            w.dims()
        );
        assert!(h.dtype() == w.dtype(), "{op}: hidden is {} but the weight is {}", h.dtype(), w.dtype());
        assert!(
            target.dtype() == DType::I64 && target.dims() == [h.dims()[0]],
            "{op}: hidden {:?} needs int64 targets of shape [{}], got {} {:?}",
            h.dims(),
            h.dims()[0],
            target.dtype(),
            target.dims()
        );
        assert!(h.dims()[0] > 0, "{op}: no rows to compute a loss of");
        assert!(opts.reduction != Reduction::None, "{op}: reduction must be Mean or Sum");
        assert!(
            (0.0..=1.0).contains(&opts.label_smoothing),
            "{op}: label_smoothing must be in [0, 1], got {}",
            opts.label_smoothing
        );
        let classes = w.dims()[0];
        let padded = classes.next_multiple_of(opts.pad_classes_to.max(1));
        let w = if padded == classes { w.clone() } else { padded_weight(w, padded) };
        let rows = h.dims()[0];
        let chunk = match opts.chunk_elements {
            0 => DEFAULT_CHUNK_ELEMENTS.max((rows * classes).div_ceil(32)),
            n => n,
        };
        Head {
            h: h.clone(),
            w,
            classes,
            target: target.contiguous(),
            chunk,
            ignore_index: opts.ignore_index,
            label_smoothing: opts.label_smoothing,
        }
    }

    fn rows(&self) -> usize {
        self.h.dims()[0]
    }

    /// `(start, len)` of every chunk of rows of forward, in order.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let rows = self.rows();
        let step = (self.chunk / self.classes).max(1);
        (0..rows).step_by(step).map(move |s| (s, step.min(rows - s)))
    }

    /// `(start, len)` of every block of classes of backward, in order: over the padded classes,
    /// in multiples of 128 where a block has that many (whole tiles of the products).
    fn class_blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let padded = self.w.dims()[0];
        let step = self.chunk / self.rows();
        let step = if step >= 128 { step / 128 * 128 } else { step }.clamp(1, padded);
        (0..padded).step_by(step).map(move |s| (s, step.min(padded - s)))
    }

    /// The logits of rows `start..start + len`: `[len, C]`, a view of `[len, padded C]` when
    /// the weight is padded.
    fn logits(&self, start: usize, len: usize) -> Tensor {
        let full = self.h.narrow(0, start, len).matmul(&self.w.t());
        if full.dims()[1] == self.classes {
            full
        } else {
            full.narrow(1, 0, self.classes)
        }
    }

    fn targets(&self, start: usize, len: usize) -> Tensor {
        self.target.narrow(0, start, len)
    }

    /// The gradients of `hidden` and of the weight (where `needs` them): `lse [N]` from
    /// forward, `row_weights [N]` the loss's gradient per row (the mean's `1 / count` folded
    /// in). `dlogits = w_i * (softmax - (1 - s) * onehot(t_i) - s / C)`: all but the label
    /// smoothing block by block of classes, label smoothing's two terms from rows of the
    /// weight and of `hidden`.
    fn backward(&self, lse: &Tensor, row_weights: &Tensor, needs: (bool, bool)) -> Vec<Option<Tensor>> {
        let (classes, features) = (self.classes, self.h.dims()[1]);
        let compute = lse.dtype();
        let mut dh: Option<Tensor> = None;
        let dw = needs.1.then(|| {
            Tensor::zeros([classes, features], compute, self.w.device())
                .expect("the weight's gradient buffer")
        });
        for (start, len) in self.class_blocks() {
            let w_block = self.w.narrow(0, start, len);
            let shift = -(start as f64);
            // The pad classes' columns of `g` are not zero, but they meet only the weight's zero
            // pad rows (for `hidden`) and the rows of the weight's gradient that are dropped.
            let g = self.h.matmul(&w_block.t()).cross_entropy_block_backward(
                &self.target.add_scalar(shift),
                lse,
                row_weights,
                self.ignore_index - start as i64,
            );
            if needs.0 {
                let part = g.matmul(&w_block).to_dtype(compute);
                match &dh {
                    Some(acc) => {
                        acc.add_(&part);
                    }
                    None => dh = Some(part),
                }
            }
            let real = classes.saturating_sub(start).min(len);
            if let (Some(dw), true) = (&dw, real > 0) {
                // Each block writes its own rows of the weight's gradient, once.
                dw.narrow(0, start, real).copy_(&g.t().matmul(&self.h).narrow(0, 0, real));
            }
        }
        if self.label_smoothing > 0.0 {
            self.add_smoothing_terms(row_weights, (dh.as_ref(), dw.as_ref()));
        }
        vec![dh.map(|d| d.to_dtype(self.h.dtype())), dw.map(|d| d.to_dtype(self.w.dtype()))]
    }

    /// Label smoothing's part of the gradients beyond what the blocks gave (the blocks' target
    /// term is the whole one-hot): `+s w_i onehot(t_i) - (s / C) w_i` for every row's logits,
    /// through the weight into `dh` and through `hidden` into `dw`.
    fn add_smoothing_terms(&self, row_weights: &Tensor, (dh, dw): (Option<&Tensor>, Option<&Tensor>)) {
        let (rows, classes, s) = (self.rows(), self.classes, self.label_smoothing);
        let compute = row_weights.dtype();
        let valid = self.target.cmp_scalar(self.ignore_index as f64, CmpOp::Ne).to_dtype(compute);
        let w = row_weights.mul(&valid).reshape([rows, 1]);
        let (target_part, spread) = (w.mul_scalar(s), w.mul_scalar(-s / classes as f64));
        let ids = self.target.clamp(0.0, (classes - 1) as f64); // ignored rows have w = 0
        if let Some(dh) = dh {
            // s w_i W[t_i] - (s / C) w_i sum_c W[c]
            let weight = self.w.narrow(0, 0, classes).to_dtype(compute);
            dh.add_(&ids.embedding(&weight).mul(&target_part));
            dh.add_(&spread.mul(&weight.sum(0, true)));
        }
        if let Some(dw) = dw {
            // s sum_{i: t_i = c} w_i h_i - (s / C) sum_i w_i h_i
            let h = self.h.to_dtype(compute);
            dw.add_(&h.mul(&target_part).embedding_backward(&ids, classes));
            dw.add_(&h.mul(&spread).sum(0, true));
        }
    }
}

/// `w [C, E]` copied into a buffer of `padded` rows whose rows past `C` are zero.
pub(crate) fn padded_weight(w: &Tensor, padded: usize) -> Tensor {
    let (classes, features) = (w.dims()[0], w.dims()[1]);
    let wp =
        Tensor::zeros([padded, features], w.dtype(), w.device()).expect("the padded weight on its device");
    wp.narrow(0, 0, classes).copy_(w);
    wp
}

/// The logits' gradient `g` (`[.., vocab]`) as `[rows, padded]` with zeros in the pad columns:
/// a view of its own buffer when its rows already lie `padded` apart (the cross-entropy's
/// gradient of padded logits), else a zero-padded copy.
pub(crate) fn padded_rows(g: &Tensor, rows: usize, vocab: usize, padded: usize) -> Tensor {
    let g2 = g.reshape([rows, vocab]);
    let offset = g2.layout().offset();
    let fits = g2.strides() == [padded, 1] && offset + rows * padded <= g2.storage().len();
    if fits {
        let full = g2.as_strided(&[rows, padded], &[padded, 1], offset);
        full.narrow(1, vocab, padded - vocab).zero_();
        return full;
    }
    let full =
        Tensor::zeros([rows, padded], g.dtype(), g.device()).expect("the padded gradient on its device");
    full.narrow(1, 0, vocab).copy_(&g2);
    full
}

#[cfg(test)]
#[path = "linear_cross_entropy_tests.rs"]
mod tests;
