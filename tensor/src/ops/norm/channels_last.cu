// Channels-last batch norm: the activation lies packed as [rows, C] with the channel innermost
// (an NHWC tensor, or a contiguous [N, C]) and is read as vectors of V channels (16 bytes when
// C and the alignment allow, else V = 1). A thread owns one vector slot of a row,
// slot = blockIdx.x * blockDim.x + threadIdx.x, for the whole kernel and walks the rows
// r = blockIdx.y * blockDim.y + threadIdx.y, stepping gridDim.y * blockDim.y. So the per-channel
// factors of its V channels sit in registers (loaded once, not once per element), no index
// is divided, and a warp reads neighbouring slots of neighbouring rows: whole 16-byte vectors,
// coalesced.
//
// Precision: each thread accumulates its rows in the compute type (f32 for f32/bf16/f16, f64
// for f64), a few hundred terms at most; blocks then sum in f64 and write one partial per
// channel and split, at partial[c * gridDim.y + blockIdx.y], which norm.cu's finishing kernels
// add in a fixed order (the result does not depend on timing). The mean enters the compute
// type as two parts (hi + lo), so x - mean loses nothing to the mean's rounding.

#define MAX_V 8
#define TILE_THREADS 256

struct F32 {
    typedef float T;
    typedef float C;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float x) { return x; }
};
struct F64 {
    typedef double T;
    typedef double C;
    static __device__ __forceinline__ double load(double x) { return x; }
    static __device__ __forceinline__ double store(double x) { return x; }
};
struct BF16 {
    typedef bf16_t T;
    typedef float C;
    static __device__ __forceinline__ float load(bf16_t x) { return bf16_to_f32(x); }
    static __device__ __forceinline__ bf16_t store(float x) { return f32_to_bf16(x); }
};
struct F16 {
    typedef f16_t T;
    typedef float C;
    static __device__ __forceinline__ float load(f16_t x) { return f16_to_f32(x); }
    static __device__ __forceinline__ f16_t store(float x) { return f32_to_f16(x); }
};

// V elements loaded and stored as one access.
template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

// The mean of a channel as hi + lo in the compute type; centered() is x - mean in it.
template <typename C> struct Centre {
    C hi, lo;
    __device__ __forceinline__ void set(double m) { hi = (C)m; lo = (C)(m - (double)hi); }
    __device__ __forceinline__ C centered(C x) const { return (x - hi) - lo; }
};

// a * b + c rounded once: the forward's output and the backward's recomputed ReLU input both
// use it, so the two agree bit for bit (an implicit contraction might differ between them).
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

// How the backward kernels mask dy with the ReLU that followed batch norm (the kernels' MASK):
// not at all (MASK_NONE), by the ReLU's output relu_out, packed like x (MASK_OUTPUT), or by
// recomputing it from x with the forward's factors mean, scale and shift (MASK_RECOMPUTE).
#define MASK_NONE 0
#define MASK_OUTPUT 1
#define MASK_RECOMPUTE 2
// With MASK_OUTPUT, addend (when set, packed like x) is a second part of dy: pass 1 reads
// dy + addend, rounded to the storage type as `add` rounds it (the sum of the two gradients
// of a ResNet block's input, read where it would otherwise be added up first).
template <class D> struct ReluMaskArgs {
    const typename D::T* relu_out;
    const double *mean, *scale, *shift;
    const typename D::T* addend;
};

// Where the ReLU after batch norm passed the gradient, recomputed from batch norm's input x
// with the forward's own factors of one channel: y = fma(x - mean, scale, shift) exactly as
// affine_tile computes it, and the ReLU's stored output is > 0 exactly where y rounded to the
// storage type is (NaN: no), which is threshold_backward's mask on that output.
template <class D> struct alignas(4 * sizeof(typename D::C)) ReluRecompute {
    typedef typename D::C C;
    C hi, lo, s, b;
    __device__ __forceinline__ void set(const ReluMaskArgs<D>& f, int c) {
        Centre<C> m;
        m.set(f.mean[c]);
        hi = m.hi;
        lo = m.lo;
        s = (C)f.scale[c];
        b = (C)f.shift[c];
    }
    __device__ __forceinline__ bool passes(C x) const {
        return D::load(D::store(fma_rn((x - hi) - lo, s, b))) > (C)0;
    }
};

