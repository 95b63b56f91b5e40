// Shared by every kernel source: element types, conversions, strided indexing.
// Prepended to each op family's .cu before NVRTC compiles it (no include paths needed).
// bf16 and f16 travel as their 16-bit patterns and compute in f32, as on the CPU backend.

typedef unsigned short bf16_t;
typedef unsigned short f16_t;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned char u8;

#define MAX_DIMS 8

struct Strided {
    int rank;
    int contiguous;
    i64 offset;
    i64 dims[MAX_DIMS];
    i64 strides[MAX_DIMS];
};

// a / b and a % b, in 32 bits when both lie in [0, 2^31), as indices and extents nearly always
// do: a 64-bit division is a long software routine on the GPU, a 32-bit one a few instructions.
// Exact for every i64 (negative operands take the 64-bit path).
__device__ __forceinline__ i64 fast_div(i64 a, i64 b) {
    return ((a | b) >> 31) == 0 ? (i64)((u32)a / (u32)b) : a / b;
}
__device__ __forceinline__ i64 fast_mod(i64 a, i64 b) { return a - fast_div(a, b) * b; }

// Storage offset of the i-th element (row-major order) of a strided view.
__device__ __forceinline__ i64 strided_offset(const Strided& s, i64 i) {
    if (s.contiguous) return s.offset + i;
    i64 off = s.offset;
    for (int d = s.rank - 1; d >= 0; --d) {
        i64 q = fast_div(i, s.dims[d]);
        off += (i - q * s.dims[d]) * s.strides[d];
        i = q;
    }
    return off;
}

__device__ __forceinline__ float bf16_to_f32(bf16_t x) { return __uint_as_float(((unsigned)x) << 16); }
// Round to nearest even; NaN stays NaN (quiet).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
__device__ __forceinline__ float f16_to_f32(f16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ f16_t f32_to_f16(float f) {
    f16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Load an element as its compute type, and store a compute value back.
__device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ double load(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load_bf16(const bf16_t* p, i64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float load_f16(const f16_t* p, i64 i) { return f16_to_f32(p[i]); }

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// Math in the compute type: float for f32/f16/bf16, double for f64 and integers.
#define MATH1(name, ff, fd) \
    __device__ __forceinline__ float name(float x) { return ff(x); } \
    __device__ __forceinline__ double name(double x) { return fd(x); }
MATH1(m_exp, expf, exp)
MATH1(m_log, logf, log)
MATH1(m_log1p, log1pf, log1p)
MATH1(m_sqrt, sqrtf, sqrt)
MATH1(m_sin, sinf, sin)
MATH1(m_cos, cosf, cos)
MATH1(m_tanh, tanhf, tanh)
MATH1(m_erf, erff, erf)
MATH1(m_floor, floorf, floor)
MATH1(m_ceil, ceilf, ceil)
MATH1(m_rint, rintf, rint)
MATH1(m_abs, fabsf, fabs)
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

// Any element as a double (exact for every dtype but i64 beyond 2^53).
#define LOAD_F32(x) ((double)(x))
#define LOAD_F64(x) ((double)(x))
#define LOAD_BF16(x) ((double)bf16_to_f32(x))
#define LOAD_F16(x) ((double)f16_to_f32(x))
#define LOAD_I64(x) ((double)(x))
#define LOAD_U32(x) ((double)(x))
#define LOAD_U8(x) ((double)(x))
#define LOAD_BOOL(x) ((x) ? 1.0 : 0.0)

// Casts from a double with the CPU's `Element::from_f64` rules (PyTorch's): floats round to
// nearest even, float-to-int truncates toward zero and saturates (NaN gives 0, like Rust's
// `as`), unsigned targets go through i64 and wrap (-1.0 -> 255), bool is `d != 0`.
__device__ __forceinline__ double sat_trunc(double d, double lo, double hi) {
    if (d != d) return 0.0;
    d = trunc(d);
    return d < lo ? lo : (d > hi ? hi : d);
}
#define STORE_F32(d) ((float)(d))
#define STORE_F64(d) (d)
#define STORE_BF16(d) f32_to_bf16((float)(d))
#define STORE_F16(d) f32_to_f16((float)(d))
#define STORE_I64(d) ((i64)sat_trunc(d, -9223372036854775808.0, 9223372036854775807.0))
#define STORE_U32(d) ((u32)(i64)sat_trunc(d, -9223372036854775808.0, 9223372036854775807.0))
#define STORE_U8(d) ((u8)(i64)sat_trunc(d, -9223372036854775808.0, 9223372036854775807.0))
#define STORE_BOOL(d) ((u8)((d) != 0.0))
