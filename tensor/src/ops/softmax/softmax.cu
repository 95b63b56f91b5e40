// softmax / log_softmax (`log` = 1) over the middle dim of a contiguous block [outer, n, inner].
// Semantics as the CPU backend: m = the largest non-NaN value (-inf to start), s = sum of
// exp(x - m); softmax = exp(x - m) / s, log_softmax = (x - m) - log(s). A NaN or +inf in the
// slice, or a slice of only -inf, makes s NaN and so every output NaN.
//
// Rows (inner == 1) are read once into registers: a warp per row up to 32 * 32 elements, a
// block per row up to 1024 * 16, with vector loads when rows are aligned; longer rows take a
// three-pass block kernel, and inner > 1 a thread per column.

struct SF32 {
    typedef float T; typedef float C;
    static __device__ C up(T x) { return x; }
    static __device__ T down(C c) { return c; }
};
struct SF64 {
    typedef double T; typedef double C;
    static __device__ C up(T x) { return x; }
    static __device__ T down(C c) { return c; }
};
struct SBF16 {
    typedef bf16_t T; typedef float C;
    static __device__ C up(T x) { return bf16_to_f32(x); }
    static __device__ T down(C c) { return f32_to_bf16(c); }
};
struct SF16 {
    typedef f16_t T; typedef float C;
    static __device__ C up(T x) { return f16_to_f32(x); }
    static __device__ T down(C c) { return f32_to_f16(c); }
};

__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000LL); }

template <typename C> __device__ __forceinline__ C warp_max(C x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        C y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y > x ? y : x;
    }
    return x;
}
template <typename C> __device__ __forceinline__ C warp_sum(C x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The block-wide max (MAX) or sum, returned to every thread.
template <typename C, bool MAX> __device__ C block_reduce(C x) {
    __shared__ C partial[32];
    x = MAX ? warp_max(x) : warp_sum(x);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();  // an earlier call may still be reading `partial`
    if (l == 0) partial[w] = x;
    __syncthreads();
    x = l < nw ? partial[l] : (MAX ? neg_inf(x) : (C)0);
    return MAX ? warp_max(x) : warp_sum(x);
}

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

// One row per warp (WARP) or per block, VPT values per thread held in registers. Thread t of a
// group of G holds the VEC-element chunks starting at (c * G + t) * VEC; with VEC > 1 the host
// guarantees n % VEC == 0 and aligned rows, so a chunk is wholly inside the row or outside.
template <class E, int VPT, int VEC, bool WARP>
__device__ void softmax_rows(const typename E::T* in, typename E::T* out, long long rows, long long n, int log) {
    typedef typename E::T T;
    typedef typename E::C C;
    const int G = WARP ? 32 : blockDim.x;
    const int t = WARP ? (threadIdx.x & 31) : threadIdx.x;
    const long long row = WARP ? (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
    if (row >= rows) return;  // uniform per warp (WARP) or per block
    const T* x = in + row * n;
    T* y = out + row * n;
    const C ninf = neg_inf((C)0);
    C v[VPT];
#pragma unroll
    for (int c = 0; c < VPT / VEC; ++c) {
        const long long idx = ((long long)c * G + t) * VEC;
        if (idx < n) {
            Pack<T, VEC> p = *(const Pack<T, VEC>*)(x + idx);
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[c * VEC + e] = E::up(p.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[c * VEC + e] = ninf;
        }
    }
    C m = ninf;
#pragma unroll
    for (int i = 0; i < VPT; ++i) m = v[i] > m ? v[i] : m;
    m = WARP ? warp_max(m) : block_reduce<C, true>(m);
    // Padding is -inf: exp gives 0, or NaN only where the real elements already give NaN.
    C s = 0;
    if (log) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) s += m_exp(v[i] - m);
    } else {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            v[i] = m_exp(v[i] - m);
            s += v[i];
        }
    }
    s = WARP ? warp_sum(s) : block_reduce<C, false>(s);
    const C log_s = m_log(s);
#pragma unroll
    for (int c = 0; c < VPT / VEC; ++c) {
        const long long idx = ((long long)c * G + t) * VEC;
        if (idx < n) {
            Pack<T, VEC> p;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const C a = v[c * VEC + e];
                p.v[e] = E::down(log ? (a - m) - log_s : a / s);
            }
            *(Pack<T, VEC>*)(y + idx) = p;
        }
    }
}

