// Random tensors from the CPU backend's Philox4x32-10 stream, element for element (the stream
// layout is documented in `ops/random/mod.rs`). One thread computes one Philox block and writes
// the (up to) 2 or 4 elements that block yields. Arithmetic that the CPU rounds step by step
// uses __dmul_rn / __dadd_rn (NVRTC runs with --fmad=true, and a fused multiply-add would round
// once where the CPU rounds twice), so uniform, bernoulli and randint are bit-identical.
// Box-Muller needs log, sin and cos: the CPU uses `libm`'s, which CUDA does not have; here they
// are evaluated in double (f32 normals) or with CUDA's double functions (f64 normals), so
// normals agree with the CPU to about one ulp of the dtype, not bit for bit.

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

struct Words { u32 w[4]; };

// Block `index` of the stream under key (k0, k1): counter (index lo, index hi, 0, 0).
__device__ __forceinline__ Words philox_block(u32 k0, u32 k1, unsigned long long index) {
    u32 c0 = (u32)index, c1 = (u32)(index >> 32), c2 = 0, c3 = 0;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        u32 hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        u32 hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    Words r;
    r.w[0] = c0; r.w[1] = c1; r.w[2] = c2; r.w[3] = c3;
    return r;
}

__device__ __forceinline__ unsigned long long u64_of(u32 lo, u32 hi) {
    return ((unsigned long long)hi << 32) | lo;
}

// Uniforms in [0, 1) with as many random bits as the dtype's significand (exact products).
#define UNIT_F32(w) ((double)((w) >> 8) * (1.0 / 16777216.0))
#define UNIT_F16(w) ((double)((w) >> 21) * (1.0 / 2048.0))
#define UNIT_BF16(w) ((double)((w) >> 24) * (1.0 / 256.0))
__device__ __forceinline__ double unit_f64(u32 lo, u32 hi) {
    return (double)(u64_of(lo, hi) >> 11) * (1.0 / 9007199254740992.0);
}

// The CPU's `low + (high - low) * u`, rounded at each step.
__device__ __forceinline__ double affine(double low, double high, double u) {
    return __dadd_rn(low, __dmul_rn(__dsub_rn(high, low), u));
}

// Box-Muller in f32 on two 24-bit uniforms, as the CPU's `box_muller_f32`; the transcendental
// functions in double and rounded once, the closest we get to `libm`'s f32 results.
__device__ __forceinline__ void box_muller_f32(u32 a, u32 b, float* z0, float* z1) {
    float u1 = __fsub_rn(1.0f, __fmul_rn((float)(a >> 8), 1.0f / 16777216.0f));
    float u2 = __fmul_rn((float)(b >> 8), 1.0f / 16777216.0f);
    float r = __fsqrt_rn(__fmul_rn(-2.0f, (float)log((double)u1)));
    float theta = __fmul_rn(6.28318530717958647692f, u2);
    *z0 = __fmul_rn(r, (float)cos((double)theta));
    *z1 = __fmul_rn(r, (float)sin((double)theta));
}

__device__ __forceinline__ void box_muller_f64(Words w, double* z0, double* z1) {
    double u1 = __dsub_rn(1.0, unit_f64(w.w[0], w.w[1]));
    double u2 = unit_f64(w.w[2], w.w[3]);
    double r = __dsqrt_rn(__dmul_rn(-2.0, log(u1)));
    double theta = __dmul_rn(6.28318530717958647692, u2);
    *z0 = __dmul_rn(r, cos(theta));
    *z1 = __dmul_rn(r, sin(theta));
}

// Grid-stride loop over the draw's blocks: element i comes from block first + i / k.
#define FOR_EACH_BLOCK(b, n, k) FOR_EACH(b, ((n) + (k) - 1) / (k))
#define BLOCK(b) philox_block(k0, k1, first + (unsigned long long)(b))

