// Backward of attention_v2.cu (appended to it): two kernels, each recomputing the probabilities
// from the saved log-sum-exp. The dq kernel runs first and writes delta = rowsum(dO * O), which
// the dk/dv kernel reads.

// delta[i] = sum_d dO[i, d] O[i, d] for the 64 rows of two shared tiles, into delta_s and, for
// rows before L, into the global row term (f32): two threads per row, half the columns each.
template <bool F16, int D>
__device__ __forceinline__ void row_delta(float* delta_s, const unsigned short* do_tile, const unsigned short* o_tile,
                                          float* delta, int q0, int L) {
    static_assert(FA_THREADS == 2 * FA_TILE, "two threads per row");
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
        const int c = half * (D / 2) + i * 8;
        const uint4 x = *(const uint4*)(do_tile + r * (D + 8) + c), y = *(const uint4*)(o_tile + r * (D + 8) + c);
        const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int w = 0; w < 4; ++w)
            acc += unpack<F16>(xs[w] & 0xffffu) * unpack<F16>(ys[w] & 0xffffu) +
                   unpack<F16>(xs[w] >> 16) * unpack<F16>(ys[w] >> 16);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (half == 0) {
        delta_s[r] = acc;
        if (q0 + r < L) delta[q0 + r] = acc;
    }
}

