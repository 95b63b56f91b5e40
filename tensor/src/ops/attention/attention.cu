// Fused attention (FlashAttention-2): softmax(q k^T * scale + mask) v without the [L, S] score
// matrix in memory. q, k, v are [B, H, T, D] views with the last dim contiguous (any strides
// for B, H, T); outputs are written [B, T, H, D] contiguous, so merging the heads afterwards
// is a free view. Products run on tensor cores (mma.sync m16n8k16, bf16 or f16 inputs, f32
// accumulators); softmax statistics stay in f32.
//
// A block of 4 warps takes 64 rows (queries in the forward and dq kernels, keys in the dk/dv
// kernel), 16 per warp, and walks the 64-row tiles of the other side through shared memory.
// The masks: key j is seen by query i when j < S, j < key_len[b] (padding) and, if causal,
// j <= i (top-left aligned, as PyTorch's is_causal).
//
// The backward is two kernels, each recomputing the probabilities from the saved log-sum-exp:
// one per key tile for dk and dv, one per query tile for dq. No atomics, so the gradients are
// the same on every run.

#define ATT_ROWS 64
#define ATT_THREADS 128
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)

// Element strides of a [B, H, T, D] view (D contiguous).
struct Bhtd {
    i64 b, h, t;
};

template <bool F16> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<false>(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}
template <> __device__ __forceinline__ u32 pack2<true>(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}
template <bool F16> __device__ __forceinline__ float unpack(unsigned short x) {
    return F16 ? f16_to_f32(x) : bf16_to_f32(x);
}

// d += a (16x16, row-major) * b (16x8, column-major), f32 accumulators.
template <bool F16> __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]);
template <> __device__ __forceinline__ void mma<false>(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma<true>(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Fragment positions (PTX's m16n8k16 layouts), lane = 4 g + t: an A fragment holds rows g and
// g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9; a B fragment columns (n) g, rows (k) 2t, 2t + 1
// and 2t + 8, 2t + 9; an accumulator rows g and g + 8, columns 2t, 2t + 1.
__device__ __forceinline__ int lane_g() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_t() { return threadIdx.x & 3; }

// A shared tile of 64 rows of D 16-bit values, padded so that fragment loads spread over banks.
template <int D> struct Tile {
    unsigned short v[ATT_ROWS][D + 8];
    // Rows row0.. of a [T, D] matrix (row stride `stride`, T rows) into the tile; rows past T
    // are zero. All threads of the block call it.
    __device__ __forceinline__ void load(const unsigned short* src, i64 stride, int row0, int rows) {
        constexpr int chunks = D / 8;  // 16-byte chunks per row
        for (int i = threadIdx.x; i < ATT_ROWS * chunks; i += ATT_THREADS) {
            const int r = i / chunks, c = (i % chunks) * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (row0 + r < rows) x = *(const uint4*)(src + (i64)(row0 + r) * stride + c);
            *(uint4*)&v[r][c] = x;
        }
    }
    // Two neighbouring columns of one row, as a fragment register.
    __device__ __forceinline__ u32 pair(int r, int c) const { return *(const u32*)&v[r][c]; }
    // Rows r and r + 1 of column c (a B fragment whose k runs down the rows).
    __device__ __forceinline__ u32 column_pair(int r, int c) const {
        return (u32)v[r][c] | ((u32)v[r + 1][c] << 16);
    }
};

// The A fragments of 16 rows (row0..row0+15 of a [T, D] matrix in global memory), zero past T.
template <int D>
__device__ __forceinline__ void load_a_rows(u32 (&a)[D / 16][4], const unsigned short* src, i64 stride, int row0,
                                            int rows) {
    const int g = lane_g(), t = lane_t();
    const bool lo = row0 + g < rows, hi = row0 + g + 8 < rows;
    const unsigned short* p0 = src + (i64)(row0 + g) * stride;
    const unsigned short* p1 = src + (i64)(row0 + g + 8) * stride;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        const int c = ks * 16 + 2 * t;
        a[ks][0] = lo ? *(const u32*)(p0 + c) : 0u;
        a[ks][1] = hi ? *(const u32*)(p1 + c) : 0u;
        a[ks][2] = lo ? *(const u32*)(p0 + c + 8) : 0u;
        a[ks][3] = hi ? *(const u32*)(p1 + c + 8) : 0u;
    }
}

// acc[n] = rows (the A fragments, 16 x D) times the 64 rows of `tile` transposed: 16 x 64
// products of row vectors (q . k, or dO . v), eight 8-column accumulators.
template <bool F16, int D>
__device__ __forceinline__ void rows_times_tile(float (&acc)[8][4], const u32 (&a)[D / 16][4], const Tile<D>& tile) {
    const int g = lane_g(), t = lane_t();
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            const u32 b[2] = {tile.pair(n * 8 + g, ks * 16 + 2 * t), tile.pair(n * 8 + g, ks * 16 + 8 + 2 * t)};
            mma<F16>(acc[n], a[ks], b);
        }
    }
}