// Rows too long for registers: a block per row, three passes (the re-reads mostly hit L2).
template <class E>
__device__ void softmax_long_rows(const typename E::T* in, typename E::T* out, long long rows, long long n, int log) {
    typedef typename E::C C;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const typename E::T* x = in + row * n;
        typename E::T* y = out + row * n;
        C m = neg_inf((C)0);
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            C a = E::up(x[i]);
            m = a > m ? a : m;
        }
        m = block_reduce<C, true>(m);
        C s = 0;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) s += m_exp(E::up(x[i]) - m);
        s = block_reduce<C, false>(s);
        const C log_s = m_log(s);
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            C a = E::up(x[i]) - m;
            y[i] = E::down(log ? a - log_s : m_exp(a) / s);
        }
    }
}

// inner > 1: a thread per (outer, inner) column; neighbouring threads read neighbouring elements.
template <class E>
__device__ void softmax_columns(const typename E::T* in, typename E::T* out, long long outer, long long n,
                                long long inner, int log) {
    typedef typename E::C C;
    FOR_EACH(col, outer * inner) {
        const long long o = col / inner, i = col - o * inner, base = o * n * inner + i;
        C m = neg_inf((C)0);
        for (long long j = 0; j < n; ++j) {
            C a = E::up(in[base + j * inner]);
            m = a > m ? a : m;
        }
        C s = 0;
        for (long long j = 0; j < n; ++j) s += m_exp(E::up(in[base + j * inner]) - m);
        const C log_s = m_log(s);
        for (long long j = 0; j < n; ++j) {
            C a = E::up(in[base + j * inner]) - m;
            out[base + j * inner] = E::down(log ? a - log_s : m_exp(a) / s);
        }
    }
}

#define ROWS_KERNEL(NAME, E, VPT, VEC, WARP, BOUND)                                                       \
    extern "C" __global__ void __launch_bounds__(BOUND)                                                 \
    NAME(const E::T* in, E::T* out, long long rows, long long n, int log) {                             \
        softmax_rows<E, VPT, VEC, WARP>(in, out, rows, n, log);                                          \
    }

