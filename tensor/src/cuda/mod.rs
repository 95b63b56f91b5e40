//! The CUDA backend: devices, streams, memory and kernels, on cudarc with dynamic loading.
//!
//! Nothing here needs CUDA at build time. At run time the driver and libraries are found by
//! [`libs`] (CUDA_HOME, /usr/local/cuda, pip's `nvidia-*` packages); a machine without them gets
//! a clear error from [`device`], and `Device::cuda_if_available` falls back to the CPU.

pub mod alloc;
pub mod aot;
mod cubins;
mod device;
pub(crate) mod host_waits;
mod jobs;
mod launch;
pub mod libs;
pub mod nvrtc;
pub mod pinned;
mod storage;
mod stream;

pub use alloc::{CudaBuffer, MemoryStats};
pub use device::{device, device_count, is_available, CudaDevice};
pub use host_waits::HostWaits;
pub(crate) use launch::{expect_launch, launch_cfg, source, suffix};
pub use nvrtc::KernelSource;
pub use pinned::PinnedBuffer;
pub use storage::{CudaStorage, StridedArg, MAX_DIMS};
pub use stream::{Event, Stream, StreamGuard};

/// Backend switches, as `torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.enabled`.
pub use crate::ops::attention::cuda::{attention_v2, set_attention_v2};
pub use crate::ops::conv::cuda::{cudnn_enabled, set_cudnn_enabled};
pub use crate::ops::conv::cudnn_plan::{cudnn_benchmark, set_cudnn_benchmark};
pub use crate::ops::matmul::cuda::{allow_tf32, set_allow_tf32};
pub use crate::ops::matmul::fused::epilogue_products_on_this_thread;

/// Every kernel source of the crate, for ahead-of-time checks (CI compiles each with NVRTC).
pub fn all_kernel_sources() -> Vec<KernelSource> {
    let layer_rows = crate::ops::norm::layer_rows::SOURCES.iter().map(|(_, s)| *s);
    let mut sources = vec![
        crate::ops::attention::cuda::SOURCE,
        crate::ops::attention::cuda_v2::SOURCE,
        crate::ops::unary::cuda::SOURCE,
        crate::ops::binary::cuda::SOURCE,
        crate::ops::convert::cuda::SOURCE,
        crate::ops::conv::cuda::SOURCE,
        crate::ops::creation::cuda::SOURCE,
        crate::ops::image::cuda::SOURCE,
        crate::ops::index::cuda::SOURCE,
        crate::ops::inplace::cuda::SOURCE,
        crate::ops::join::cuda::SOURCE,
        crate::ops::norm::cuda::SOURCE,
        crate::ops::norm::channels_last::SOURCE,
        crate::ops::optim::cuda::SOURCE,
        crate::ops::pool::cuda::SOURCE,
        crate::ops::random::cuda::SOURCE,
        crate::ops::reduce::cuda::SOURCE,
        crate::ops::softmax::cuda::SOURCE,
    ];
    sources.extend(layer_rows);
    sources
}

/// Allocated, reserved and peak bytes of device `ordinal` (`torch.cuda.memory_stats`).
pub fn memory_stats(ordinal: usize) -> crate::Result<MemoryStats> {
    Ok(device(ordinal)?.memory_stats())
}

/// How often the host has waited for device `ordinal` so far: a steady training step should
/// add nothing (see [`HostWaits`]).
pub fn host_waits(ordinal: usize) -> crate::Result<HostWaits> {
    Ok(device(ordinal)?.host_waits())
}

/// Blocks until all work queued on device `ordinal` is done (`torch.cuda.synchronize`).
pub fn synchronize(ordinal: usize) -> crate::Result<()> {
    device(ordinal)?.synchronize()
}

/// Runs `f` between `cuProfilerStart` and `cuProfilerStop` on device `ordinal`
/// (`torch.cuda.profiler.profile()`), so a profiler started with collection off (`ncu
/// --profile-from-start off`, `nsys -c cudaProfilerApi`) records `f`'s kernels and nothing
/// else: not the warm-up, not the autotuning of the first steps.
pub fn profiler_range<R>(ordinal: usize, f: impl FnOnce() -> R) -> crate::Result<R> {
    let dev = device(ordinal)?;
    let ctx = dev.context();
    let fail = |what: &str, e| device::driver_error(ordinal, what, e);
    ctx.bind_to_thread().map_err(|e| fail("binding the context", e))?;
    dev.synchronize()?;
    cudarc::driver::profiler_start().map_err(|e| fail("starting the profiler range", e))?;
    let r = f();
    dev.synchronize()?;
    cudarc::driver::profiler_stop().map_err(|e| fail("stopping the profiler range", e))?;
    Ok(r)
}

#[cfg(test)]
mod tests;
