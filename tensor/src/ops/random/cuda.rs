//! CUDA random tensors (kernels in `random.cu`): the CPU's Philox stream, element for element.

use super::generator::Stream;
use crate::cuda::{self, CudaStorage, KernelSource, StridedArg};
use crate::ops::creation::cuda::{launch, Arg};
use crate::{DType, Layout, Result};

pub(crate) const SOURCE: KernelSource = cuda::source!("random", "src/ops/random/random.cu");

/// Runs `kernel` over the draw's blocks with the stream's key and first block, then `args`,
/// then the output pointer and `n`.
fn draw(
    kernel: &str,
    ordinal: usize,
    dtype: DType,
    n: usize,
    per_block: usize,
    stream: Stream,
    args: &[Arg],
) -> Result<CudaStorage> {
    let dev = cuda::device(ordinal)?;
    let out = CudaStorage::alloc(&dev, dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut all = vec![Arg::U32(stream.key[0]), Arg::U32(stream.key[1]), Arg::U64(stream.first_block)];
    all.extend_from_slice(args);
    all.extend([Arg::U64(out.ptr()), Arg::I64(n as i64)]);
    launch(&dev, &SOURCE, kernel, n.div_ceil(per_block), &all)?;
    Ok(out)
}

/// Draws from the kernel family `name` (`uniform`, `normal`, `bernoulli`) with its f64
/// parameters, `per_block` elements from each Philox block.
pub(super) fn sample(
    name: &str,
    ordinal: usize,
    dtype: DType,
    n: usize,
    per_block: usize,
    stream: Stream,
    params: &[f64],
) -> Result<CudaStorage> {
    let kernel = format!("{name}_{}", cuda::suffix(dtype));
    let args: Vec<Arg> = params.iter().map(|&p| Arg::F64(p)).collect();
    draw(&kernel, ordinal, dtype, n, per_block, stream, &args)
}

/// Element `i` is 1 with the probability at element `i` (row-major) of the view `probs`.
pub(super) fn bernoulli_tensor(probs: &CudaStorage, layout: &Layout, stream: Stream) -> Result<CudaStorage> {
    let kernel = format!("bernoulli_tensor_{}", cuda::suffix(probs.dtype()));
    let args = [Arg::Strided(StridedArg::new(layout)), Arg::U64(probs.ptr())];
    let ordinal = probs.device().ordinal();
    draw(&kernel, ordinal, probs.dtype(), layout.elem_count(), 4, stream, &args)
}

pub(super) fn randint(ordinal: usize, n: usize, stream: Stream, low: i64, high: i64) -> Result<CudaStorage> {
    let range = (high as i128 - low as i128) as u64;
    draw("randint_i64", ordinal, DType::I64, n, 2, stream, &[Arg::I64(low), Arg::U64(range)])
}