// 32-bit and narrower floats: four elements per block, one word each.
#define FLOAT_KERNELS(SN, T, STORE, UNIT)                                                        \
    extern "C" __global__ void uniform_##SN(u32 k0, u32 k1, unsigned long long first,            \
                                            double low, double high, T* out, i64 n) {            \
        FOR_EACH_BLOCK(b, n, 4) {                                                                \
            Words w = BLOCK(b);                                                                  \
            for (int j = 0; j < 4; ++j) {                                                        \
                i64 i = b * 4 + j;                                                               \
                if (i < n) out[i] = STORE(affine(low, high, UNIT(w.w[j])));                      \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    extern "C" __global__ void normal_##SN(u32 k0, u32 k1, unsigned long long first,             \
                                           double mean, double std, T* out, i64 n) {             \
        FOR_EACH_BLOCK(b, n, 4) {                                                                \
            Words w = BLOCK(b);                                                                  \
            float z[4];                                                                          \
            box_muller_f32(w.w[0], w.w[1], &z[0], &z[1]);                                        \
            box_muller_f32(w.w[2], w.w[3], &z[2], &z[3]);                                        \
            for (int j = 0; j < 4; ++j) {                                                        \
                i64 i = b * 4 + j;                                                               \
                if (i < n) out[i] = STORE(__dadd_rn(mean, __dmul_rn(std, (double)z[j])));        \
            }                                                                                    \
        }                                                                                        \
    }
FLOAT_KERNELS(f32, float, STORE_F32, UNIT_F32)
FLOAT_KERNELS(bf16, bf16_t, STORE_BF16, UNIT_BF16)
FLOAT_KERNELS(f16, f16_t, STORE_F16, UNIT_F16)

// f64: two elements per block, two words (low, high) each.
extern "C" __global__ void uniform_f64(u32 k0, u32 k1, unsigned long long first, double low,
                                       double high, double* out, i64 n) {
    FOR_EACH_BLOCK(b, n, 2) {
        Words w = BLOCK(b);
        for (int j = 0; j < 2; ++j) {
            i64 i = b * 2 + j;
            if (i < n) out[i] = affine(low, high, unit_f64(w.w[2 * j], w.w[2 * j + 1]));
        }
    }
}
extern "C" __global__ void normal_f64(u32 k0, u32 k1, unsigned long long first, double mean,
                                      double std, double* out, i64 n) {
    FOR_EACH_BLOCK(b, n, 2) {
        double z[2];
        box_muller_f64(BLOCK(b), &z[0], &z[1]);
        for (int j = 0; j < 2; ++j) {
            i64 i = b * 2 + j;
            if (i < n) out[i] = __dadd_rn(mean, __dmul_rn(std, z[j]));
        }
    }
}

// Bernoulli: element i is 1 when word * 2^-32 < p, with p a scalar or read from a strided
// tensor of the output's dtype; four elements per block.
#define BERNOULLI(SN, T, STORE, LOAD)                                                            \
    extern "C" __global__ void bernoulli_##SN(u32 k0, u32 k1, unsigned long long first,          \
                                              double p, T* out, i64 n) {                         \
        FOR_EACH_BLOCK(b, n, 4) {                                                                \
            Words w = BLOCK(b);                                                                  \
            for (int j = 0; j < 4; ++j) {                                                        \
                i64 i = b * 4 + j;                                                               \
                if (i < n) out[i] = STORE(((double)w.w[j] * (1.0 / 4294967296.0) < p) ? 1.0 : 0.0); \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    extern "C" __global__ void bernoulli_tensor_##SN(u32 k0, u32 k1, unsigned long long first,   \
                                                     Strided s, const T* probs, T* out, i64 n) { \
        FOR_EACH_BLOCK(b, n, 4) {                                                                \
            Words w = BLOCK(b);                                                                  \
            for (int j = 0; j < 4; ++j) {                                                        \
                i64 i = b * 4 + j;                                                               \
                if (i < n) {                                                                     \
                    double p = LOAD(probs[strided_offset(s, i)]);                                \
                    out[i] = STORE(((double)w.w[j] * (1.0 / 4294967296.0) < p) ? 1.0 : 0.0);     \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }
BERNOULLI(f32, float, STORE_F32, LOAD_F32)
BERNOULLI(f64, double, STORE_F64, LOAD_F64)
BERNOULLI(bf16, bf16_t, STORE_BF16, LOAD_BF16)
BERNOULLI(f16, f16_t, STORE_F16, LOAD_F16)
BERNOULLI(i64, i64, STORE_I64, LOAD_I64)
BERNOULLI(u32, u32, STORE_U32, LOAD_U32)
BERNOULLI(u8, u8, STORE_U8, LOAD_U8)
BERNOULLI(bool, u8, STORE_BOOL, LOAD_BOOL)

// Integers in low .. low + range: the 64-bit value of words (2j, 2j + 1) modulo range, added
// with two's-complement wrap-around (the CPU adds in i128 and truncates, the same bits).
extern "C" __global__ void randint_i64(u32 k0, u32 k1, unsigned long long first, i64 low,
                                       unsigned long long range, i64* out, i64 n) {
    FOR_EACH_BLOCK(b, n, 2) {
        Words w = BLOCK(b);
        for (int j = 0; j < 2; ++j) {
            i64 i = b * 2 + j;
            if (i < n) out[i] = (i64)((unsigned long long)low + u64_of(w.w[2 * j], w.w[2 * j + 1]) % range);
        }
    }
}