// The forward's factors of the block's channels, table[j][threadIdx.x] for channel
// slot * V + j, in shared memory: registers already hold the backward's own factors, and a
// thread holding both would halve the threads an SM keeps in flight. Every thread calls this.
// The loops reading the table start each row with RELOAD_TABLE, which stops the compiler
// from hoisting the (loop-invariant) reads back into registers.
#define RELOAD_TABLE() \
    if (MASK == MASK_RECOMPUTE) asm volatile("" ::: "memory")
template <class D, int V>
__device__ __forceinline__ void load_relu_table(ReluRecompute<D> (*table)[32], const ReluMaskArgs<D>& mask,
                                                int nvr) {
    const int threads = blockDim.x * blockDim.y;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < V * (int)blockDim.x; i += threads) {
        const int j = i / blockDim.x, tx = i - j * blockDim.x;
        const int slot = blockIdx.x * blockDim.x + tx;
        if (slot < nvr) table[j][tx].set(mask, slot * V + j);
    }
    __syncthreads();
}

// Sums the V values of every thread over threadIdx.y into f64 and writes each channel's
// partial; every thread of the block calls it (it synchronises). sh holds TILE_THREADS * V.
template <typename C, int V>
__device__ __forceinline__ void tile_partials(const C (&acc)[V], C* sh, double* partial, int channels) {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    __syncthreads();  // an earlier call may still be reading sh
#pragma unroll
    for (int j = 0; j < V; ++j) sh[tid * V + j] = acc[j];
    __syncthreads();
    const int cols = blockDim.x * V;  // the block's channels, slot-major
    for (int col = tid; col < cols; col += blockDim.x * blockDim.y) {
        double total = 0.0;
        for (int y = 0; y < (int)blockDim.y; ++y) total += (double)sh[y * cols + col];
        const i64 c = (i64)blockIdx.x * cols + col;
        if (c < channels) partial[c * gridDim.y + blockIdx.y] = total;
    }
}

#define TILE_LOOP(r, rows) \
    for (i64 r = (i64)blockIdx.y * blockDim.y + threadIdx.y; r < (rows); r += (i64)gridDim.y * blockDim.y)

// Statistics in one pass: per channel the sums of d = x - K and d^2, K being the channel's
// value in row 0 (within a few deviations of the mean, so var = E[d^2] - E[d]^2 loses nothing
// that the results could show); moments_shifted_finish turns the partials into mean and var.
template <class D, int V>
__device__ void stats_tile(const typename D::T* x, double* partial_1, double* partial_2, i64 rows, int nvr,
                           int channels) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
    __shared__ C sh[TILE_THREADS * V];
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    C a1[V], a2[V], k[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a1[j] = a2[j] = k[j] = (C)0;
    if (slot < nvr) {
        const P k0 = ((const P*)x)[slot];
#pragma unroll
        for (int j = 0; j < V; ++j) k[j] = D::load(k0.v[j]);
        TILE_LOOP(r, rows) {
            const P p = ((const P*)x)[r * nvr + slot];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const C d = D::load(p.v[j]) - k[j];
                a1[j] += d;
                a2[j] += d * d;
            }
        }
    }
    tile_partials<C, V>(a1, sh, partial_1, channels);
    tile_partials<C, V>(a2, sh, partial_2, channels);
}

// out = (x - mean) * scale + shift per channel, plus res (packed like x, may be null), then
// ReLU when relu != 0 (NaN passes).
template <class D, int V>
__device__ void affine_tile(const typename D::T* x, const typename D::T* res, typename D::T* out, i64 rows,
                            int nvr, const double* mean, const double* scale, const double* shift, int relu) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= nvr) return;
    Centre<C> m[V];
    C s[V], b[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int c = slot * V + j;
        m[j].set(mean[c]);
        s[j] = (C)scale[c];
        b[j] = (C)shift[c];
    }
    TILE_LOOP(r, rows) {
        const P p = ((const P*)x)[r * nvr + slot];
        P add;
        if (res) add = ((const P*)res)[r * nvr + slot];
        P o;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            C y = fma_rn(m[j].centered(D::load(p.v[j])), s[j], b[j]);
            if (res) y += D::load(add.v[j]);
            o.v[j] = D::store(relu && y < (C)0 ? (C)0 : y);
        }
        ((P*)out)[r * nvr + slot] = o;
    }
}

