// Unary elementwise kernels. `op` codes follow `UnaryOp::code()` in mod.rs.
// One kernel per dtype; the switch on `op` is uniform across the grid, so it costs no divergence.

template <typename C>
__device__ __forceinline__ C unary_apply(int op, C x, C p0, C p1) {
    const C zero = 0, one = 1, half = 0.5;
    switch (op) {
        case 0: return -x;                                   // neg
        case 1: return m_abs(x);                             // abs
        case 2: return m_exp(x);                             // exp
        case 3: return m_log(x);                             // log
        case 4: return m_log1p(x);                           // log1p
        case 5: return m_sqrt(x);                            // sqrt
        case 6: return one / m_sqrt(x);                      // rsqrt
        case 7: return m_sin(x);                             // sin
        case 8: return m_cos(x);                             // cos
        case 9: return m_tanh(x);                            // tanh
        case 10: return one / (one + m_exp(-x));             // sigmoid
        case 11: return x < zero ? zero : x;                 // relu (NaN passes)
        case 12: return half * x * (one + m_erf(x * (C)0.70710678118654752440));  // gelu
        case 13: {                                           // gelu, tanh form
            const C k = (C)0.79788456080286535588;          // sqrt(2/pi)
            return half * x * (one + m_tanh(k * (x + (C)0.044715 * x * x * x)));
        }
        case 14: return x / (one + m_exp(-x));               // silu
        case 15: return x * x;                               // square
        case 16: return one / x;                             // reciprocal
        case 17: return x > zero ? one : (x < zero ? -one : zero);  // sign (NaN gives 0)
        case 18: return m_floor(x);
        case 19: return m_ceil(x);
        case 20: return m_rint(x);                           // round half to even
        case 21: return x * p0 + p1;                         // affine
        case 22:                                             // pow, special exponents as PyTorch
            if (p0 == (C)0.5) return m_sqrt(x);
            if (p0 == (C)-0.5) return one / m_sqrt(x);
            if (p0 == (C)2) return x * x;
            if (p0 == (C)3) return x * x * x;
            if (p0 == (C)-1) return one / x;
            if (p0 == (C)-2) return one / (x * x);
            return m_pow(x, p0);
        case 23:                                             // clamp; a NaN bound gives NaN
            if (p0 != p0 || p1 != p1) return p0 + p1;
            return x < p0 ? p0 : (x > p1 ? p1 : x);
    }
    return x;
}

#define UNARY_FLOAT(SUFFIX, T, C, LOAD, STORE)                                                   \
    extern "C" __global__ void unary_##SUFFIX(int op, double p0, double p1, Strided s,           \
                                              const T* in, T* out, i64 n) {                      \
        const C a = (C)p0, b = (C)p1;                                                            \
        FOR_EACH(i, n) { out[i] = STORE(unary_apply<C>(op, LOAD(in[strided_offset(s, i)]), a, b)); } \
    }
// Contiguous, 16-byte-aligned input: 16-byte loads and stores; the tail element by element.
// OP >= 0 fixes the op at compile time: the hot ops of training (relu, the GELUs, silu, affine)
// get kernels of their own (`unary_vec<OP>_<dtype>`), free of the other cases' code and
// registers, which cost the generic kernel (OP = -1, op read at run time) occupancy.
#define UNARY_VEC_KERNEL(NAME, OP, T, C, LOAD, STORE)                                            \
    extern "C" __global__ void NAME(int op, double p0, double p1, const T* in, T* out, i64 n) {  \
        const C a = (C)p0, b = (C)p1;                                                            \
        const int code = OP < 0 ? op : OP;                                                       \
        const int V = 16 / sizeof(T);                                                            \
        const i64 nv = n / V;                                                                    \
        FOR_EACH(i, nv) {                                                                        \
            uint4 x = ((const uint4*)in)[i], r;                                                  \
            const T* xs = (const T*)&x;                                                          \
            T* rs = (T*)&r;                                                                      \
            _Pragma("unroll") for (int j = 0; j < V; ++j) rs[j] = STORE(unary_apply<C>(code, LOAD(xs[j]), a, b)); \
            ((uint4*)out)[i] = r;                                                                \
        }                                                                                        \
        FOR_EACH(k, n - nv * V) {                                                                \
            const i64 i = nv * V + k;                                                            \
            out[i] = STORE(unary_apply<C>(code, LOAD(in[i]), a, b));                             \
        }                                                                                        \
    }
