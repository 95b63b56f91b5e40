// Normalisation kernels. Statistics are two-pass (mean, then mean of squared deviations) and
// accumulate in f64 like the CPU backend, so a large mean does not swamp a small variance.
// (Channels-last batch norm, the fast path of convolution networks, is in channels_last.cu.)
// Outputs compute in the dtype's compute type (f32 for f16/bf16) and round once; products and
// sums go through the _rn intrinsics so no FMA contraction changes the CPU's rounding.

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// The sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread. `sh` holds 33 doubles; every thread of the block must call this.
__device__ double norm_block_sum(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // an earlier call may still be reading sh[32]
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
        v = lane < warps ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

// Partial per-channel sums of x (mean == null) or of (x - mean[c])^2, over the `count` elements
// of channel blockIdx.x = c, chunk blockIdx.y of `chunk` elements. Element j of a channel is
// (o, s) = (j / spatial, j % spatial) of the [outer, channels, spatial] view.
#define MOMENTS(SUFFIX, T, LOAD)                                                                 \
    extern "C" __global__ void moments_partial_##SUFFIX(Strided sx, const T* x, const double* mean, \
                                                        double* partial, i64 channels,           \
                                                        i64 spatial, i64 count, i64 chunk) {     \
        __shared__ double sh[33];                                                                \
        const i64 c = blockIdx.x, b = blockIdx.y;                                                \
        const i64 begin = b * chunk;                                                             \
        const i64 end = begin + chunk < count ? begin + chunk : count;                           \
        const double m = mean ? mean[c] : 0.0;                                                   \
        double acc = 0.0;                                                                        \
        for (i64 j = begin + threadIdx.x; j < end; j += blockDim.x) {                            \
            const i64 o = fast_div(j, spatial), s = j - o * spatial;                                      \
            const double v = (double)LOAD(x[strided_offset(sx, (o * channels + c) * spatial + s)]); \
            acc += mean ? (v - m) * (v - m) : v;                                                 \
        }                                                                                        \
        const double total = norm_block_sum(acc, sh);                                            \
        if (threadIdx.x == 0) partial[c * gridDim.y + b] = total;                                \
    }
#define ID(x) (x)
MOMENTS(f32, float, ID)
MOMENTS(f64, double, ID)
MOMENTS(bf16, bf16_t, bf16_to_f32)
MOMENTS(f16, f16_t, f16_to_f32)

// out[c] = (sum of the `splits` partials of channel c) / count; one block per channel, in a
// fixed order so the result does not depend on timing.
extern "C" __global__ void moments_finish(const double* partial, i64 splits, double count, double* out) {
    __shared__ double sh[33];
    const i64 c = blockIdx.x;
    double acc = 0.0;
    for (i64 b = threadIdx.x; b < splits; b += blockDim.x) acc += partial[c * splits + b];
    const double total = norm_block_sum(acc, sh);
    if (threadIdx.x == 0) out[c] = total / count;
}

// Per-channel scale weight / sqrt(var + eps) and shift bias, in f64 (weight, bias may be null).
extern "C" __global__ void bn_prepare(i64 channels, const double* var, const double* weight,
                                      const double* bias, double eps, double* scale, double* shift) {
    FOR_EACH(c, channels) {
        scale[c] = (weight ? weight[c] : 1.0) / sqrt(var[c] + eps);
        shift[c] = bias ? bias[c] : 0.0;
    }
}

// out[i] = (x - mean[c]) * scale[c] + shift[c], the difference taken in f64 before rounding to
// the compute type (as the CPU does), c = (i / spatial) % channels. relu != 0 applies ReLU
// too (batch norm followed by ReLU in one pass; NaN passes, as in relu).
template <typename C> __device__ __forceinline__ C bn_relu(C y, int relu) { return relu && y < (C)0 ? (C)0 : y; }
#define BN_AFFINE(SUFFIX, T, C, LOAD, STORE)                                                     \
    extern "C" __global__ void bn_affine_##SUFFIX(Strided sx, const T* x, T* out, i64 n,          \
                                                  i64 channels, i64 spatial, const double* mean, \
                                                  const double* scale, const double* shift,      \
                                                  int relu) {                                    \
        FOR_EACH(i, n) {                                                                         \
            const i64 c = fast_mod(fast_div(i, spatial), channels);                                \
            const C centered = (C)((double)LOAD(x[strided_offset(sx, i)]) - mean[c]);            \
            out[i] = STORE(bn_relu<C>(add_rn(mul_rn(centered, (C)scale[c]), (C)shift[c]), relu)); \
        }                                                                                        \
    }
