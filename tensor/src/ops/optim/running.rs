//! Batch norm's running statistics, updated in place after each training batch: on CUDA one
//! launch for the mean, the variance and the batch counter, where the composed tensor ops take
//! eleven small ones per layer (53 layers in ResNet-50). Same f32 roundings as those ops.

use super::cuda::SOURCE;
use crate::cuda::{expect_launch, launch_cfg};
use crate::{DType, Storage, Tensor};
use cudarc::driver::PushKernelArg;
use std::sync::OnceLock;

fn fused_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("OXTRAIN_DISABLE_FUSED_RUNNING_STATS").map_or(true, |v| v != "1"))
}

impl Tensor {
    /// `running_mean = (1 - factor) * running_mean + factor * mean` and
    /// `running_var = (1 - factor) * running_var + factor * (var * unbiased)`, in place, and
    /// `count += 1` when given (batch norm's `num_batches_tracked`, an i64 scalar). `mean` and
    /// `var` are the batch's statistics (the biased variance; `unbiased` is `n / (n - 1)`), of
    /// the running buffers' shape. Each value is the composed ops' (`mul_scalar`, `add`,
    /// `copy_`) to the bit.
    pub fn update_running_stats_(
        (running_mean, running_var): (&Tensor, &Tensor),
        count: Option<&Tensor>,
        (mean, var): (&Tensor, &Tensor),
        factor: f64,
        unbiased: f64,
    ) {
        let op = "update_running_stats_";
        for (what, t) in [("running_var", running_var), ("mean", mean), ("var", var)] {
            running_mean.same_device(t, op);
            assert!(
                t.dims() == running_mean.dims(),
                "{op}: {what} has shape {:?}, running_mean {:?}",
                t.dims(),
                running_mean.dims()
            );
        }
        if let Some(c) = count {
            running_mean.same_device(c, op);
            assert!(c.elem_count() == 1, "{op}: the batch counter has shape {:?}, not one element", c.dims());
        }
        if fused_enabled() && fusable((running_mean, running_var), count, (mean, var)) {
            fused((running_mean, running_var), count, (mean, var), factor, unbiased);
            return;
        }
        if let Some(c) = count {
            c.add_scalar_(1.0);
        }
        let unbiased_var = var.mul_scalar(unbiased);
        for (running, batch) in [(running_mean, mean), (running_var, &unbiased_var)] {
            let batch = batch.to_dtype(running.dtype());
            running.copy_(&running.mul_scalar(1.0 - factor).add(&batch.mul_scalar(factor)));
        }
    }
}

/// CUDA, f32 statistics with storage of their own, contiguous, and an i64 counter.
fn fusable(running: (&Tensor, &Tensor), count: Option<&Tensor>, batch: (&Tensor, &Tensor)) -> bool {
    let all = [running.0, running.1, batch.0, batch.1];
    let f32s = all.iter().all(|t| t.dtype() == DType::F32 && t.is_contiguous());
    let keys = [running.0, running.1, batch.0, batch.1].map(Tensor::storage_key);
    let distinct = (1..4).all(|i| !keys[..i].contains(&keys[i]))
        && count.is_none_or(|c| !keys.contains(&c.storage_key()));
    running.0.device().is_cuda()
        && f32s
        && distinct
        && count.is_none_or(|c| c.dtype() == DType::I64 && c.is_contiguous())
}

fn fused(
    (running_mean, running_var): (&Tensor, &Tensor),
    count: Option<&Tensor>,
    (mean, var): (&Tensor, &Tensor),
    factor: f64,
    unbiased: f64,
) {
    let op = "update_running_stats_";
    let n = running_mean.elem_count();
    let address = |t: &Tensor, s: &Storage| match s {
        Storage::Cuda(s) => s.ptr() + (t.layout().offset() * s.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("{op}: checked to be on a CUDA device"),
    };
    let (rm, rv) = (running_mean.storage_mut(), running_var.storage_mut());
    let counter = count.map(|c| (c, c.storage_mut()));
    let (bm, bv) = (mean.storage(), var.storage());
    let Storage::Cuda(s) = &*rm else { unreachable!("{op}: checked to be on a CUDA device") };
    let (rmp, rvp) = (address(running_mean, &rm), address(running_var, &rv));
    let (mp, vp) = (address(mean, &bm), address(var, &bv));
    let cp = counter.as_ref().map_or(0, |(c, g)| address(c, g));
    let (n64, keep, factor32, unbiased32) = (n as i64, (1.0 - factor) as f32, factor as f32, unbiased as f32);
    let f = expect_launch(s.device().function(&SOURCE, "running_stats_update"), op);
    let stream = s.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&rmp).arg(&rvp).arg(&mp).arg(&vp).arg(&cp).arg(&n64).arg(&keep).arg(&factor32).arg(&unbiased32);
    // SAFETY: the four statistics hold n contiguous f32 elements from their addresses, in
    // distinct storages; the counter is one i64 (or null); the locks are held while queued.
    expect_launch(unsafe { b.launch(launch_cfg(n.max(1))) }, op);
}
