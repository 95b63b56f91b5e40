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
            C y = m[j].centered(D::load(p.v[j])) * s[j] + b[j];
            if (res) y += D::load(add.v[j]);
            o.v[j] = D::store(relu && y < (C)0 ? (C)0 : y);
        }
        ((P*)out)[r * nvr + slot] = o;
    }
}

// Backward pass 1: per channel the sums of dy and dy * (x - mean).
template <class D, int V>
__device__ void grad_sums_tile(const typename D::T* dy, const typename D::T* x, const double* mean,
                               double* partial_dy, double* partial_dyx, i64 rows, int nvr, int channels) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
    __shared__ C sh[TILE_THREADS * V];
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    C a[V], ax[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = ax[j] = (C)0;
    if (slot < nvr) {
        Centre<C> m[V];
#pragma unroll
        for (int j = 0; j < V; ++j) m[j].set(mean[slot * V + j]);
        TILE_LOOP(r, rows) {
            const P g = ((const P*)dy)[r * nvr + slot], v = ((const P*)x)[r * nvr + slot];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const C gj = D::load(g.v[j]);
                a[j] += gj;
                ax[j] += gj * m[j].centered(D::load(v.v[j]));
            }
        }
    }
    tile_partials<C, V>(a, sh, partial_dy, channels);
    tile_partials<C, V>(ax, sh, partial_dyx, channels);
}

// Backward pass 2: dx = scale * (dy - shift - (x - mean) * k), the factors of bn_grad_prepare.
template <class D, int V>
__device__ void input_grad_tile(const typename D::T* dy, const typename D::T* x, typename D::T* out, i64 rows,
                                int nvr, const double* mean, const double* scale, const double* shift,
                                const double* k) {
    typedef typename D::C C;
    typedef Pack<typename D::T, V> P;
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
        const P g = ((const P*)dy)[r * nvr + slot], v = ((const P*)x)[r * nvr + slot];
        P o;
#pragma unroll
        for (int j = 0; j < V; ++j)
            o.v[j] = D::store(s[j] * ((D::load(g.v[j]) - z[j]) - m[j].centered(D::load(v.v[j])) * kk[j]));
        ((P*)out)[r * nvr + slot] = o;
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
        grad_sums_tile<D, V>(dy, x, mean, pd, pdx, rows, nvr, channels);                                   \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) bn_input_grad_cl_##SUFFIX##_v##V(           \
        const D::T* dy, const D::T* x, D::T* out, i64 rows, int nvr, const double* mean,                   \
        const double* scale, const double* shift, const double* k) {                                       \
        input_grad_tile<D, V>(dy, x, out, rows, nvr, mean, scale, shift, k);                               \
    }
BN_CL_TILES(f32, F32, 1)
BN_CL_TILES(f32, F32, 4)
BN_CL_TILES(f64, F64, 1)
BN_CL_TILES(f64, F64, 2)
BN_CL_TILES(bf16, BF16, 1)
BN_CL_TILES(bf16, BF16, 8)
BN_CL_TILES(f16, F16, 1)
BN_CL_TILES(f16, F16, 8)
