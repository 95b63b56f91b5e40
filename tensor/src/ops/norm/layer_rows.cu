// Layer norm over rows held in registers: one warp per row, lane l holding elements
// l, l + 32, ..., l + 32 (V - 1) of it (rows of at most 32 V elements, `len` >= 1), so loads
// and stores are coalesced across the warp and each element is read and written once.
// Statistics and arithmetic are f32 whatever the storage dtypes (f32, bf16 or f16, named per
// pointer by an LN_* code), and each result is rounded once to its dtype: autocast's layer
// norm, which computes in f32, with the cast its consumer wants folded into the store.
// Rows are contiguous at `row * len`; row counts fit i64, row lengths int (at most 32 LN_V).

#define LN_F32 0
#define LN_BF16 1
#define LN_F16 2
#define LN_FULL 0xffffffffu

// `v` rounded to dtype `dt` and widened back: what a store then a load would give.
__device__ __forceinline__ float ln_round(float v, int dt) {
    if (dt == LN_BF16) return bf16_to_f32(f32_to_bf16(v));
    if (dt == LN_F16) return f16_to_f32(f32_to_f16(v));
    return v;
}

// Row elements `lane + 32 k` (k < V) of the row at `base` as f32; 0 past the row's end. The
// dtype switch sits outside the unrolled loops, so each element costs one load and one convert.
template <int V>
__device__ __forceinline__ void ln_load(const void* p, int dt, i64 base, int lane, int len, float (&v)[V]) {
    if (dt == LN_F32) {
        const float* q = (const float*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = lane + 32 * k < len ? q[lane + 32 * k] : 0.0f;
    } else if (dt == LN_BF16) {
        const bf16_t* q = (const bf16_t*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = lane + 32 * k < len ? bf16_to_f32(q[lane + 32 * k]) : 0.0f;
    } else {
        const f16_t* q = (const f16_t*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = lane + 32 * k < len ? f16_to_f32(q[lane + 32 * k]) : 0.0f;
    }
}

// Stores row elements `lane + 32 k` that lie inside the row, each rounded once to `dt`.
template <int V>
__device__ __forceinline__ void ln_store(void* p, int dt, i64 base, int lane, int len, const float (&v)[V]) {
    if (dt == LN_F32) {
        float* q = (float*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (lane + 32 * k < len) q[lane + 32 * k] = v[k];
    } else if (dt == LN_BF16) {
        bf16_t* q = (bf16_t*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (lane + 32 * k < len) q[lane + 32 * k] = f32_to_bf16(v[k]);
    } else {
        f16_t* q = (f16_t*)p + base;
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (lane + 32 * k < len) q[lane + 32 * k] = f32_to_f16(v[k]);
    }
}

// The warp's sum of `v`, in every lane. The butterfly adds the same two values in every lane
// of a pair (a + b == b + a exactly), so all lanes hold the same bits.
__device__ __forceinline__ float ln_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LN_FULL, v, o);
    return v;
}

// Forward: out = (s - mean) * rstd * weight + bias for s = x (y null) or s = x + y rounded to
// sum_dt and stored to `sum`. The statistics are two-pass over the registers, shifted by the
// row's first element (exact for clustered data, Sterbenz), so a large mean over a small
// spread keeps the spread; mean and rstd are written per row. weight and bias may be null.
template <int V>
__device__ __forceinline__ void ln_forward(const void* x, int x_dt, const void* y, int y_dt, void* sum,
                                           int sum_dt, void* out, int out_dt, const float* weight,
                                           const float* bias, float* mean, float* rstd, i64 rows, int len,
                                           float eps) {
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const float n = (float)len;
    for (i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
        const i64 base = row * len;
        float v[V];
        ln_load<V>(x, x_dt, base, lane, len, v);
        if (y) {
            float t[V];
            ln_load<V>(y, y_dt, base, lane, len, t);
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = ln_round(v[k] + t[k], sum_dt);
            ln_store<V>(sum, sum_dt, base, lane, len, v);
        }
        const float pivot = __shfl_sync(LN_FULL, v[0], 0);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            if (lane + 32 * k < len) {
                v[k] -= pivot;
                s += v[k];
            }
        }
        const float mu = ln_warp_sum(s) / n;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float d = v[k] - mu;
            if (lane + 32 * k < len) q += d * d;
        }
        const float rs = 1.0f / sqrtf(ln_warp_sum(q) / n + eps);
        if (lane == 0) {
            mean[row] = pivot + mu;
            rstd[row] = rs;
        }
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const int j = lane + 32 * k;
            if (j < len) {
                float o = (v[k] - mu) * rs;
                if (weight) o *= weight[j];
                if (bias) o += bias[j];
                v[k] = o;
            }
        }
        ln_store<V>(out, out_dt, base, lane, len, v);
    }
}