// out[d] += p (16 x 64, as accumulators, rounded to 16 bits) times the tile (64 x D).
template <bool F16, int D>
__device__ __forceinline__ void probs_times_tile(float (&out)[D / 8][4], const float (&p)[8][4], const Tile<D>& tile) {
    const int g = lane_g(), t = lane_t();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u32 a[4] = {pack2<F16>(p[2 * kk][0], p[2 * kk][1]), pack2<F16>(p[2 * kk][2], p[2 * kk][3]),
                          pack2<F16>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                          pack2<F16>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const u32 b[2] = {tile.column_pair(kk * 16 + 2 * t, n * 8 + g), tile.column_pair(kk * 16 + 8 + 2 * t, n * 8 + g)};
            mma<F16>(out[n], a, b);
        }
    }
}

__device__ __forceinline__ bool visible(int i, int j, int L, int S, int key_len, int causal) {
    return i < L && j < S && j < key_len && !(causal && j > i);
}

// Writes 16 rows (row0..) x D of accumulators, times `mul`, to a [T, H, D]-ordered output
// (row stride H * D), skipping rows past T.
template <bool F16, int D>
__device__ __forceinline__ void store_rows(unsigned short* dst, i64 row_stride, int row0, int rows,
                                           const float (&acc)[D / 8][4], float mul_lo, float mul_hi) {
    const int g = lane_g(), t = lane_t();
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int c = n * 8 + 2 * t;
        if (row0 + g < rows) *(u32*)(dst + (i64)(row0 + g) * row_stride + c) = pack2<F16>(acc[n][0] * mul_lo, acc[n][1] * mul_lo);
        if (row0 + g + 8 < rows)
            *(u32*)(dst + (i64)(row0 + g + 8) * row_stride + c) = pack2<F16>(acc[n][2] * mul_hi, acc[n][3] * mul_hi);
    }
}

// Forward: out and the log-sum-exp of every query's scores (f32 [B, H, L], natural log).
template <bool F16, int D>
__device__ void attention_forward(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                                  const unsigned short* v, Bhtd sv, unsigned short* out, float* lse, int H, int L,
                                  int S, const i64* key_lens, float scale, int causal) {
    __shared__ Tile<D> ks, vs;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, g = lane_g(), t = lane_t();
    const int q0 = blockIdx.x * ATT_ROWS + warp * 16;  // this warp's first query
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    const int key_len = key_lens ? (int)min((i64)S, key_lens[b]) : S;
    int tiles = (min(S, key_len) + ATT_ROWS - 1) / ATT_ROWS;
    if (causal) tiles = min(tiles, (min(L, (int)(blockIdx.x + 1) * ATT_ROWS) - 1) / ATT_ROWS + 1);
    u32 qa[D / 16][4];
    load_a_rows<D>(qa, q, sq.t, q0, L);
    const float c = scale * LOG2E;  // scores in base 2
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    for (int kt = 0; kt < tiles; ++kt) {
        __syncthreads();
        ks.load(k, sk.t, kt * ATT_ROWS, S);
        vs.load(v, sv.t, kt * ATT_ROWS, S);
        __syncthreads();
        float s[8][4];
        rows_times_tile<F16, D>(s, qa, ks);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = q0 + g + (e >> 1) * 8, j = kt * ATT_ROWS + n * 8 + 2 * t + (e & 1);
                s[n][e] = visible(i, j, L, S, key_len, causal) ? s[n][e] * c : NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        // Rescale what was summed under the old maximum; a row that has seen no key yet keeps
        // base 0 so that exp2(-inf - base) is 0, not NaN.
        float base[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            base[r] = mx[r] == NEG_INF ? 0.f : mx[r];
            alpha[r] = exp2f(m[r] - base[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = exp2f(s[n][e] - base[e >> 1]);
                l[e >> 1] += s[n][e];
            }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        probs_times_tile<F16, D>(o, s, vs);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    // A query that sees no key gets 0/0 = NaN, as in PyTorch, and a log-sum-exp of -inf.
    out += ((i64)b * L * H + h) * D;
    store_rows<F16, D>(out, (i64)H * D, q0, L, o, 1.f / l[0], 1.f / l[1]);
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = q0 + g + r * 8;
            if (i < L) lse[(i64)bh * L + i] = (m[r] + log2f(l[r])) / LOG2E;
        }
    }
}

// delta[i] = sum_d dout[i, d] * out[i, d] (f32 [B, H, L]): the row term of softmax's backward.
// One warp per query row.
template <bool F16, int D>
__device__ void attention_delta(const unsigned short* dout, Bhtd sd, const unsigned short* out, Bhtd so,
                                float* delta, int H, int L, i64 rows) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const i64 bh = row / L;
    const int i = (int)(row % L), b = (int)(bh / H), h = (int)(bh % H);
    const unsigned short* pd = dout + b * sd.b + h * sd.h + i * sd.t;
    const unsigned short* po = out + b * so.b + h * so.h + i * so.t;
    float acc = 0.f;
    for (int d = lane; d < D; d += 32) acc += unpack<F16>(pd[d]) * unpack<F16>(po[d]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) delta[row] = acc;
}

