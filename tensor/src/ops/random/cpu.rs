//! CPU kernels: each output element is a pure function of its index and the draw's blocks,
//! so chunks fill in parallel and the result does not depend on the thread count.

use super::generator::Stream;
use super::philox::block;
use crate::storage::CpuStorage;
use crate::strided::{chunk_len, PAR_THRESHOLD};
use crate::{DType, Element};
use half::{bf16, f16};
use rayon::prelude::*;

/// Blocks a draw of `n` elements takes when each block yields `per_block` of them.
pub(crate) fn blocks_for(n: usize, per_block: usize) -> u64 {
    n.div_ceil(per_block) as u64
}

/// Fills `out` from consecutive blocks of `stream`: `f(words, first_index, dst)` writes the
/// (up to) `per_block` elements of one block, starting at element `first_index`.
fn fill<T: Send>(
    out: &mut [T],
    stream: Stream,
    per_block: usize,
    f: impl Fn([u32; 4], usize, &mut [T]) + Sync,
) {
    let run = |start: usize, chunk: &mut [T]| {
        for (j, dst) in chunk.chunks_mut(per_block).enumerate() {
            let first = start + j * per_block;
            let words = block(stream.key, stream.first_block.wrapping_add((first / per_block) as u64));
            f(words, first, dst);
        }
    };
    if out.len() < PAR_THRESHOLD {
        run(0, out);
    } else {
        let cl = chunk_len(out.len()).next_multiple_of(per_block);
        out.par_chunks_mut(cl).enumerate().for_each(|(i, c)| run(i * cl, c));
    }
}

/// `n` elements of `dtype`, each block's values given as f64 by `f(words, first_index)`
/// and converted with the dtype's rounding.
pub(crate) fn generate(
    dtype: DType,
    n: usize,
    stream: Stream,
    per_block: usize,
    f: impl Fn([u32; 4], usize) -> [f64; 4] + Sync,
) -> CpuStorage {
    fn typed<T: Element>(
        n: usize,
        stream: Stream,
        per_block: usize,
        f: impl Fn([u32; 4], usize) -> [f64; 4] + Sync,
    ) -> CpuStorage {
        let mut out = vec![T::zero(); n];
        fill(&mut out, stream, per_block, |words, first, dst| {
            let values = f(words, first);
            for (d, &v) in dst.iter_mut().zip(&values) {
                *d = T::from_f64(v);
            }
        });
        T::into_storage(out)
    }
    match dtype {
        DType::F32 => typed::<f32>(n, stream, per_block, f),
        DType::F64 => typed::<f64>(n, stream, per_block, f),
        DType::F16 => typed::<f16>(n, stream, per_block, f),
        DType::BF16 => typed::<bf16>(n, stream, per_block, f),
        DType::I64 => typed::<i64>(n, stream, per_block, f),
        DType::U32 => typed::<u32>(n, stream, per_block, f),
        DType::U8 => typed::<u8>(n, stream, per_block, f),
        DType::Bool => typed::<bool>(n, stream, per_block, f),
    }
}

/// Two words as one 64-bit value, the first word low.
#[inline(always)]
pub(crate) fn u64_of(lo: u32, hi: u32) -> u64 {
    (hi as u64) << 32 | lo as u64
}

/// A uniform value in [0, 1) with as many random bits as `dtype`'s significand holds, so it
/// is exact in that dtype and never rounds up to 1. `words` holds one word per value for the
/// 32-bit and narrower types, two (low, high) for f64.
#[inline(always)]
pub(crate) fn unit(dtype: DType, words: &[u32]) -> f64 {
    match dtype {
        DType::F64 => (u64_of(words[0], words[1]) >> 11) as f64 * (1.0 / (1u64 << 53) as f64),
        DType::F16 => (words[0] >> 21) as f64 * (1.0 / (1u32 << 11) as f64),
        DType::BF16 => (words[0] >> 24) as f64 * (1.0 / (1u32 << 8) as f64),
        _ => (words[0] >> 8) as f64 * (1.0 / (1u32 << 24) as f64),
    }
}

/// Box-Muller on two 24-bit uniforms, in f32 as cuRAND computes it; `libm` rather than the
/// platform's maths library so every platform gives the same bits.
#[inline(always)]
pub(crate) fn box_muller_f32(a: u32, b: u32) -> [f32; 2] {
    let u1 = 1.0 - (a >> 8) as f32 * (1.0 / (1u32 << 24) as f32); // (0, 1], so the log is finite
    let u2 = (b >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
    let r = (-2.0 * libm::logf(u1)).sqrt();
    let theta = std::f32::consts::TAU * u2;
    [r * libm::cosf(theta), r * libm::sinf(theta)]
}

/// Box-Muller on two 53-bit uniforms, for f64.
#[inline(always)]
pub(crate) fn box_muller_f64(w: [u32; 4]) -> [f64; 2] {
    let u1 = 1.0 - unit(DType::F64, &w[0..2]);
    let u2 = unit(DType::F64, &w[2..4]);
    let r = (-2.0 * libm::log(u1)).sqrt();
    let theta = std::f64::consts::TAU * u2;
    [r * libm::cos(theta), r * libm::sin(theta)]
}

/// `n` integers uniform in `low..high` (`high > low`), one 64-bit word pair per value.
pub(crate) fn randint(n: usize, low: i64, high: i64, stream: Stream) -> Vec<i64> {
    let range = (high as i128 - low as i128) as u64;
    let mut out = vec![0i64; n];
    fill(&mut out, stream, 2, |w, _, dst| {
        for (j, d) in dst.iter_mut().enumerate() {
            let r = u64_of(w[2 * j], w[2 * j + 1]) % range;
            *d = (low as i128 + r as i128) as i64;
        }
    });
    out
}

/// A random permutation of `0..n`: indices sorted by a random 64-bit key each (ties, which
/// have probability ~n^2 / 2^65, by index), the method that sorts in parallel on a GPU too.
pub(crate) fn randperm(n: usize, stream: Stream) -> Vec<i64> {
    let mut keyed = vec![(0u64, 0i64); n];
    fill(&mut keyed, stream, 2, |w, first, dst| {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = (u64_of(w[2 * j], w[2 * j + 1]), (first + j) as i64);
        }
    });
    if n < PAR_THRESHOLD {
        keyed.sort_unstable();
    } else {
        keyed.par_sort_unstable();
    }
    keyed.into_iter().map(|(_, i)| i).collect()
}
