// Binary elementwise kernels with broadcasting (operands arrive as broadcast strided views).
// `op` codes follow `BinaryOp::code()` and `CmpOp::code()` in mod.rs.

template <typename C>
__device__ __forceinline__ C binary_apply(int op, C x, C y) {
    switch (op) {
        case 0: return x + y;
        case 1: return x - y;
        case 2: return x * y;
        case 3: return x / y;
        case 4: return (x != x || x > y) ? x : y;  // maximum, NaN propagates
        case 5: return (x != x || x < y) ? x : y;  // minimum
        case 6: return m_pow(x, y);
    }
    return x;
}

template <typename C>
__device__ __forceinline__ bool cmp_apply(int op, C x, C y) {
    switch (op) {
        case 0: return x == y;
        case 1: return x != y;
        case 2: return x < y;
        case 3: return x <= y;
        case 4: return x > y;
        case 5: return x >= y;
    }
    return false;
}

#define ID(x) (x)
#define BINARY(SUFFIX, T, C, LOAD, STORE)                                                        \
    extern "C" __global__ void binary_##SUFFIX(int op, Strided sa, Strided sb, const T* a,        \
                                               const T* b, T* out, i64 n) {                      \
        if (sa.contiguous && sb.contiguous) {                                                    \
            const T* pa = a + sa.offset;                                                         \
            const T* pb = b + sb.offset;                                                         \
            FOR_EACH(i, n) { out[i] = STORE(binary_apply<C>(op, LOAD(pa[i]), LOAD(pb[i]))); }    \
        } else {                                                                                 \
            FOR_EACH(i, n) {                                                                     \
                C x = LOAD(a[strided_offset(sa, i)]);                                            \
                C y = LOAD(b[strided_offset(sb, i)]);                                            \
                out[i] = STORE(binary_apply<C>(op, x, y));                                       \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    extern "C" __global__ void cmp_##SUFFIX(int op, Strided sa, Strided sb, const T* a,           \
                                            const T* b, u8* out, i64 n) {                        \
        FOR_EACH(i, n) {                                                                         \
            out[i] = cmp_apply<C>(op, LOAD(a[strided_offset(sa, i)]), LOAD(b[strided_offset(sb, i)])); \
        }                                                                                        \
    }
BINARY(f32, float, float, ID, ID)
BINARY(f64, double, double, ID, ID)
BINARY(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
BINARY(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Integer arithmetic wraps, as on the CPU; division and pow are rejected before launch.
template <typename T>
__device__ __forceinline__ T int_apply(int op, T x, T y) {
    switch (op) {
        // Through unsigned 64-bit, where overflow is defined to wrap.
        case 0: return (T)((unsigned long long)x + (unsigned long long)y);
        case 1: return (T)((unsigned long long)x - (unsigned long long)y);
        case 2: return (T)((unsigned long long)x * (unsigned long long)y);
        case 4: return x > y ? x : y;
        case 5: return x < y ? x : y;
    }
    return x;
}
#define BINARY_INT(SUFFIX, T)                                                                    \
    extern "C" __global__ void binary_##SUFFIX(int op, Strided sa, Strided sb, const T* a,        \
                                               const T* b, T* out, i64 n) {                      \
        FOR_EACH(i, n) { out[i] = int_apply<T>(op, a[strided_offset(sa, i)], b[strided_offset(sb, i)]); } \
    }                                                                                            \
    extern "C" __global__ void cmp_##SUFFIX(int op, Strided sa, Strided sb, const T* a,           \
                                            const T* b, u8* out, i64 n) {                        \
        FOR_EACH(i, n) { out[i] = cmp_apply<T>(op, a[strided_offset(sa, i)], b[strided_offset(sb, i)]); } \
    }
BINARY_INT(i64, i64)
BINARY_INT(u32, u32)
BINARY_INT(u8, u8)

// bool: + and maximum are or, * and minimum are and.
extern "C" __global__ void binary_bool(int op, Strided sa, Strided sb, const u8* a, const u8* b,
                                       u8* out, i64 n) {
    FOR_EACH(i, n) {
        u8 x = a[strided_offset(sa, i)], y = b[strided_offset(sb, i)];
        out[i] = (op == 0 || op == 4) ? (x | y) : (x & y);
    }
}
extern "C" __global__ void cmp_bool(int op, Strided sa, Strided sb, const u8* a, const u8* b,
                                    u8* out, i64 n) {
    FOR_EACH(i, n) { out[i] = cmp_apply<int>(op, a[strided_offset(sa, i)], b[strided_offset(sb, i)]); }
}

// torch.where: out = cond ? x : y, element size in bytes chosen by the kernel name.
#define WHERE(BITS, T)                                                                           \
    extern "C" __global__ void where_b##BITS(Strided sc, Strided sx, Strided sy, const u8* c,    \
                                             const T* x, const T* y, T* out, i64 n) {            \
        FOR_EACH(i, n) { out[i] = c[strided_offset(sc, i)] ? x[strided_offset(sx, i)] : y[strided_offset(sy, i)]; } \
    }
WHERE(8, u8)
WHERE(16, unsigned short)
WHERE(32, u32)
WHERE(64, unsigned long long)

// Contiguous, 16-byte-aligned operands: 16-byte loads and stores, as the memory system wants
// (scalar 4-byte accesses reach about 70% of the bandwidth on an H200). The tail that does not
// fill a 16-byte vector is done element by element.
#define BINARY_VEC(SUFFIX, T, C, LOAD, STORE)                                                    \
    extern "C" __global__ void binary_vec_##SUFFIX(int op, const T* a, const T* b, T* out, i64 n) { \
        const int V = 16 / sizeof(T);                                                            \
        const i64 nv = n / V;                                                                    \
        const uint4* av = (const uint4*)a;                                                       \
        const uint4* bv = (const uint4*)b;                                                       \
        uint4* ov = (uint4*)out;                                                                 \
        FOR_EACH(i, nv) {                                                                        \
            uint4 x = av[i], y = bv[i], r;                                                       \
            const T* xs = (const T*)&x;                                                          \
            const T* ys = (const T*)&y;                                                          \
            T* rs = (T*)&r;                                                                      \
            _Pragma("unroll") for (int j = 0; j < V; ++j) rs[j] = STORE(binary_apply<C>(op, LOAD(xs[j]), LOAD(ys[j]))); \
            ov[i] = r;                                                                           \
        }                                                                                        \
        FOR_EACH(k, n - nv * V) {                                                                \
            i64 i = nv * V + k;                                                                  \
            out[i] = STORE(binary_apply<C>(op, LOAD(a[i]), LOAD(b[i])));                         \
        }                                                                                        \
    }