BN_AFFINE(f32, float, float, ID, ID)
BN_AFFINE(f64, double, double, ID, ID)
BN_AFFINE(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
BN_AFFINE(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Batch norm's backward, pass 1: partial per-channel sums of dy and of dy * (x - mean[c]) over
// chunk blockIdx.y of channel blockIdx.x, both in f64 (element j as in moments_partial).
#define BN_GRAD_SUMS(SUFFIX, T, LOAD)                                                            \
    extern "C" __global__ void bn_grad_partial_##SUFFIX(                                         \
        Strided sdy, const T* dy, Strided sx, const T* x, const double* mean, double* partial_dy, \
        double* partial_dyx, i64 channels, i64 spatial, i64 count, i64 chunk) {                  \
        __shared__ double sh[33];                                                                \
        const i64 c = blockIdx.x, b = blockIdx.y;                                                \
        const i64 begin = b * chunk;                                                             \
        const i64 end = begin + chunk < count ? begin + chunk : count;                           \
        const double m = mean[c];                                                                \
        double acc = 0.0, acc_x = 0.0;                                                           \
        for (i64 j = begin + threadIdx.x; j < end; j += blockDim.x) {                            \
            const i64 o = fast_div(j, spatial), s = j - o * spatial, at = (o * channels + c) * spatial + s; \
            const double g = (double)LOAD(dy[strided_offset(sdy, at)]);                          \
            acc += g;                                                                            \
            acc_x += g * ((double)LOAD(x[strided_offset(sx, at)]) - m);                          \
        }                                                                                        \
        const double total = norm_block_sum(acc, sh);                                            \
        const double total_x = norm_block_sum(acc_x, sh);                                        \
        if (threadIdx.x == 0) {                                                                  \
            partial_dy[c * gridDim.y + b] = total;                                               \
            partial_dyx[c * gridDim.y + b] = total_x;                                            \
        }                                                                                        \
    }
BN_GRAD_SUMS(f32, float, ID)
BN_GRAD_SUMS(f64, double, ID)
BN_GRAD_SUMS(bf16, bf16_t, bf16_to_f32)
BN_GRAD_SUMS(f16, f16_t, f16_to_f32)

// Pass 2's per-channel factors in f64, as the CPU's batch_norm_backward makes them:
// rstd = 1/sqrt(var + eps), scale = weight * rstd, shift = sum_dy / count,
// k = sum_dyx / count * rstd^2, and dweight = sum_dyx * rstd (weight may be null).
extern "C" __global__ void bn_grad_prepare(i64 channels, const double* var, const double* weight,
                                           double eps, double count, const double* sum_dy,
                                           const double* sum_dyx, double* scale, double* shift,
                                           double* k, double* dweight) {
    FOR_EACH(c, channels) {
        const double rstd = 1.0 / sqrt(var[c] + eps);
        scale[c] = (weight ? weight[c] : 1.0) * rstd;
        shift[c] = sum_dy[c] / count;
        k[c] = sum_dyx[c] / count * rstd * rstd;
        dweight[c] = sum_dyx[c] * rstd;
    }
}

// Pass 2: dx = scale[c] * (dy - shift[c] - (x - mean[c]) * k[c]) in the compute type, no FMA
// (the CPU's rounding); dx is contiguous, c = (i / spatial) % channels.
#define BN_INPUT_GRAD(SUFFIX, T, C, LOAD, STORE)                                                 \
    extern "C" __global__ void bn_input_grad_##SUFFIX(                                           \
        Strided sdy, const T* dy, Strided sx, const T* x, T* out, i64 n, i64 channels,           \
        i64 spatial, const double* mean, const double* scale, const double* shift,               \
        const double* k) {                                                                       \
        FOR_EACH(i, n) {                                                                         \
            const i64 c = fast_mod(fast_div(i, spatial), channels);                                \
            const C g = LOAD(dy[strided_offset(sdy, i)]), v = LOAD(x[strided_offset(sx, i)]);    \
            const C centered = add_rn(v, -(C)mean[c]);                                           \
            const C inner = add_rn(add_rn(g, -(C)shift[c]), -mul_rn(centered, (C)k[c]));         \
            out[i] = STORE(mul_rn((C)scale[c], inner));                                          \
        }                                                                                        \
    }