// dy of channel slot * V + j, masked as `mask` says (threshold_backward's value: the compute
// type's 0 where the ReLU did not pass); with MASK_OUTPUT and an addend, dy + addend.
#define MASKED_GRAD(gj, g, g2, y, v, j)                                                           \
    C gj = D::load(g.v[j]);                                                                       \
    if (MASK == MASK_OUTPUT && mask.addend) gj = D::load(D::store(gj + D::load(g2.v[j])));        \
    if ((MASK == MASK_OUTPUT && !(D::load(y.v[j]) > (C)0)) ||                                     \
        (MASK == MASK_RECOMPUTE && !table[j][threadIdx.x].passes(D::load(v.v[j]))))               \
        gj = (C)0;

// Backward pass 1: per channel the sums of dy and dy * (x - mean), dy masked by the ReLU that
// followed batch norm as MASK says; with MASK_OUTPUT the masked dy is written to `masked` too
// (the residual's gradient of a ResNet block, and pass 2's dy).
template <class D, int V, int MASK>
__device__ void grad_sums_tile(const typename D::T* dy, const typename D::T* x, const double* mean,
                               ReluMaskArgs<D> mask, typename D::T* masked, double* partial_dy,
                               double* partial_dyx, i64 rows, int nvr, int channels) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
    __shared__ C sh[TILE_THREADS * V];
    __shared__ ReluRecompute<D> table[MASK == MASK_RECOMPUTE ? V : 1][32];
    if (MASK == MASK_RECOMPUTE) load_relu_table<D, V>(table, mask, nvr);
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    C a[V], ax[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = ax[j] = (C)0;
    if (slot < nvr) {
        Centre<C> m[V];
#pragma unroll
        for (int j = 0; j < V; ++j) m[j].set(mean[slot * V + j]);
        TILE_LOOP(r, rows) {
            RELOAD_TABLE();
            const i64 at = r * nvr + slot;
            const P g = ((const P*)dy)[at], v = ((const P*)x)[at];
            P y, g2, kept;
            if (MASK == MASK_OUTPUT) y = ((const P*)mask.relu_out)[at];
            if (MASK == MASK_OUTPUT && mask.addend) g2 = ((const P*)mask.addend)[at];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                MASKED_GRAD(gj, g, g2, y, v, j)
                kept.v[j] = D::store(gj);
                a[j] += gj;
                ax[j] += gj * m[j].centered(D::load(v.v[j]));
            }
            if (MASK == MASK_OUTPUT) ((P*)masked)[at] = kept;
        }
    }
    tile_partials<C, V>(a, sh, partial_dy, channels);
    tile_partials<C, V>(ax, sh, partial_dyx, channels);
}

// Backward pass 2: dx = scale * (dy - shift - (x - mean) * k), the factors of bn_grad_prepare,
// dy masked as MASK says: MASK_NONE or MASK_RECOMPUTE (after a MASK_OUTPUT pass 1 this pass
// reads the masked dy that pass 1 wrote, unmasked).
template <class D, int V, int MASK>
__device__ void input_grad_tile(const typename D::T* dy, const typename D::T* x, ReluMaskArgs<D> mask,
                                typename D::T* out, i64 rows, int nvr, const double* mean,
                                const double* scale, const double* shift, const double* k) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
    __shared__ ReluRecompute<D> table[MASK == MASK_RECOMPUTE ? V : 1][32];
    if (MASK == MASK_RECOMPUTE) load_relu_table<D, V>(table, mask, nvr);
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= nvr) return;
    Centre<C> m[V];
    C s[V], z[V], kk[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int c = slot * V + j;
        m[j].set(mean[c]);
        s[j] = (C)scale[c];
        z[j] = (C)shift[c];
        kk[j] = (C)k[c];
    }
    TILE_LOOP(r, rows) {
        RELOAD_TABLE();
        const i64 at = r * nvr + slot;
        const P g = ((const P*)dy)[at], v = ((const P*)x)[at];
        P o;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            MASKED_GRAD(gj, g, g, g, v, j)  // no addend or ReLU output with these masks
            o.v[j] = D::store(s[j] * ((gj - z[j]) - m[j].centered(D::load(v.v[j])) * kk[j]));
        }
        ((P*)out)[at] = o;
    }
}