BINARY_VEC(f32, float, float, ID, ID)
BINARY_VEC(f64, double, double, ID, ID)
BINARY_VEC(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
BINARY_VEC(f16, f16_t, float, f16_to_f32, f32_to_f16)

// One contiguous operand and one that repeats a contiguous block of `inner` elements along
// the leading dims (a bias over rows, a positional table over the batch), both 16-byte
// aligned with `inner` a whole number of vectors: 16-byte loads of both, where the strided
// kernel would do a division per dim and a 2-byte access per element. `row_first` says the
// repeating operand is the left one (the op need not commute).
#define BINARY_ROWVEC(SUFFIX, T, C, LOAD, STORE)                                                 \
    extern "C" __global__ void binary_rowvec_##SUFFIX(int op, const T* full, const T* row, T* out, \
                                                      i64 nv, i64 inner_vecs, int row_first) {   \
        const int V = 16 / sizeof(T);                                                            \
        const uint4* fv = (const uint4*)full;                                                    \
        const uint4* rv = (const uint4*)row;                                                     \
        uint4* ov = (uint4*)out;                                                                 \
        FOR_EACH(i, nv) {                                                                        \
            uint4 x = fv[i], y = rv[fast_mod(i, inner_vecs)], r;                                 \
            const T* xs = (const T*)&x;                                                          \
            const T* ys = (const T*)&y;                                                          \
            T* rs = (T*)&r;                                                                      \
            if (row_first) {                                                                     \
                _Pragma("unroll") for (int j = 0; j < V; ++j) rs[j] = STORE(binary_apply<C>(op, LOAD(ys[j]), LOAD(xs[j]))); \
            } else {                                                                             \
                _Pragma("unroll") for (int j = 0; j < V; ++j) rs[j] = STORE(binary_apply<C>(op, LOAD(xs[j]), LOAD(ys[j]))); \
            }                                                                                    \
            ov[i] = r;                                                                           \
        }                                                                                        \
    }
