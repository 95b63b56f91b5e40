//! Elementwise math for the CPU kernels, written so that the compiler vectorises the loops it
//! sits in: no branches (selects instead), no calls into libm. `f32::exp` and `f32::tanh` are
//! libm calls, one element at a time (5-20 ns each); the exp below is a few multiply-adds that
//! run 8 elements at a time under AVX2, which is what made softmax, cross-entropy and GELU
//! several times slower than PyTorch's (Sleef-vectorised) kernels.
//!
//! [`vectorized`] runs a closure in code compiled for AVX2 and FMA when the CPU has them (the
//! crate itself is compiled for baseline x86-64, SSE2 only), so a loop inside it gets 8-wide
//! vectors without a build for one machine.

/// Runs `f` compiled for AVX2 + FMA when the CPU has them, else as it is. Only code inlined
/// into `f` benefits: call this per row or chunk of a kernel (inside any rayon task), with the
/// loop itself in the closure, and mark the closure `#[inline(always)]` (a large closure is
/// otherwise compiled on its own, for baseline x86-64, and called).
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU was just checked to have both features.
            return unsafe { avx2(f) };
        }
    }
    f()
}

/// `exp(x)` in f32 within 2 ulp of the exact value (Cephes' `expf`: range reduction by
/// `n ln 2`, a degree-6 polynomial, scaling by `2^n` through the exponent bits); 0 below
/// -104 (where the exact value underflows f32), infinite above `ln(f32::MAX)`, NaN for NaN,
/// results in the subnormal range included.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two, the first part exact in few bits, so `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer in vector registers.
    const ROUND: f32 = 12_582_912.0;
    const LO: f32 = -104.0;
    const HI: f32 = 88.722_84; // ln(f32::MAX)
                               // Clamped so that n below stays in [-151, 129]; NaN passes through both selects.
    let xc = if x < LO { LO } else { x };
    let xc = if xc > 89.0 { 89.0 } else { xc };
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2^n as two factors, so both exponents stay normal at the ends of the range (a result
    // in the subnormal range, or just below f32::MAX).
    let ni = n as i32;
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let y = y * s1 * s2;
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between an f32 and the exact (f64) value.
    fn ulps(got: f32, exact: f64) -> f64 {
        let e = exact as f32;
        if got == e {
            return 0.0;
        }
        let ulp = (f32::from_bits(e.abs().to_bits() + 1) - e.abs()) as f64;
        (got as f64 - exact).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_over_the_whole_range() {
        let mut worst = (0.0, 0.0f32);
        // Every 997th f32 between -104 and 89, sign and all: about 2 million points.
        let check = |x: f32, worst: &mut (f64, f32)| {
            let u = ulps(exp_f32(x), (x as f64).exp());
            if u > worst.0 {
                *worst = (u, x);
            }
        };
        let mut bits = 0u32;
        while bits < 0x42b2_0000 {
            check(f32::from_bits(bits), &mut worst);
            let neg = f32::from_bits(bits | 0x8000_0000);
            if neg >= -104.0 {
                check(neg, &mut worst);
            }
            bits += 997;
        }
        assert!(worst.0 <= 2.0, "exp_f32({}) is {} ulp from exp", worst.1, worst.0);
    }

    #[test]
    fn exp_handles_the_ends_and_specials() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.5), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(88.73), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        // Just below ln(f32::MAX): finite and close; in the subnormal range: close in absolute
        // terms to the smallest subnormal.
        let top = exp_f32(88.72);
        assert!(top.is_finite() && ulps(top, (88.72f32 as f64).exp()) <= 2.0, "{top}");
        for x in [-87.5f32, -95.0, -100.0, -103.0] {
            let (got, exact) = (exp_f32(x) as f64, (x as f64).exp());
            assert!((got - exact).abs() <= 1.5e-45, "exp_f32({x}) = {got}, exact {exact}");
        }
    }

    #[test]
    fn the_vectorized_path_computes_the_same_values() {
        let xs: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) * 0.05).collect();
        let plain: Vec<f32> = xs.iter().map(|&x| exp_f32(x)).collect();
        let fast = vectorized(
            #[inline(always)]
            || xs.iter().map(|&x| exp_f32(x)).collect::<Vec<f32>>(),
        );
        for ((&x, &a), &b) in xs.iter().zip(&plain).zip(&fast) {
            assert!(ulps(b, (x as f64).exp()) <= 2.0 && ulps(a, (x as f64).exp()) <= 2.0, "x = {x}");
        }
    }
}