// dq for 64 queries: the forward's walk over key tiles, with dS = P * (dO v^T - delta) and
// dq = scale dS k. Q and dO stay in registers; K and V come through two shared buffers each.
template <bool F16, int D>
__device__ __forceinline__ void flash_dq(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                                         const unsigned short* v, Bhtd sv, const unsigned short* dout, Bhtd sd,
                                         const unsigned short* out, Bhtd so, const float* lse, float* delta,
                                         unsigned short* dq, int H, int L, int S, const i64* key_lens, float scale,
                                         int causal) {
    // Keys per product: the whole tile, or halves of it where registers are short (D = 128),
    // which also read dO's fragments from shared memory at each product.
    constexpr bool DO_IN_REGISTERS = D <= 64;
    constexpr int TILE = FA_TILE * (D + 8), N = D <= 64 ? 8 : 4, PART = 8 * N;
    unsigned short* q_tile = dynamic_smem();
    unsigned short* do_tile = q_tile + TILE;
    unsigned short* k_tiles = q_tile + 2 * TILE;
    unsigned short* v_tiles = q_tile + 4 * TILE;
    float* delta_s = (float*)(q_tile + 6 * TILE);
    const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x >> 5, g = lane_g();
    const int q_block = (gridDim.x - 1 - blockIdx.x) * FA_TILE, q_warp = q_block + warp * 16;
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    dout += b * sd.b + h * sd.h;
    out += b * so.b + h * so.h;
    const int key_len = key_length(key_lens, b, S);
    const int tiles = key_tiles(key_len, causal, q_block, FA_TILE, L);
    copy_rows<D, FA_TILE>(q_tile, q, sq.t, q_block, L);
    copy_rows<D, FA_TILE>(do_tile, dout, sd.t, q_block, L);
    // O goes to K's second buffer, unused until the walk's first prefetch.
    copy_rows<D, FA_TILE>(k_tiles + TILE, out, so.t, q_block, L);
    if (tiles > 0) {
        copy_rows<D, FA_TILE>(k_tiles, k, sk.t, 0, S);
        copy_rows<D, FA_TILE>(v_tiles, v, sv.t, 0, S);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    row_delta<F16, D>(delta_s, do_tile, k_tiles + TILE, delta + (i64)bh * L, q_block, L);
    u32 qa[1][D / 16][4], da[1][D / 16][4];
    load_a<D, 1>(qa, q_tile, warp * 16);
    if constexpr (DO_IN_REGISTERS) load_a<D, 1>(da, do_tile, warp * 16);
    // delta_s is complete, and every thread is done with O before the walk overwrites it.
    __syncthreads();
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + g + r * 8, i = q_block + row;
        lse2[r] = i < L ? lse[(i64)bh * L + i] * LOG2E : 0.f;
        dl[r] = delta_s[row];
    }
    const u32 lane_a = lane_a_order(D + 8) * 2, lane_b = lane_b_order(D + 8) * 2;
    const u32 do_rows = smem_u32(do_tile + warp * 16 * (D + 8)) + lane_a;
    const float c = scale * LOG2E;
    float acc[1][D / 8][4];
    zero(acc);
    for (int kt = 0; kt < tiles; ++kt) {
        const int buf = kt & 1, key0 = kt * FA_TILE;
        if (kt > 0) {
            cp_async_wait_all();
            __syncthreads();
        }
        if (kt + 1 < tiles) {
            copy_rows<D, FA_TILE>(k_tiles + (buf ^ 1) * TILE, k, sk.t, key0 + FA_TILE, S);
            copy_rows<D, FA_TILE>(v_tiles + (buf ^ 1) * TILE, v, sv.t, key0 + FA_TILE, S);
            cp_async_commit();
        }
        const u32 k_at = smem_u32(k_tiles + buf * TILE), v_at = smem_u32(v_tiles + buf * TILE);
        // Not unrolled: the halves' products would share registers and spill.
#pragma unroll 1
        for (int part = 0; part < FA_TILE / PART; ++part) {
            const int key = key0 + part * PART;
            // A warp whose queries all come before these keys sees none of them, nor later ones.
            if (causal && key > q_warp + 15) break;
            const u32 rows = part * PART * (D + 8) * 2;
            float p[1][N][4], dp[1][N][4];
            rows_times_tile<F16, D, 1, N>(p, qa, k_at + rows + lane_b);
            if constexpr (DO_IN_REGISTERS)
                rows_times_tile<F16, D, 1, N>(dp, da, v_at + rows + lane_b);
            else
                smem_rows_times_tile<F16, D, N>(dp, do_rows, v_at + rows + lane_b);
            if (key + PART > key_len || (causal && key + PART - 1 > q_warp))
                mask_scores<1, N>(p, q_warp, key, key_len, causal);
            // Hidden scores are -inf, so their probability is 0 (lse is finite: the row sees a key).
#pragma unroll
            for (int n = 0; n < N; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    p[0][n][e] = fast_exp2(fmaf(p[0][n][e], c, -lse2[e >> 1])) * (dp[0][n][e] - dl[e >> 1]);
            probs_times_tile<F16, D, 1, N>(acc, p, k_at + rows + lane_a);
        }
    }
    const float mul[1][2] = {{scale, scale}};
    store_rows<F16, D, 1>(dq + ((i64)b * L * H + h) * D, (i64)H * D, q_warp, L, q_tile + warp * 16 * (D + 8), acc, mul);
}

// A query tile of the dk/dv walk: Q and dO rows q0.., and their lse and delta (f32, 64 each,
// zero past L) into `stats` [lse | delta].
template <int D>
__device__ __forceinline__ void copy_query_tile(unsigned short* q_tile, unsigned short* do_tile, float* stats,
                                                const unsigned short* q, i64 q_stride, const unsigned short* dout,
                                                i64 do_stride, const float* lse, const float* delta, int q0, int L) {
    static_assert(FA_THREADS == 2 * FA_TILE, "one lse or delta value per thread");
    copy_rows<D, FA_TILE>(q_tile, q, q_stride, q0, L);
    copy_rows<D, FA_TILE>(do_tile, dout, do_stride, q0, L);
    const int i = threadIdx.x % FA_TILE;
    float* dst = stats + threadIdx.x;
    if (q0 + i < L)
        cp_async_4(smem_u32(dst), (threadIdx.x < FA_TILE ? lse : delta) + q0 + i);
    else
        *dst = 0.f;
}

// dk and dv for 64 keys: a walk over query tiles with the roles turned round, S^T = k q^T,
// dv = P^T dO, dS^T = P^T * (v dO^T - delta), dk = scale dS^T q. Q, dO and their rows' lse and
// delta come through two shared buffers; k and v stay in registers where they fit (D <= 64),
// else their fragments are read from shared memory at each product.
template <bool F16, int D>
__device__ __forceinline__ void flash_dkv(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                                          const unsigned short* v, Bhtd sv, const unsigned short* dout, Bhtd sd,
                                          const float* lse, const float* delta, unsigned short* dk,
                                          unsigned short* dv, int H, int L, int S, const i64* key_lens, float scale,
                                          int causal) {
    constexpr bool KV_IN_REGISTERS = D <= 64;
    // Queries per product: the whole tile, or quarters of it where registers are short (D = 128).
    constexpr int TILE = FA_TILE * (D + 8), N = D <= 64 ? 8 : 2, PART = 8 * N;
    unsigned short* k_tile = dynamic_smem();
    unsigned short* v_tile = k_tile + TILE;
    unsigned short* q_tiles = k_tile + 2 * TILE;
    unsigned short* do_tiles = k_tile + 4 * TILE;
    float* stats = (float*)(k_tile + 6 * TILE);  // two buffers of [lse 64 | delta 64]
    const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x >> 5, g = lane_g(), t = lane_t();
    const int k_block = blockIdx.x * FA_TILE, k_warp = k_block + warp * 16;
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    dout += b * sd.b + h * sd.h;
    lse += (i64)bh * L;
    delta += (i64)bh * L;
    const int key_len = key_length(key_lens, b, S);
    const int tiles = (L + FA_TILE - 1) / FA_TILE;
    // The first query tile with a query that sees a key of this block (none past the key length).
    const int first = k_block >= key_len ? tiles : causal ? k_block / FA_TILE : 0;
    copy_rows<D, FA_TILE>(k_tile, k, sk.t, k_block, S);
    copy_rows<D, FA_TILE>(v_tile, v, sv.t, k_block, S);
    if (first < tiles) copy_query_tile<D>(q_tiles, do_tiles, stats, q, sq.t, dout, sd.t, lse, delta, first * FA_TILE, L);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    const u32 lane_a = lane_a_order(D + 8) * 2, lane_b = lane_b_order(D + 8) * 2;
    const u32 k_rows = smem_u32(k_tile + warp * 16 * (D + 8)) + lane_a, v_rows = smem_u32(v_tile + warp * 16 * (D + 8)) + lane_a;
    u32 ka[1][D / 16][4], va[1][D / 16][4];
    if constexpr (KV_IN_REGISTERS) {
        load_a<D, 1>(ka, k_tile, warp * 16);
        load_a<D, 1>(va, v_tile, warp * 16);
    }
    const float c = scale * LOG2E;
    float gk[1][D / 8][4], gv[1][D / 8][4];
    zero(gk);
    zero(gv);
    for (int qt = first; qt < tiles; ++qt) {
        const int buf = (qt - first) & 1, q0 = qt * FA_TILE;
        if (qt > first) {
            cp_async_wait_all();
            __syncthreads();
        }
        if (qt + 1 < tiles) {
            copy_query_tile<D>(q_tiles + (buf ^ 1) * TILE, do_tiles + (buf ^ 1) * TILE, stats + (buf ^ 1) * 2 * FA_TILE,
                               q, sq.t, dout, sd.t, lse, delta, q0 + FA_TILE, L);
            cp_async_commit();
        }
        const u32 q_at = smem_u32(q_tiles + buf * TILE), do_at = smem_u32(do_tiles + buf * TILE);
        const float* lse_s = stats + buf * 2 * FA_TILE;
        // Not unrolled: the halves' products would share registers and spill.
#pragma unroll 1
        for (int part = 0; part < FA_TILE / PART; ++part) {
            const int qp = q0 + part * PART;
            // Queries that all come before this warp's first key see none of its keys.
            if (causal && qp + PART - 1 < k_warp) continue;
            const u32 rows = part * PART * (D + 8) * 2;
            float p[1][N][4], dp[1][N][4];
            if constexpr (KV_IN_REGISTERS) {
                rows_times_tile<F16, D, 1, N>(p, ka, q_at + rows + lane_b);
                rows_times_tile<F16, D, 1, N>(dp, va, do_at + rows + lane_b);
            } else {
                smem_rows_times_tile<F16, D, N>(p, k_rows, q_at + rows + lane_b);
                smem_rows_times_tile<F16, D, N>(dp, v_rows, do_at + rows + lane_b);
            }
            const bool masked = qp + PART > L || k_warp + 16 > key_len || (causal && k_warp + 15 > qp);
#pragma unroll
            for (int n = 0; n < N; ++n) {
                const int col = part * PART + n * 8 + 2 * t;
                const float2 ls = *(const float2*)(lse_s + col), dl = *(const float2*)(lse_s + FA_TILE + col);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float pr = fast_exp2(fmaf(p[0][n][e], c, -(e & 1 ? ls.y : ls.x) * LOG2E));
                    const int i = q0 + col + (e & 1), j = k_warp + g + (e >> 1) * 8;
                    // A select, not a product: a hidden score's exp2 may be inf.
                    p[0][n][e] = masked && (i >= L || j >= key_len || (causal && j > i)) ? 0.f : pr;
                    dp[0][n][e] = p[0][n][e] * (dp[0][n][e] - (e & 1 ? dl.y : dl.x));
                }
            }
            probs_times_tile<F16, D, 1, N>(gv, p, do_at + rows + lane_a);
            probs_times_tile<F16, D, 1, N>(gk, dp, q_at + rows + lane_a);
        }
    }
    const float mul_k[1][2] = {{scale, scale}}, mul_v[1][2] = {{1.f, 1.f}};
    const i64 at = ((i64)b * S * H + h) * D;
    store_rows<F16, D, 1>(dk + at, (i64)H * D, k_warp, S, k_tile + warp * 16 * (D + 8), gk, mul_k);
    store_rows<F16, D, 1>(dv + at, (i64)H * D, k_warp, S, v_tile + warp * 16 * (D + 8), gv, mul_v);
}

