//! Batch norm whose statistics cover every rank's batch (PyTorch's `SyncBatchNorm`): with
//! small per-GPU batches (ImageNet ResNet-50 recipes across many GPUs), normalising with
//! local statistics changes what the model learns.
//!
//! Forward all-reduces the per-channel sums (then the sums of squared deviations from the
//! global mean), backward all-reduces the per-channel sums of `dy` and `dy * x_hat`, so the
//! gradient is that of one batch norm over the global batch. A failed collective does not
//! panic inside forward or backward: forward falls back to local statistics, and the error is
//! what `loss.try_backward()` returns.

use crate::DdpError;
use oxtrain_autograd::{in_backward, queue_callback, BackwardError, Var};
use oxtrain_comm::{Communicator, ReduceOp};
use oxtrain_nn::{BatchNorm2d, BatchNormConfig, CrossReplicaNorm, Module};
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::{Arc, Mutex};

/// The cross-rank statistics of batch norms; plug into [`BatchNorm2d`] with
/// [`convert_sync_batchnorm`] or [`SyncBatchNorm::batch_norm2d`].
pub struct SyncBatchNorm {
    comm: Arc<dyn Communicator>,
    /// A failure in a forward, reported at the next backward.
    failed: Arc<Mutex<Option<DdpError>>>,
}

impl SyncBatchNorm {
    pub fn new(comm: Arc<dyn Communicator>) -> Arc<SyncBatchNorm> {
        Arc::new(SyncBatchNorm { comm, failed: Arc::default() })
    }

    /// A [`BatchNorm2d`] with PyTorch's defaults whose statistics are reduced over `comm`'s
    /// ranks (`nn.SyncBatchNorm(num_features)`).
    pub fn batch_norm2d(
        num_features: usize,
        comm: Arc<dyn Communicator>,
        device: Device,
    ) -> oxtrain_tensor::Result<BatchNorm2d> {
        let bn = BatchNorm2d::with_config(num_features, BatchNormConfig::default(), device)?;
        bn.set_cross_replica(Some(SyncBatchNorm::new(comm)));
        Ok(bn)
    }

    /// All-reduces `t` (a sum) in place; on failure keeps the local values and remembers why.
    fn sum_across(&self, t: &Tensor) -> bool {
        if self.comm.world_size() == 1 {
            return true;
        }
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_some() {
            return false;
        }
        match self.comm.all_reduce(t, ReduceOp::Sum).and_then(|w| w.wait()) {
            Ok(()) => true,
            Err(e) => {
                *failed = Some(e.into());
                false
            }
        }
    }

    fn report_failure(failed: &Arc<Mutex<Option<DdpError>>>) {
        if let Some(e) = failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if in_backward() {
                queue_callback(move || Err(BackwardError::new(e)));
            }
        }
    }
}

/// Sets every [`BatchNorm2d`] in `module` (the module itself included) to reduce its
/// statistics over `comm`'s ranks (`nn.SyncBatchNorm.convert_sync_batchnorm(model)`); returns
/// how many it converted. Call it before wrapping the model in DDP.
pub fn convert_sync_batchnorm(module: &dyn Module, comm: Arc<dyn Communicator>) -> usize {
    let sync = SyncBatchNorm::new(comm);
    let mut count = 0;
    let mut convert = |m: &dyn Module| {
        if let Some(bn) = m.as_batch_norm() {
            bn.set_cross_replica(Some(sync.clone()));
            count += 1;
        }
    };
    convert(module);
    module.visit_modules(&mut |_, m| convert(m));
    count
}

impl CrossReplicaNorm for SyncBatchNorm {
    fn batch_norm_training(
        &self,
        x: &Var,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> (Var, Tensor, Tensor, usize) {
        let dims = x.dims().to_vec();
        assert_eq!(dims.len(), 4, "SyncBatchNorm: expected a 4-D input [N, C, H, W], got shape {dims:?}");
        let c = dims[1];
        let reduce_dims = [0usize, 2, 3];
        let channel = [1, c, 1, 1];
        // Statistics in f32 at least (f64 stays f64), as the single-process kernels keep them.
        let acc = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let xt = x.tensor().to_dtype(acc);
        let local_count = x.elem_count() / c;

        // Global mean: the per-channel sums and the count in one all-reduce.
        let count_t = Tensor::full(1, local_count as f64, acc, xt.device()).expect("a one-element tensor");
        let packed = Tensor::cat([xt.sum(reduce_dims.as_slice(), false), count_t].as_slice(), 0);
        let synced = self.sum_across(&packed);
        let count =
            packed.narrow(0, c, 1).to_device(Device::Cpu).map(|t| t.item()).unwrap_or(local_count as f64);
        let count = if synced { count.round() as usize } else { local_count };
        let mean = packed.narrow(0, 0, c).mul_scalar(1.0 / count as f64);
        let centered = xt.sub(&mean.reshape(channel));
        // Biased variance about the global mean (two passes, as the single-process kernel).
        let sq = centered.square().sum(reduce_dims.as_slice(), false);
        self.sum_across(&sq);
        let var = sq.mul_scalar(1.0 / count as f64);
        let rstd = var.add_scalar(eps).rsqrt().reshape(channel);
        let xhat = centered.mul(&rstd);
        let w = weight.map(|w| w.tensor().to_dtype(acc).reshape(channel));
        let b = bias.map(|b| b.tensor().to_dtype(acc).reshape(channel));
        let mut out = match &w {
            Some(w) => xhat.mul(w),
            None => xhat.clone(),
        };
        if let Some(b) = &b {
            out = out.add(b);
        }
        let out = out.to_dtype(x.dtype());

        let mut inputs = vec![x];
        inputs.extend(weight);
        inputs.extend(bias);
        let has_weight = weight.is_some();
        let has_bias = bias.is_some();
        let me = SyncBatchNorm { comm: self.comm.clone(), failed: self.failed.clone() };
        let x_dtype = x.dtype();
        let out = Var::from_op("sync_batch_norm", out, &inputs, move |g, needs| {
            let g = g.to_dtype(acc);
            let gy = match &w {
                Some(w) => g.mul(w),
                None => g.clone(),
            };
            let mut grads = Vec::with_capacity(needs.len());
            grads.push(needs[0].then(|| {
                let sum_dy = gy.sum(reduce_dims.as_slice(), false);
                let sum_dy_xhat = gy.mul(&xhat).sum(reduce_dims.as_slice(), false);
                let packed = Tensor::cat([sum_dy, sum_dy_xhat].as_slice(), 0);
                me.sum_across(&packed);
                let inv = 1.0 / count as f64;
                let mean_dy = packed.narrow(0, 0, c).mul_scalar(inv).reshape(channel);
                let mean_dy_xhat = packed.narrow(0, c, c).mul_scalar(inv).reshape(channel);
                gy.sub(&mean_dy).sub(&xhat.mul(&mean_dy_xhat)).mul(&rstd).to_dtype(x_dtype)
            }));
            if has_weight {
                grads.push(needs[grads.len()].then(|| g.mul(&xhat).sum(reduce_dims.as_slice(), false)));
            }
            if has_bias {
                grads.push(needs[grads.len()].then(|| g.sum(reduce_dims.as_slice(), false)));
            }
            SyncBatchNorm::report_failure(&me.failed);
            grads
        });
        (out, mean, var, count)
    }
}