BN_INPUT_GRAD(f32, float, float, ID, ID)
BN_INPUT_GRAD(f64, double, double, ID, ID)
BN_INPUT_GRAD(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
BN_INPUT_GRAD(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Layer norm over contiguous rows of `row_len`: one block per row (grid-stride over rows).
// out = (x - mean) * rstd * weight + bias; weight and bias (f64, may be null) have row_len
// elements; mean and rstd of each row are written in f64.
#define LAYER_NORM(SUFFIX, T, C, LOAD, STORE)                                                    \
    extern "C" __global__ void layer_norm_##SUFFIX(const T* x, T* out, i64 rows, i64 row_len,     \
                                                   const double* weight, const double* bias,     \
                                                   double eps, double* mean_out,                 \
                                                   double* rstd_out) {                           \
        __shared__ double sh[33];                                                                \
        const double n = (double)row_len;                                                        \
        for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {                               \
            const T* src = x + row * row_len;                                                    \
            T* dst = out + row * row_len;                                                        \
            double acc = 0.0;                                                                    \
            for (i64 j = threadIdx.x; j < row_len; j += blockDim.x) acc += (double)LOAD(src[j]); \
            const double mu = norm_block_sum(acc, sh) / n;                                       \
            acc = 0.0;                                                                           \
            for (i64 j = threadIdx.x; j < row_len; j += blockDim.x) {                            \
                const double d = (double)LOAD(src[j]) - mu;                                      \
                acc += d * d;                                                                    \
            }                                                                                    \
            const double var = norm_block_sum(acc, sh) / n;                                      \
            const double rs = 1.0 / sqrt(var + eps);                                             \
            if (threadIdx.x == 0) {                                                              \
                mean_out[row] = mu;                                                              \
                rstd_out[row] = rs;                                                              \
            }                                                                                    \
            const C rsc = (C)rs;                                                                 \
            for (i64 j = threadIdx.x; j < row_len; j += blockDim.x) {                            \
                C y = mul_rn((C)((double)LOAD(src[j]) - mu), rsc);                               \
                if (weight) y = mul_rn(y, (C)weight[j]);                                         \
                if (bias) y = add_rn(y, (C)bias[j]);                                             \
                dst[j] = STORE(y);                                                               \
            }                                                                                    \
        }                                                                                        \
    }
LAYER_NORM(f32, float, float, ID, ID)
LAYER_NORM(f64, double, double, ID, ID)
LAYER_NORM(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
LAYER_NORM(f16, f16_t, float, f16_to_f32, f32_to_f16)

// Column sums over packed [rows, C] (layer norm's parameter gradients) run in blocks of
// (32, CL_ROWS) threads: threadIdx.x picks column blockIdx.x * 32 + threadIdx.x, so a warp
// reads 32 neighbouring columns of one row (coalesced), and threadIdx.y walks the rows of
// split blockIdx.y. Each block writes one partial per column, at
// partial[c * gridDim.y + blockIdx.y], which a finishing kernel sums in a fixed order.
// (Channels-last batch norm has its own kernels, in channels_last.cu.)
#define CL_ROWS 8
__device__ __forceinline__ double cl_block_rows_sum(double v, double (*sh)[32]) {
    sh[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.y == 0)
        for (int k = 0; k < CL_ROWS; ++k) t += sh[k][threadIdx.x];
    __syncthreads();
    return t;
}

// Layer norm's backward over contiguous rows of `len`, one warp per row (grid-stride over
// rows): the sums of gy = dy * weight and of gy * x_hat in f64, then
// dx = rstd * (gy - mean(gy) - x_hat * mean(gy * x_hat)) in f64, rounded once (as the CPU's
// layer_backward.rs). mean, rstd are per row, weight (may be null) per column, all f64.
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}
#define LAYER_NORM_BACKWARD(SUFFIX, T, LOAD, STORE)                                              \
    extern "C" __global__ void layer_norm_input_grad_##SUFFIX(                                   \
        const T* dy, const T* x, const double* mean, const double* rstd, const double* weight,   \
        T* dx, i64 rows, i64 len) {                                                              \
        const int lane = threadIdx.x & 31;                                                       \
        const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);                                    \
        for (i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) { \
            const T* g = dy + r * len;                                                           \
            const T* v = x + r * len;                                                            \
            const double m = mean[r], rs = rstd[r];                                              \
            double s = 0.0, sx = 0.0;                                                            \
            for (i64 j = lane; j < len; j += 32) {                                               \
                const double gy = (double)LOAD(g[j]) * (weight ? weight[j] : 1.0);               \
                s += gy;                                                                         \
                sx += gy * ((double)LOAD(v[j]) - m) * rs;                                        \
            }                                                                                    \
            const double mean_gy = warp_sum(s) / (double)len, mean_gyx = warp_sum(sx) / (double)len; \
            for (i64 j = lane; j < len; j += 32) {                                               \
                const double xhat = ((double)LOAD(v[j]) - m) * rs;                               \
                const double gy = (double)LOAD(g[j]) * (weight ? weight[j] : 1.0);               \
                dx[r * len + j] = STORE(rs * (gy - mean_gy - xhat * mean_gyx));                  \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* Column sums of dy * x_hat and dy over the rows of split blockIdx.y, blocks as in     */   \
    /* the channels-last reductions (a warp reads 32 neighbouring columns of one row).      */   \
    extern "C" __global__ void layer_norm_param_partial_##SUFFIX(                                \
        const T* dy, const T* x, const double* mean, const double* rstd, double* partial_w,      \
        double* partial_b, i64 len, i64 rows, i64 chunk) {                                       \
        __shared__ double sh[CL_ROWS][32];                                                       \
        const i64 c = (i64)blockIdx.x * 32 + threadIdx.x;                                        \
        const i64 begin = (i64)blockIdx.y * chunk;                                               \
        const i64 end = begin + chunk < rows ? begin + chunk : rows;                             \
        double acc_w = 0.0, acc_b = 0.0;                                                         \
        if (c < len) {                                                                           \
            for (i64 r = begin + threadIdx.y; r < end; r += CL_ROWS) {                           \
                const double g = (double)LOAD(dy[r * len + c]);                                  \
                acc_w += g * ((double)LOAD(x[r * len + c]) - mean[r]) * rstd[r];                 \
                acc_b += g;                                                                      \
            }                                                                                    \
        }                                                                                        \
        const double tw = cl_block_rows_sum(acc_w, sh);                                          \
        const double tb = cl_block_rows_sum(acc_b, sh);                                          \
        if (threadIdx.y == 0 && c < len) {                                                       \
            partial_w[c * gridDim.y + blockIdx.y] = tw;                                          \
            partial_b[c * gridDim.y + blockIdx.y] = tb;                                          \
        }                                                                                        \
    }
LAYER_NORM_BACKWARD(f32, float, ID, (float))
LAYER_NORM_BACKWARD(f64, double, ID, ID)
LAYER_NORM_BACKWARD(bf16, bf16_t, bf16_to_f32, f32_to_bf16)
LAYER_NORM_BACKWARD(f16, f16_t, f16_to_f32, f32_to_f16)

// The statistics of channels_last.cu's bn_stats_cl: the partial sums of d = x - K and d^2
// per channel (K the channel's value in row 0) summed in a fixed order, one block per channel,
// then mean = K + E[d] and var = E[d^2] - E[d]^2.
#define MOMENTS_SHIFTED_FINISH(SUFFIX, T, LOAD)                                                  \
    extern "C" __global__ void moments_shifted_finish_##SUFFIX(                                  \
        const T* x, const double* partial_1, const double* partial_2, i64 splits, double count, \
        double* mean, double* var) {                                                             \
        __shared__ double sh[33];                                                                \
        const i64 c = blockIdx.x;                                                                \
        double a1 = 0.0, a2 = 0.0;                                                               \
        for (i64 b = threadIdx.x; b < splits; b += blockDim.x) {                                 \
            a1 += partial_1[c * splits + b];                                                     \
            a2 += partial_2[c * splits + b];                                                     \
        }                                                                                        \
        const double s1 = norm_block_sum(a1, sh), s2 = norm_block_sum(a2, sh);                   \
        if (threadIdx.x == 0) {                                                                  \
            const double m1 = s1 / count, v = s2 / count - m1 * m1;                              \
            mean[c] = (double)LOAD(x[c]) + m1;                                                   \
            var[c] = v > 0.0 ? v : 0.0;                                                          \
        }                                                                                        \
    }
MOMENTS_SHIFTED_FINISH(f32, float, ID)
MOMENTS_SHIFTED_FINISH(f64, double, ID)
MOMENTS_SHIFTED_FINISH(bf16, bf16_t, bf16_to_f32)
MOMENTS_SHIFTED_FINISH(f16, f16_t, f16_to_f32)