#define UNARY_VEC(SUFFIX, T, C, LOAD, STORE)                                                     \
    UNARY_VEC_KERNEL(unary_vec_##SUFFIX, -1, T, C, LOAD, STORE)                                  \
    UNARY_VEC_KERNEL(unary_vec11_##SUFFIX, 11, T, C, LOAD, STORE)                                \
    UNARY_VEC_KERNEL(unary_vec12_##SUFFIX, 12, T, C, LOAD, STORE)                                \
    UNARY_VEC_KERNEL(unary_vec13_##SUFFIX, 13, T, C, LOAD, STORE)                                \
    UNARY_VEC_KERNEL(unary_vec14_##SUFFIX, 14, T, C, LOAD, STORE)                                \
    UNARY_VEC_KERNEL(unary_vec21_##SUFFIX, 21, T, C, LOAD, STORE)
#define ID(x) (x)
UNARY_VEC(f32, float, float, ID, ID)
UNARY_VEC(f64, double, double, ID, ID)
UNARY_VEC(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
UNARY_VEC(f16, f16_t, float, f16_to_f32, f32_to_f16)
UNARY_FLOAT(f32, float, float, ID, ID)
UNARY_FLOAT(f64, double, double, ID, ID)
UNARY_FLOAT(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
UNARY_FLOAT(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Integers compute exactly and wrap, as PyTorch's integer arithmetic (and the CPU backend):
// arithmetic in unsigned 64-bit, comparisons in signed 64-bit (every i64/u32/u8 value fits).
// `ip0`/`ip1` are the integral parameters (affine factors, clamp bounds rounded inward);
// `integral` says whether an affine's factors are whole numbers (else it computes in double and
// truncates, saturating to i64 like Rust's `as`).
__device__ __forceinline__ long long sat_i64(double d) {
    if (d != d) return 0;
    if (d >= 9223372036854775807.0) return 9223372036854775807LL;
    if (d <= -9223372036854775808.0) return (long long)(-9223372036854775807LL - 1);
    return (long long)d;
}
#define UNARY_INT(SUFFIX, T)                                                                     \
    extern "C" __global__ void unary_##SUFFIX(int op, double p0, double p1, long long ip0,       \
                                              long long ip1, int integral, Strided s,            \
                                              const T* in, T* out, i64 n) {                      \
        FOR_EACH(i, n) {                                                                         \
            long long x = (long long)in[strided_offset(s, i)];                                   \
            unsigned long long ux = (unsigned long long)x, r = ux;                               \
            switch (op) {                                                                        \
                case 0: r = 0ull - ux; break;                                                    \
                case 1: r = x < 0 ? 0ull - ux : ux; break;                                       \
                case 11: r = x < 0 ? 0ull : ux; break;                                           \
                case 15: r = ux * ux; break;                                                     \
                case 17: r = (unsigned long long)(long long)((x > 0) - (x < 0)); break;          \
                case 21:                                                                         \
                    r = integral ? ux * (unsigned long long)ip0 + (unsigned long long)ip1        \
                                 : (unsigned long long)sat_i64((double)x * p0 + p1);             \
                    break;                                                                       \
                case 23: r = (unsigned long long)(x < ip0 ? ip0 : (x > ip1 ? ip1 : x)); break;   \
            }                                                                                    \
            out[i] = (T)r;                                                                       \
        }                                                                                        \
    }
UNARY_INT(i64, i64)
UNARY_INT(u32, u32)
UNARY_INT(u8, u8)