BINARY_ROWVEC(f32, float, float, ID, ID)
BINARY_ROWVEC(f64, double, double, ID, ID)
BINARY_ROWVEC(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
BINARY_ROWVEC(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Backward ops that combine an output gradient g with the op's input x elementwise, each in a
// strided form (any layouts) and a vector form (contiguous, 16-byte aligned): NAME(g, x, p) in
// the compute type, p one scalar parameter.
#define GRAD_PAIR(NAME, SUFFIX, T, C, LOAD, STORE)                                               \
    extern "C" __global__ void NAME##_##SUFFIX(Strided sg, Strided sx, const T* g, const T* x,   \
                                               T* out, i64 n, double p) {                        \
        FOR_EACH(i, n) out[i] = STORE(NAME<C>(LOAD(g[strided_offset(sg, i)]), LOAD(x[strided_offset(sx, i)]), p)); \
    }                                                                                            \
    extern "C" __global__ void NAME##_vec_##SUFFIX(const T* g, const T* x, T* out, i64 n, double p) { \
        const int V = 16 / sizeof(T);                                                            \
        const i64 nv = n / V;                                                                    \
        FOR_EACH(i, nv) {                                                                        \
            uint4 gv = ((const uint4*)g)[i], xv = ((const uint4*)x)[i], r;                       \
            const T* gs = (const T*)&gv;                                                         \
            const T* xs = (const T*)&xv;                                                         \
            T* rs = (T*)&r;                                                                      \
            _Pragma("unroll") for (int j = 0; j < V; ++j) rs[j] = STORE(NAME<C>(LOAD(gs[j]), LOAD(xs[j]), p)); \
            ((uint4*)out)[i] = r;                                                                \
        }                                                                                        \
        FOR_EACH(k, n - nv * V) {                                                                \
            const i64 i = nv * V + k;                                                            \
            out[i] = STORE(NAME<C>(LOAD(g[i]), LOAD(x[i]), p));                                  \
        }                                                                                        \
    }
#define GRAD_PAIR_ALL(NAME)                                                                      \
    GRAD_PAIR(NAME, f32, float, float, ID, ID)                                                   \
    GRAD_PAIR(NAME, f64, double, double, ID, ID)                                                 \
    GRAD_PAIR(NAME, bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)                               \
    GRAD_PAIR(NAME, f16, f16_t, float, f16_to_f32, f32_to_f16)

// ReLU's backward: g where x > p, else 0 (a NaN input gives 0, as on the CPU). g passes
// through the compute type unchanged.
template <typename C> __device__ __forceinline__ C threshold_backward(C g, C x, double p) {
    return x > (C)p ? g : (C)0;
}
GRAD_PAIR_ALL(threshold_backward)

// GELU's backward, exact: g * (Phi(x) + x phi(x)).
template <typename C> __device__ __forceinline__ C gelu_backward(C g, C x, double) {
    const C cdf = (C)0.5 * ((C)1 + m_erf(x * (C)0.70710678118654752440));
    const C pdf = (C)0.39894228040143267794 * m_exp((C)-0.5 * x * x);
    return g * (cdf + x * pdf);
}
GRAD_PAIR_ALL(gelu_backward)

// GELU's backward, tanh approximation: g * d/dx [0.5 x (1 + tanh(c (x + 0.044715 x^3)))].
template <typename C> __device__ __forceinline__ C gelu_tanh_backward(C g, C x, double) {
    const C c = (C)0.79788456080286535588, k = (C)0.044715;
    const C t = m_tanh(c * (x + k * x * x * x));
    return g * ((C)0.5 * ((C)1 + t) + (C)0.5 * x * ((C)1 - t * t) * c * ((C)1 + (C)3 * k * x * x));
}
GRAD_PAIR_ALL(gelu_tanh_backward)