#define ATTENTION_V2_BACKWARD(SUFFIX, F16, D)                                                                      \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_v2_dq_##SUFFIX##_d##D(                     \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        const unsigned short* dout, Bhtd sd, const unsigned short* out, Bhtd so, const float* lse, float* delta,   \
        unsigned short* dq, int H, int L, int S, const i64* key_lens, float scale, int causal) {                   \
        flash_dq<F16, D>(q, sq, k, sk, v, sv, dout, sd, out, so, lse, delta, dq, H, L, S, key_lens, scale, causal); \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_v2_dkv_##SUFFIX##_d##D(                    \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        const unsigned short* dout, Bhtd sd, const float* lse, const float* delta, unsigned short* dk,             \
        unsigned short* dv, int H, int L, int S, const i64* key_lens, float scale, int causal) {                   \
        flash_dkv<F16, D>(q, sq, k, sk, v, sv, dout, sd, lse, delta, dk, dv, H, L, S, key_lens, scale, causal);    \
    }
ATTENTION_V2_BACKWARD(bf16, false, 32)
ATTENTION_V2_BACKWARD(bf16, false, 64)
ATTENTION_V2_BACKWARD(bf16, false, 128)
ATTENTION_V2_BACKWARD(f16, true, 32)
ATTENTION_V2_BACKWARD(f16, true, 64)
ATTENTION_V2_BACKWARD(f16, true, 128)