// One extern "C" entry per (dtype, V): V = 1 and the 16-byte width.
#define BN_CL_TILES(SUFFIX, D, V)                                                                          \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_stats_cl_##SUFFIX##_v##V(                \
        const D::T* x, double* p1, double* p2, i64 rows, int nvr, int channels) {                          \
        stats_tile<D, V>(x, p1, p2, rows, nvr, channels);                                                  \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_affine_cl_##SUFFIX##_v##V(               \
        const D::T* x, const D::T* res, D::T* out, i64 rows, int nvr, const double* mean,                  \
        const double* scale, const double* shift, int relu) {                                              \
        affine_tile<D, V>(x, res, out, rows, nvr, mean, scale, shift, relu);                               \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_grad_sums_cl_##SUFFIX##_v##V(            \
        const D::T* dy, const D::T* x, const double* mean, double* pd, double* pdx, i64 rows, int nvr,     \
        int channels) {                                                                                    \
        const ReluMaskArgs<D> none = {0, 0, 0, 0, 0};                                                         \
        grad_sums_tile<D, V, MASK_NONE>(dy, x, mean, none, 0, pd, pdx, rows, nvr, channels);               \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4) bn_grad_sums_masked_cl_##SUFFIX##_v##V(     \
        const D::T* dy, const D::T* addend, const D::T* x, const double* mean, const D::T* relu_out,       \
        D::T* masked, double* pd, double* pdx, i64 rows, int nvr, int channels) {                          \
        const ReluMaskArgs<D> mask = {relu_out, 0, 0, 0, addend};                                          \
        grad_sums_tile<D, V, MASK_OUTPUT>(dy, x, mean, mask, masked, pd, pdx, rows, nvr, channels);        \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_grad_sums_recomputed_cl_##SUFFIX##_v##V( \
        const D::T* dy, const D::T* x, const double* mean, const double* f_mean, const double* f_scale,    \
        const double* f_shift, double* pd, double* pdx, i64 rows, int nvr, int channels) {                 \
        const ReluMaskArgs<D> mask = {0, f_mean, f_scale, f_shift, 0};                                        \
        grad_sums_tile<D, V, MASK_RECOMPUTE>(dy, x, mean, mask, 0, pd, pdx, rows, nvr, channels);          \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_input_grad_cl_##SUFFIX##_v##V(           \
        const D::T* dy, const D::T* x, D::T* out, i64 rows, int nvr, const double* mean,                   \
        const double* scale, const double* shift, const double* k) {                                       \
        const ReluMaskArgs<D> none = {0, 0, 0, 0, 0};                                                         \
        input_grad_tile<D, V, MASK_NONE>(dy, x, none, out, rows, nvr, mean, scale, shift, k);              \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS, 4) bn_input_grad_recomputed_cl_##SUFFIX##_v##V( \
        const D::T* dy, const D::T* x, const double* f_mean, const double* f_scale, const double* f_shift, \
        D::T* out, i64 rows, int nvr, const double* mean, const double* scale, const double* shift,        \
        const double* k) {                                                                                 \
        const ReluMaskArgs<D> mask = {0, f_mean, f_scale, f_shift, 0};                                        \
        input_grad_tile<D, V, MASK_RECOMPUTE>(dy, x, mask, out, rows, nvr, mean, scale, shift, k);         \
    }
BN_CL_TILES(f32, F32, 1)
BN_CL_TILES(f32, F32, 4)
BN_CL_TILES(f64, F64, 1)
BN_CL_TILES(f64, F64, 2)
BN_CL_TILES(bf16, BF16, 1)
BN_CL_TILES(bf16, BF16, 8)
BN_CL_TILES(f16, F16, 1)
BN_CL_TILES(f16, F16, 8)