// dq for 64 queries: the walk of the forward over key tiles, with
// dS = P * (dO v^T - delta) and dq = scale * dS k.
template <bool F16, int D>
__device__ void attention_dq(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                             const unsigned short* v, Bhtd sv, const unsigned short* dout, Bhtd sd, const float* lse,
                             const float* delta, unsigned short* dq, int H, int L, int S, const i64* key_lens,
                             float scale, int causal) {
    __shared__ Tile<D> ks, vs;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, g = lane_g(), t = lane_t();
    const int q0 = blockIdx.x * ATT_ROWS + warp * 16;
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    dout += b * sd.b + h * sd.h;
    const int key_len = key_lens ? (int)min((i64)S, key_lens[b]) : S;
    int tiles = (min(S, key_len) + ATT_ROWS - 1) / ATT_ROWS;
    if (causal) tiles = min(tiles, (min(L, (int)(blockIdx.x + 1) * ATT_ROWS) - 1) / ATT_ROWS + 1);
    u32 qa[D / 16][4], da[D / 16][4];
    load_a_rows<D>(qa, q, sq.t, q0, L);
    load_a_rows<D>(da, dout, sd.t, q0, L);
    const float c = scale * LOG2E;
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = q0 + g + r * 8;
        lse2[r] = i < L ? lse[(i64)bh * L + i] * LOG2E : 0.f;
        dl[r] = i < L ? delta[(i64)bh * L + i] : 0.f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    for (int kt = 0; kt < tiles; ++kt) {
        __syncthreads();
        ks.load(k, sk.t, kt * ATT_ROWS, S);
        vs.load(v, sv.t, kt * ATT_ROWS, S);
        __syncthreads();
        float p[8][4], dp[8][4];
        rows_times_tile<F16, D>(p, qa, ks);
        rows_times_tile<F16, D>(dp, da, vs);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = q0 + g + (e >> 1) * 8, j = kt * ATT_ROWS + n * 8 + 2 * t + (e & 1);
                const float pr = visible(i, j, L, S, key_len, causal) ? exp2f(p[n][e] * c - lse2[e >> 1]) : 0.f;
                p[n][e] = pr * (dp[n][e] - dl[e >> 1]);  // dS
            }
        probs_times_tile<F16, D>(acc, p, ks);
    }
    dq += ((i64)b * L * H + h) * D;
    store_rows<F16, D>(dq, (i64)H * D, q0, L, acc, scale, scale);
}