// Backward, one pass over the rows: with x_hat = (x - mean) * rstd and gy = dy * weight,
// dx = rstd * (gy - mean(gy) - x_hat * mean(gy * x_hat)) + dres (dres, the gradient that reached
// x by another path, may be null), stored in dx_dt and, when dlow is set, also in dlow_dt.
// When part_w is set, each lane also adds dy * x_hat and dy of its columns into its warp's
// rows of shared memory (2 * blockDim.x / 32 * len floats: each warp owns `len` floats of
// each, so no barrier is needed until the end, and registers stay free for the row); the
// block's warps are then added in a fixed order into part_w/part_b[blockIdx.x * len + j],
// which ln_param_finish sums over the blocks. Every thread reaches the barrier (no early exit).
template <int V>
__device__ __forceinline__ void ln_backward(const void* dy, int dy_dt, const void* x, int x_dt,
                                            const float* mean, const float* rstd, const float* weight,
                                            const void* dres, int dres_dt, void* dx, int dx_dt, void* dlow,
                                            int dlow_dt, float* part_w, float* part_b, i64 rows, int len) {
    extern __shared__ float ln_shared[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, block_warps = blockDim.x >> 5;
    const i64 warps = (i64)gridDim.x * block_warps;
    const float n = (float)len;
    float* sum_w = ln_shared + warp * len;  // this warp's column sums of dy * x_hat
    float* sum_b = ln_shared + (block_warps + warp) * len;  // and of dy
    if (part_w) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            if (lane + 32 * k < len) sum_w[lane + 32 * k] = sum_b[lane + 32 * k] = 0.0f;
        }
    }
    for (i64 row = (i64)blockIdx.x * block_warps + warp; row < rows; row += warps) {
        const i64 base = row * len;
        float g[V], h[V];
        ln_load<V>(dy, dy_dt, base, lane, len, g);
        ln_load<V>(x, x_dt, base, lane, len, h);
        const float m = mean[row], rs = rstd[row];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const int j = lane + 32 * k;
            // Past the row's end g is 0 and x_hat is set to 0, so nothing there adds to a sum
            // (not even a NaN mean times 0).
            h[k] = j < len ? (h[k] - m) * rs : 0.0f;
            if (part_w && j < len) {
                sum_w[j] += g[k] * h[k];
                sum_b[j] += g[k];
            }
            if (weight && j < len) g[k] *= weight[j];
            s1 += g[k];
            s2 += g[k] * h[k];
        }
        const float c1 = ln_warp_sum(s1) / n, c2 = ln_warp_sum(s2) / n;
        // An explicit rounded product, so the residual add below is not contracted into it:
        // dx is then bit for bit layer norm's dx plus the residual, as the unfused ops give.
#pragma unroll
        for (int k = 0; k < V; ++k) h[k] = __fmul_rn(rs, g[k] - c1 - h[k] * c2);
        if (dres) {
            float r[V];
            ln_load<V>(dres, dres_dt, base, lane, len, r);
#pragma unroll
            for (int k = 0; k < V; ++k) h[k] += r[k];
        }
        ln_store<V>(dx, dx_dt, base, lane, len, h);
        if (dlow) ln_store<V>(dlow, dlow_dt, base, lane, len, h);
    }
    if (!part_w) return;  // the same for every thread of the grid: no barrier is skipped alone
    __syncthreads();
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float tw = 0.0f, tb = 0.0f;
        for (int w = 0; w < block_warps; ++w) {
            tw += ln_shared[w * len + j];
            tb += ln_shared[(block_warps + w) * len + j];
        }
        part_w[(i64)blockIdx.x * len + j] = tw;
        part_b[(i64)blockIdx.x * len + j] = tb;
    }
}

// LN_V, the values per lane, is defined in front of this source: each row-width class is a
// module of its own, so a model compiles only the kernels its rows need.
extern "C" __global__ void ln_rows_forward(const void* x, int x_dt, const void* y, int y_dt, void* sum,
                                           int sum_dt, void* out, int out_dt, const float* weight,
                                           const float* bias, float* mean, float* rstd, i64 rows, int len,
                                           float eps) {
    ln_forward<LN_V>(x, x_dt, y, y_dt, sum, sum_dt, out, out_dt, weight, bias, mean, rstd, rows, len, eps);
}

extern "C" __global__ void ln_rows_backward(const void* dy, int dy_dt, const void* x, int x_dt,
                                            const float* mean, const float* rstd, const float* weight,
                                            const void* dres, int dres_dt, void* dx, int dx_dt, void* dlow,
                                            int dlow_dt, float* part_w, float* part_b, i64 rows, int len) {
    ln_backward<LN_V>(dy, dy_dt, x, x_dt, mean, rstd, weight, dres, dres_dt, dx, dx_dt, dlow, dlow_dt, part_w,
                      part_b, rows, len);
}

// dw[j] and db[j]: the `parts` block partials of column j summed in f64 in a fixed order.
// Blocks of (32, 32): threadIdx.x picks the column (coalesced reads of a partial row),
// threadIdx.y strides over the partials, and row 0 adds the 32 sums in order.
extern "C" __global__ void ln_param_finish(const float* part_w, const float* part_b, i64 parts, int len,
                                           float* dw, float* db) {
    __shared__ double sw[32][33], sb[32][33];
    const int j = blockIdx.x * 32 + threadIdx.x;
    double aw = 0.0, ab = 0.0;
    if (j < len) {
        for (i64 p = threadIdx.y; p < parts; p += 32) {
            aw += (double)part_w[p * len + j];
            ab += (double)part_b[p * len + j];
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < len) {
        double tw = 0.0, tb = 0.0;
        for (int r = 0; r < 32; ++r) {
            tw += sw[r][threadIdx.x];
            tb += sb[r][threadIdx.x];
        }
        dw[j] = (float)tw;
        db[j] = (float)tb;
    }
}
