//! CUDA creation: constants by memset or the `fill_b*` kernels of `convert.cu`, ranges and
//! identity matrices by the kernels of `creation.cu`. Nothing is built on the host.

use crate::cuda::{self, launch_cfg, CudaDevice, CudaStorage, KernelSource, StridedArg};
use crate::storage::CpuStorage;
use crate::{DType, Error, Result};
use cudarc::driver::PushKernelArg;
use std::sync::Arc;

pub(crate) const SOURCE: KernelSource = cuda::source!("creation", "src/ops/creation/creation.cu");

fn launch_error(op: &str, e: impl std::fmt::Debug) -> Error {
    Error::Msg(format!("{op}: CUDA kernel failed: {e:?}"))
}

/// The bit pattern of `value` cast to `dtype` (with the CPU's cast rules), widened to 64 bits:
/// what the `fill_b{8,16,32,64}` kernels store.
pub(crate) fn fill_pattern(dtype: DType, value: f64) -> u64 {
    let one = CpuStorage::full(dtype, 1, value);
    let mut word = [0u8; 8];
    word[..dtype.size_in_bytes()].copy_from_slice(one.as_bytes());
    u64::from_le_bytes(word)
}

/// `n` copies of `value` cast to `dtype` on device `ordinal`.
pub(crate) fn full(ordinal: usize, dtype: DType, n: usize, value: f64) -> Result<CudaStorage> {
    let dev = cuda::device(ordinal)?;
    let pattern = fill_pattern(dtype, value);
    if pattern == 0 {
        return CudaStorage::zeros(&dev, dtype, n);
    }
    let out = CudaStorage::alloc(&dev, dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    // The value travels as an integer of the element's width (`convert.cu`'s `T value`).
    let value = match dtype.size_in_bytes() {
        8 => Arg::U64(pattern),
        4 => Arg::U32(pattern as u32),
        2 => Arg::U16(pattern as u16),
        _ => Arg::U8(pattern as u8),
    };
    let kernel = format!("fill_b{}", dtype.size_in_bytes() * 8);
    let args = [value, Arg::U64(out.ptr()), Arg::I64(n as i64)];
    launch(&dev, &crate::ops::convert::cuda::SOURCE, &kernel, n, &args)?;
    Ok(out)
}

/// A kernel argument passed by value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    F64(f64),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    /// Also device pointers.
    U64(u64),
    Strided(StridedArg),
}

/// Launches `kernel` of `src` with `args`, over `threads` grid-stride threads, on the current
/// stream of `dev`.
pub(crate) fn launch(
    dev: &Arc<CudaDevice>,
    src: &KernelSource,
    kernel: &str,
    threads: usize,
    args: &[Arg],
) -> Result<()> {
    let f = dev.function(src, kernel)?;
    let stream = cuda::Stream::current(dev.ordinal())?;
    let mut b = stream.raw().launch_builder(&f);
    for a in args {
        match a {
            Arg::F64(x) => b.arg(x),
            Arg::I64(x) => b.arg(x),
            Arg::U8(x) => b.arg(x),
            Arg::U16(x) => b.arg(x),
            Arg::U32(x) => b.arg(x),
            Arg::U64(x) => b.arg(x),
            Arg::Strided(x) => b.arg(x),
        };
    }
    // SAFETY: callers pass the arguments their kernel declares, and pointers to buffers large
    // enough for the elements the kernel writes.
    unsafe { b.launch(launch_cfg(threads)) }.map_err(|e| launch_error(kernel, e))?;
    Ok(())
}

/// Runs `{op}_{dtype}` of `creation.cu` with `args` and then `(out, n)`.
fn generate(op: &str, ordinal: usize, dtype: DType, n: usize, args: &[Arg]) -> Result<CudaStorage> {
    let dev = cuda::device(ordinal)?;
    let out = CudaStorage::alloc(&dev, dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut all = args.to_vec();
    all.extend([Arg::U64(out.ptr()), Arg::I64(n as i64)]);
    launch(&dev, &SOURCE, &format!("{op}_{}", cuda::suffix(dtype)), n, &all)?;
    Ok(out)
}

/// Element `i` is `start + i * step`, cast to `dtype` (the CPU's `arange` formula).
pub(crate) fn arange(ordinal: usize, dtype: DType, n: usize, start: f64, step: f64) -> Result<CudaStorage> {
    generate("arange", ordinal, dtype, n, &[Arg::F64(start), Arg::F64(step)])
}

/// The CPU's `linspace` formula: from `start` for the first `steps / 2` elements, from `end` after.
pub(crate) fn linspace(
    ordinal: usize,
    dtype: DType,
    steps: usize,
    start: f64,
    end: f64,
    step: f64,
) -> Result<CudaStorage> {
    let half = (steps / 2) as i64;
    generate(
        "linspace",
        ordinal,
        dtype,
        steps,
        &[Arg::F64(start), Arg::F64(end), Arg::F64(step), Arg::I64(half)],
    )
}

/// The `rows x rows` identity, row-major.
pub(crate) fn eye(ordinal: usize, dtype: DType, rows: usize) -> Result<CudaStorage> {
    generate("eye", ordinal, dtype, rows * rows, &[Arg::I64(rows as i64)])
}
