//! Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC11): a
//! counter-based generator, the one cuRAND and PyTorch's CUDA generator use. Output block `c`
//! under key `k` is a pure function of `(c, k)`, so any thread can compute any part of a
//! stream independently, on the CPU or the GPU, and get the same numbers.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// Weyl sequence key increments: the golden ratio and sqrt(3) - 1, in 32-bit fixed point.
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Ten rounds of Philox on a 128-bit counter with a 64-bit key.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// A generator's key: the 64-bit seed split into two words, low word first.
#[inline]
pub(crate) fn key_of(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// Block `index` of the stream under `key`: the counter is the 64-bit index, low word first,
/// in the counter's first two words (the last two stay zero).
#[inline]
pub(crate) fn block(key: [u32; 2], index: u64) -> [u32; 4] {
    philox4x32_10([index as u32, (index >> 32) as u32, 0, 0], key)
}