// dk and dv for 64 keys: a walk over query tiles with the roles turned round,
// S^T = k q^T, dv = P^T dO, dS^T = P^T * (v dO^T - delta), dk = scale * dS^T q.
template <bool F16, int D>
__device__ void attention_dkv(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                              const unsigned short* v, Bhtd sv, const unsigned short* dout, Bhtd sd, const float* lse,
                              const float* delta, unsigned short* dk, unsigned short* dv, int H, int L, int S,
                              const i64* key_lens, float scale, int causal) {
    __shared__ Tile<D> qs, ds;
    __shared__ float lse_s[ATT_ROWS], delta_s[ATT_ROWS];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, g = lane_g(), t = lane_t();
    const int k0 = blockIdx.x * ATT_ROWS + warp * 16;  // this warp's first key
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    dout += b * sd.b + h * sd.h;
    const int key_len = key_lens ? (int)min((i64)S, key_lens[b]) : S;
    const int tiles = (L + ATT_ROWS - 1) / ATT_ROWS;
    // Causal: the first query that sees this block's first key.
    const int first = causal ? (int)(blockIdx.x * ATT_ROWS) / ATT_ROWS : 0;
    u32 ka[D / 16][4], va[D / 16][4];
    load_a_rows<D>(ka, k, sk.t, k0, S);
    load_a_rows<D>(va, v, sv.t, k0, S);
    const float c = scale * LOG2E;
    float gk[D / 8][4], gv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) gk[n][e] = gv[n][e] = 0.f;
    const bool any_key = (int)(blockIdx.x * ATT_ROWS) < key_len;
    for (int qt = any_key ? first : tiles; qt < tiles; ++qt) {
        __syncthreads();
        qs.load(q, sq.t, qt * ATT_ROWS, L);
        ds.load(dout, sd.t, qt * ATT_ROWS, L);
        for (int i = threadIdx.x; i < ATT_ROWS; i += ATT_THREADS) {
            const int qi = qt * ATT_ROWS + i;
            lse_s[i] = qi < L ? lse[(i64)bh * L + qi] * LOG2E : 0.f;
            delta_s[i] = qi < L ? delta[(i64)bh * L + qi] : 0.f;
        }
        __syncthreads();
        float p[8][4], dp[8][4];
        rows_times_tile<F16, D>(p, ka, qs);
        rows_times_tile<F16, D>(dp, va, ds);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n * 8 + 2 * t + (e & 1), i = qt * ATT_ROWS + col, j = k0 + g + (e >> 1) * 8;
                p[n][e] = visible(i, j, L, S, key_len, causal) ? exp2f(p[n][e] * c - lse_s[col]) : 0.f;
                dp[n][e] = p[n][e] * (dp[n][e] - delta_s[col]);  // dS^T
            }
        probs_times_tile<F16, D>(gv, p, ds);
        probs_times_tile<F16, D>(gk, dp, qs);
    }
    dk += ((i64)b * S * H + h) * D;
    dv += ((i64)b * S * H + h) * D;
    store_rows<F16, D>(dk, (i64)H * D, k0, S, gk, scale, scale);
    store_rows<F16, D>(dv, (i64)H * D, k0, S, gv, 1.f, 1.f);
}

#define ATTENTION(SUFFIX, F16, D)                                                                                  \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_forward_##SUFFIX##_d##D(                   \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        unsigned short* out, float* lse, int H, int L, int S, const i64* key_lens, float scale, int causal) {       \
        attention_forward<F16, D>(q, sq, k, sk, v, sv, out, lse, H, L, S, key_lens, scale, causal);                \
    }                                                                                                              \
    extern "C" __global__ void attention_delta_##SUFFIX##_d##D(const unsigned short* dout, Bhtd sd,               \
                                                               const unsigned short* out, Bhtd so, float* delta,   \
                                                               int H, int L, i64 rows) {                           \
        attention_delta<F16, D>(dout, sd, out, so, delta, H, L, rows);                                             \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_dq_##SUFFIX##_d##D(                        \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        const unsigned short* dout, Bhtd sd, const float* lse, const float* delta, unsigned short* dq, int H,      \
        int L, int S, const i64* key_lens, float scale, int causal) {                                              \
        attention_dq<F16, D>(q, sq, k, sk, v, sv, dout, sd, lse, delta, dq, H, L, S, key_lens, scale, causal);     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_dkv_##SUFFIX##_d##D(                       \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        const unsigned short* dout, Bhtd sd, const float* lse, const float* delta, unsigned short* dk,             \
        unsigned short* dv, int H, int L, int S, const i64* key_lens, float scale, int causal) {                   \
        attention_dkv<F16, D>(q, sq, k, sk, v, sv, dout, sd, lse, delta, dk, dv, H, L, S, key_lens, scale,         \
                              causal);                                                                             \
    }
ATTENTION(bf16, false, 32)
ATTENTION(bf16, false, 64)
ATTENTION(bf16, false, 128)
ATTENTION(f16, true, 32)
ATTENTION(f16, true, 64)
ATTENTION(f16, true, 128)
