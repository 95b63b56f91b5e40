//! Launch helpers shared by the op families' CUDA code.

use cudarc::driver::LaunchConfig;

/// Threads per block for elementwise kernels, and the most blocks worth launching: grid-stride
/// loops cover the rest, and a few waves of blocks per SM keep the memory system busy.
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 132 * 16;

pub(crate) fn launch_cfg(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// A family's kernel source: the shared header followed by the family's `.cu` file, or files in
/// order (paths from the crate root), embedded at build time.
macro_rules! source {
    ($name:literal, $($file:literal),+) => {
        $crate::cuda::KernelSource {
            name: $name,
            code: concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/common.cuh")),
                $("\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $file))),+
            ),
        }
    };
}
pub(crate) use source;

/// The kernel-name suffix of a dtype (`unary_bf16`).
pub(crate) fn suffix(dtype: crate::DType) -> &'static str {
    use crate::DType::*;
    match dtype {
        F32 => "f32",
        F64 => "f64",
        BF16 => "bf16",
        F16 => "f16",
        I64 => "i64",
        U32 => "u32",
        U8 => "u8",
        Bool => "bool",
    }
}

/// Panics with the op's name when a launch fails: like a CPU kernel, a tensor op does not return
/// `Result`; a failed launch means a broken device or a bug, not bad input.
pub(crate) fn expect_launch<T>(r: Result<T, impl std::fmt::Debug>, op: &str) -> T {
    r.unwrap_or_else(|e| panic!("{op}: CUDA kernel failed: {e:?}"))
}