// Kernel names: softmax_w{VPT}_{s|v}_{dtype} (warp per row, scalar or vector access),
// softmax_b{VPT}_{s|v}_{dtype} (block per row), softmax_long_{dtype}, softmax_cols_{dtype}.
#define SOFTMAX_KERNELS(E, SUFFIX, VEC)                                                                 \
    ROWS_KERNEL(softmax_w1_s_##SUFFIX, E, 1, 1, true, 128)                                              \
    ROWS_KERNEL(softmax_w2_s_##SUFFIX, E, 2, 1, true, 128)                                              \
    ROWS_KERNEL(softmax_w4_s_##SUFFIX, E, 4, 1, true, 128)                                              \
    ROWS_KERNEL(softmax_w8_s_##SUFFIX, E, 8, 1, true, 128)                                              \
    ROWS_KERNEL(softmax_w16_s_##SUFFIX, E, 16, 1, true, 128)                                            \
    ROWS_KERNEL(softmax_w32_s_##SUFFIX, E, 32, 1, true, 128)                                            \
    ROWS_KERNEL(softmax_w4_v_##SUFFIX, E, 4, VEC, true, 128)                                            \
    ROWS_KERNEL(softmax_w8_v_##SUFFIX, E, 8, VEC, true, 128)                                            \
    ROWS_KERNEL(softmax_w16_v_##SUFFIX, E, 16, VEC, true, 128)                                          \
    ROWS_KERNEL(softmax_w32_v_##SUFFIX, E, 32, VEC, true, 128)                                          \
    ROWS_KERNEL(softmax_b8_s_##SUFFIX, E, 8, 1, false, 1024)                                            \
    ROWS_KERNEL(softmax_b16_s_##SUFFIX, E, 16, 1, false, 1024)                                          \
    ROWS_KERNEL(softmax_b8_v_##SUFFIX, E, 8, VEC, false, 1024)                                          \
    ROWS_KERNEL(softmax_b16_v_##SUFFIX, E, 16, VEC, false, 1024)                                        \
    extern "C" __global__ void __launch_bounds__(1024)                                                  \
    softmax_long_##SUFFIX(const E::T* in, E::T* out, long long rows, long long n, int log) {            \
        softmax_long_rows<E>(in, out, rows, n, log);                                                     \
    }                                                                                                    \
    extern "C" __global__ void softmax_cols_##SUFFIX(const E::T* in, E::T* out, long long outer,        \
                                                     long long n, long long inner, int log) {           \
        softmax_columns<E>(in, out, outer, n, inner, log);                                               \
    }

SOFTMAX_KERNELS(SF32, f32, 4)
SOFTMAX_KERNELS(SF64, f64, 2)
SOFTMAX_KERNELS(SBF16, bf16, 4)
SOFTMAX_KERNELS(SF16, f16, 4)

// The gradients of softmax and log_softmax over contiguous rows of n, one warp per row
// (grid-stride over rows): log == 0: dx = y * (g - sum(g * y)); else dx = g - exp(y) * sum(g).
// The sum is in the compute type, as PyTorch's kernels take it.
#define SOFTMAX_BACKWARD(SUFFIX, T, C, LOAD, STORE)                                              \
    extern "C" __global__ void softmax_backward_##SUFFIX(const T* g, const T* y, T* dx,          \
                                                         long long rows, long long n, int log) { \
        const int lane = threadIdx.x & 31;                                                       \
        const long long warps = (long long)gridDim.x * (blockDim.x >> 5);                        \
        for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) { \
            const T* gr = g + r * n;                                                             \
            const T* yr = y + r * n;                                                             \
            C acc = 0;                                                                           \
            for (long long j = lane; j < n; j += 32) acc += log ? LOAD(gr[j]) : LOAD(gr[j]) * LOAD(yr[j]); \
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);       \
            for (long long j = lane; j < n; j += 32) {                                           \
                const C gv = LOAD(gr[j]), yv = LOAD(yr[j]);                                      \
                dx[r * n + j] = STORE(log ? gv - m_exp(yv) * acc : yv * (gv - acc));             \
            }                                                                                    \
        }                                                                                        \
    }
SOFTMAX_BACKWARD(f32, float, float, (float), (float))
SOFTMAX_BACKWARD(f64, double, double, (double), (double))
SOFTMAX_BACKWARD(bf16, unsigned short, float, bf16_to_f32, f32_to_bf16)
SOFTMAX_BACKWARD(f16, unsigned short, float, f16_to_f32, f32_to_f16)

// ---- fused cross-entropy over rows of logits [rows, n] (cross_entropy.rs) ----------------------
// A block per row. Each thread folds its elements into an online (max, sum of exp) pair, the
// block merges the pairs; the row's elements are read with 16-byte loads between a scalar head
// (up to the first aligned address; n is rarely a multiple of 8, so rows start anywhere) and a
// scalar tail.

// Adds x to the pair (m, s) = (max so far, sum of exp(x_i - m)). -inf adds nothing, even to an
// empty pair (-inf - -inf is NaN); NaN makes s NaN.
template <typename C> __device__ __forceinline__ void lse_add(C& m, C& s, C x) {
    if (x > m) {
        s = s * m_exp(m - x) + (C)1;
        m = x;
    } else {
        const C d = x - m;
        s += (d != d && x == x) ? (C)0 : m_exp(d);
    }
}

template <typename C> __device__ __forceinline__ void lse_merge(C& m, C& s, C m2, C s2) {
    const C big = m2 > m ? m2 : m;
    if (big == neg_inf(big)) {
        s += s2;  // both empty
    } else {
        s = s * m_exp(m - big) + s2 * m_exp(m2 - big);
    }
    m = big;
}

// The block's merged pair, returned to every thread.
template <typename C> __device__ void block_lse(C& m, C& s) {
    __shared__ C pm[32], ps[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) {
        pm[w] = m;
        ps[w] = s;
    }
    __syncthreads();
    m = l < nw ? pm[l] : neg_inf(m);
    s = l < nw ? ps[l] : (C)0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
}

// Calls f(value, column) for this thread's share of the row x[0..n) (VEC-wide loads when
// `vec`): the scalar head up to a 16-byte boundary, the vector body, the scalar tail.
template <class E, class F> __device__ __forceinline__ void row_each(const typename E::T* x, long long n, int vec, F f) {
    typedef typename E::T T;
    const int V = 16 / sizeof(T);
    const long long head = vec ? min(n, (long long)(((16 - ((unsigned long long)x & 15)) & 15) / sizeof(T))) : n;
    for (long long j = threadIdx.x; j < head; j += blockDim.x) f(E::up(x[j]), j);
    if (!vec) return;
    const long long nv = (n - head) / V;
    const Pack<T, 16 / sizeof(T)>* body = (const Pack<T, 16 / sizeof(T)>*)(x + head);
    for (long long i = threadIdx.x; i < nv; i += blockDim.x) {
        const Pack<T, 16 / sizeof(T)> p = body[i];
#pragma unroll
        for (int e = 0; e < V; ++e) f(E::up(p.v[e]), head + i * V + e);
    }
    for (long long j = head + nv * V + threadIdx.x; j < n; j += blockDim.x) f(E::up(x[j]), j);
}

// loss[r] = lse - keep * x[t] - spread * sum(x) (0 for ignored rows, NaN for a target out of
// range); lse[r] = log(sum(exp(x))).
template <class E>
__device__ void ce_forward(const typename E::T* x, const long long* target, typename E::C* loss,
                           typename E::C* lse, long long rows, long long n, long long ld, long long ignore,
                           typename E::C keep, typename E::C spread) {
    typedef typename E::C C;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename E::T* xr = x + r * ld;
        C m = neg_inf((C)0), s = 0, sum = 0;
        row_each<E>(xr, n, 1, [&](C v, long long) {
            lse_add(m, s, v);
            sum += v;
        });
        block_lse(m, s);
        if (spread != (C)0) sum = block_reduce<C, false>(sum);
        if (threadIdx.x == 0) {
            const C l = m + m_log(s);
            const long long t = target[r];
            C out = 0;
            if (t != ignore) {
                out = (t < 0 || t >= n) ? m_log((C)-1) : l - keep * E::up(xr[t]) - spread * sum;
            }
            lse[r] = l;
            loss[r] = out;
        }
        __syncthreads();  // the shared pairs are reused by the next row
    }
}

// dx[r, j] = (exp(x - lse) - spread - keep [j == t]) * w[r], 0 on ignored rows; x's rows are ld
// apart, dx's out_ld apart. `vec`: each row of x sits at the 16-byte phase of dx's (the host
// checks).
template <class E>
__device__ void ce_backward(const typename E::T* x, const long long* target, const typename E::C* lse,
                            const typename E::C* w, typename E::T* dx, long long rows, long long n,
                            long long ld, long long out_ld, long long ignore, typename E::C keep,
                            typename E::C spread, int vec) {
    typedef typename E::C C;
    typedef typename E::T T;
    const int V = 16 / sizeof(T);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * ld;
        T* dr = dx + r * out_ld;
        const long long t = target[r];
        const bool skip = t == ignore;
        const C l = lse[r], wr = w[r];
        const long long head = vec ? min(n, (long long)(((16 - ((unsigned long long)xr & 15)) & 15) / sizeof(T))) : n;
        for (long long j = threadIdx.x; j < head; j += blockDim.x)
            dr[j] = E::down(skip ? (C)0 : (m_exp(E::up(xr[j]) - l) - spread - (j == t ? keep : (C)0)) * wr);
        if (!vec) continue;
        const long long nv = (n - head) / V;
        const Pack<T, 16 / sizeof(T)>* xb = (const Pack<T, 16 / sizeof(T)>*)(xr + head);
        Pack<T, 16 / sizeof(T)>* db = (Pack<T, 16 / sizeof(T)>*)(dr + head);
        for (long long i = threadIdx.x; i < nv; i += blockDim.x) {
            const Pack<T, 16 / sizeof(T)> p = xb[i];
            Pack<T, 16 / sizeof(T)> q;
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const long long j = head + i * V + e;
                q.v[e] = E::down(skip ? (C)0 : (m_exp(E::up(p.v[e]) - l) - spread - (j == t ? keep : (C)0)) * wr);
            }
            db[i] = q;
        }
        for (long long j = head + nv * V + threadIdx.x; j < n; j += blockDim.x)
            dr[j] = E::down(skip ? (C)0 : (m_exp(E::up(xr[j]) - l) - spread - (j == t ? keep : (C)0)) * wr);
    }
}

// Zeros in the pad columns [n, out_ld) of each gradient row (rows padded for alignment): a
// product over the whole padded rows then reads defined values.
template <class E>
__device__ void ce_zero_pads(typename E::T* dx, long long rows, long long n, long long out_ld) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x)
        for (long long j = n + threadIdx.x; j < out_ld; j += blockDim.x) dx[r * out_ld + j] = E::down(0);
}

#define CROSS_ENTROPY_KERNELS(E, SUFFIX)                                                                  \
    extern "C" __global__ void __launch_bounds__(1024)                                                  \
    cross_entropy_fwd_##SUFFIX(const E::T* x, const long long* target, E::C* loss, E::C* lse,           \
                               long long rows, long long n, long long ld, long long ignore, E::C keep,  \
                               E::C spread) {                                                          \
        ce_forward<E>(x, target, loss, lse, rows, n, ld, ignore, keep, spread);                         \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(1024)                                                  \
    cross_entropy_bwd_##SUFFIX(const E::T* x, const long long* target, const E::C* lse, const E::C* w,  \
                               E::T* dx, long long rows, long long n, long long ld, long long out_ld,   \
                               long long ignore, E::C keep, E::C spread, int vec) {                     \
        ce_backward<E>(x, target, lse, w, dx, rows, n, ld, out_ld, ignore, keep, spread, vec);          \
        ce_zero_pads<E>(dx, rows, n, out_ld);                                                             \
    }
CROSS_ENTROPY_KERNELS(SF32, f32)
CROSS_ENTROPY_KERNELS(SF64, f64)
CROSS_ENTROPY_KERNELS(SBF16, bf16)
CROSS_ENTROPY_KERNELS(SF16, f16)
