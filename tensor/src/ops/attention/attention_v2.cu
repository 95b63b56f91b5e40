// Fused attention, second version (the default; OXTRAIN_ATTENTION=v1 selects attention.cu):
// FlashAttention-2 on mma.sync m16n8k16 for sm_80 and later. Same inputs, outputs, masks and
// log-sum-exp as attention.cu; what changes is how the tensor cores are fed:
// - operand fragments come from shared memory by ldmatrix (.trans where the product sums down
//   the tile's rows: V in P V, dO in P^T dO, Q in dS^T Q, K in dS K);
// - tiles are copied by cp.async into two buffers, so the next tile loads while this one is
//   multiplied, with one barrier per tile;
// - masks are evaluated only on tiles that cross the diagonal or the key or query length;
// - the forward takes 128 queries per block (32 per warp) where registers allow (D <= 64);
// - outputs are staged through shared memory and written as whole 16-byte row segments;
// - the backward's row term delta = rowsum(dO * O) is computed in the dq kernel's prologue
//   (and written out for the dk/dv kernel, launched after it), not by a kernel of its own.
// Still no atomics: dq is its own pass over key tiles, so gradients are the same on every run.
//
// Shared tiles are rows of D 16-bit values padded by 16 bytes: the eight rows an ldmatrix
// phase reads (one 16-byte segment each, same column) then fall in eight different bank
// groups, and so do the eight segments of a row that eight cp.async threads write.

#define FA_THREADS 128
#define FA_TILE 64
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)

// Element strides of a [B, H, T, D] view (D contiguous), as in attention.cu.
struct Bhtd {
    i64 b, h, t;
};

// The PTX of the file; scripts/cuda_emulator defines its own versions of these functions to
// run the kernels on the CPU.
#ifndef OXTRAIN_EMULATED_PTX
// Two floats rounded to nearest even as 16-bit values, `lo` in the low half (one instruction;
// cvt puts its first source in the high half).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
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
// Four 8x8 matrices of 16-bit values from shared memory: lane l gives the address of row l % 8
// of matrix l / 8, and receives in r[i] row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix
// i; with .trans, rows and columns of each matrix swap.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// This thread's copies have landed; a barrier after it shows every thread's to every thread.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// The block's dynamic shared memory (one declaration for every kernel of the file).
__device__ __forceinline__ unsigned short* dynamic_smem() {
    extern __shared__ __align__(16) unsigned short fa_smem[];
    return fa_smem;
}
// 2^x on the special-function unit; -inf gives 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif

template <bool F16> __device__ __forceinline__ u32 pack2(float lo, float hi) {
    return F16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}
template <bool F16> __device__ __forceinline__ float unpack(u32 bits16) {
    return F16 ? f16_to_f32((unsigned short)bits16) : bf16_to_f32((unsigned short)bits16);
}

// Fragment positions (PTX's m16n8k16 layouts), lane = 4 g + t: an A fragment holds rows g and
// g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9; a B fragment columns (n) g, rows (k) 2t, 2t + 1
// and 2t + 8, 2t + 9; an accumulator rows g and g + 8, columns 2t, 2t + 1.
__device__ __forceinline__ int lane_g() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_t() { return threadIdx.x & 3; }

// This lane's ldmatrix address (in elements from a 16x16 block's corner) for the four 8x8
// quarters in "A order": (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
// (rows 8-15, cols 8-15). Loaded plainly that is an A fragment (a0..a3 above); loaded with
// .trans from a tile whose rows run along k, it is the B fragments of columns 0-7 (r0, r1) and
// 8-15 (r2, r3).
__device__ __forceinline__ int lane_a_order(int stride) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    return ((lane & 7) + (m & 1) * 8) * stride + (m >> 1) * 8;
}
// "B order": (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7), (rows 8-15,
// cols 8-15). Loaded plainly from a tile whose rows are the n index (k along the row), it is the
// B fragments of rows 0-7 (r0: k 0-7, r1: k 8-15) and of rows 8-15 (r2, r3).
__device__ __forceinline__ int lane_b_order(int stride) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    return ((lane & 7) + (m >> 1) * 8) * stride + (m & 1) * 8;
}

// Rows row0 .. row0 + ROWS - 1 of a [T, D] matrix (row stride `stride`, T = `rows`) into a
// shared tile by 16-byte cp.async copies; rows past T are zeroed by plain stores (ordered by
// the same barrier that publishes the copies). All threads of the block call it.
template <int D, int ROWS>
__device__ __forceinline__ void copy_rows(unsigned short* tile, const unsigned short* src, i64 stride, int row0,
                                          int rows) {
    constexpr int CHUNKS = D / 8;
    static_assert(ROWS * CHUNKS % FA_THREADS == 0, "whole passes of the block");
#pragma unroll
    for (int pass = 0; pass < ROWS * CHUNKS / FA_THREADS; ++pass) {
        const int i = pass * FA_THREADS + threadIdx.x;
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        unsigned short* dst = tile + r * (D + 8) + c;
        if (row0 + r < rows)
            cp_async_16(smem_u32(dst), src + (i64)(row0 + r) * stride + c);
        else
            *(uint4*)dst = make_uint4(0, 0, 0, 0);
    }
}

// A fragments of MT 16-row blocks (rows row0.., all D columns) of a shared tile.
template <int D, int MT>
__device__ __forceinline__ void load_a(u32 (&a)[MT][D / 16][4], const unsigned short* tile, int row0) {
    const u32 base = smem_u32(tile + row0 * (D + 8) + lane_a_order(D + 8));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) ldsm_x4(a[mt][ks], base + (mt * 16 * (D + 8) + ks * 16) * 2);
}

// acc[mt][n] += a[mt] (16 rows, columns ks*16 .. ks*16 + 15) times the same 16 columns of 8 N
// rows of a tile, transposed: one k-step of (rows . tile rows), e.g. q k^T. `tile_b` is the
// shared address of the tile's first row taken plus this lane's B-order offset, in bytes.
template <bool F16, int D, int MT, int N>
__device__ __forceinline__ void abt_step(float (&acc)[MT][N][4], const u32 (&a)[MT][4], u32 tile_b, int ks) {
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
        u32 b[4];
        ldsm_x4(b, tile_b + (np * 16 * (D + 8) + ks * 16) * 2);
        const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma<F16>(acc[mt][2 * np], a[mt], b0);
            mma<F16>(acc[mt][2 * np + 1], a[mt], b1);
        }
    }
}

template <int MT, int N> __device__ __forceinline__ void zero(float (&acc)[MT][N][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < N; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
}

// acc = a (register fragments, 16 MT x D) times 8 N rows of a tile, transposed.
template <bool F16, int D, int MT, int N>
__device__ __forceinline__ void rows_times_tile(float (&acc)[MT][N][4], const u32 (&a)[MT][D / 16][4], u32 tile_b) {
    zero(acc);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        u32 ak[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) ak[mt][i] = a[mt][ks][i];
        abt_step<F16, D, MT, N>(acc, ak, tile_b, ks);
    }
}

// The same with the 16 rows of a read from a shared tile at each k-step (`rows_a`: the rows'
// shared address plus this lane's A-order offset, in bytes), for when registers are short.
template <bool F16, int D, int N>
__device__ __forceinline__ void smem_rows_times_tile(float (&acc)[1][N][4], u32 rows_a, u32 tile_b) {
    zero(acc);
    // Two k-steps at a time: unrolled further, the loads run ahead into registers that are short.
#pragma unroll 2
    for (int ks = 0; ks < D / 16; ++ks) {
        u32 ak[1][4];
        ldsm_x4(ak[0], rows_a + ks * 16 * 2);
        abt_step<F16, D, 1, N>(acc, ak, tile_b, ks);
    }
}

// out[mt] += p[mt] (16 x 8 N accumulators, rounded to 16 bits) times 8 N rows of a tile (8 N x D),
// e.g. P V. `tile_a` is the shared address of the first row taken plus this lane's A-order
// offset, in bytes: the .trans load gives B fragments whose k runs down the tile's rows.
template <bool F16, int D, int MT, int N>
__device__ __forceinline__ void probs_times_tile(float (&out)[MT][D / 8][4], const float (&p)[MT][N][4], u32 tile_a) {
#pragma unroll
    for (int kk = 0; kk < N / 2; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = pack2<F16>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = pack2<F16>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = pack2<F16>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = pack2<F16>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            u32 b[4];
            ldsm_x4_trans(b, tile_a + (kk * 16 * (D + 8) + np * 16) * 2);
            const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma<F16>(out[mt][2 * np], a[mt], b0);
                mma<F16>(out[mt][2 * np + 1], a[mt], b1);
            }
        }
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Scores of queries (rows from row0) against keys (columns from col0) that the masks hide
// become -inf. Only called on tiles that cross a mask's edge.
template <int MT, int N>
__device__ __forceinline__ void mask_scores(float (&s)[MT][N][4], int row0, int col0, int key_len, int causal) {
    const int g = lane_g(), t = lane_t();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = row0 + mt * 16 + g + (e >> 1) * 8, j = col0 + n * 8 + 2 * t + (e & 1);
                if (j >= key_len || (causal && j > i)) s[mt][n][e] = NEG_INF;
            }
}

// One tile of the forward's online softmax: raises the running maxima m (raw scores), rescales
// the running sums l (per thread, summed over the quad at the end) and the output, and turns
// the scores s into probabilities exp2(s c - m c), c = scale log2(e) > 0.
template <int D, int MT>
__device__ __forceinline__ void online_softmax(float (&s)[MT][8][4], float (&m)[MT][2], float (&l)[MT][2],
                                               float (&o)[MT][D / 8][4], float c) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
        // A row that has seen no key yet keeps base 0, so that exp2(-inf - base) is 0, not NaN.
        float base[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = quad_max(mx[r]);
            base[r] = mx[r] == NEG_INF ? 0.f : mx[r] * c;
            alpha[r] = fast_exp2(m[mt][r] * c - base[r]);
            m[mt][r] = mx[r];
            l[mt][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], c, -base[e >> 1]));
                l[mt][e >> 1] += s[mt][n][e];
            }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[mt][n][0] *= alpha[0];
            o[mt][n][1] *= alpha[0];
            o[mt][n][2] *= alpha[1];
            o[mt][n][3] *= alpha[1];
        }
    }
}

// Writes a warp's 16 MT rows of accumulators, row r times mul[r / 16][(r / 8) % 2], to rows
// row0.. of a [T, H, D]-ordered output (row stride `row_stride`), skipping rows past T. The
// rows go through `stage`, this warp's own 16 MT rows of a shared tile, so that each store is a
// whole 16-byte segment of a row.
template <bool F16, int D, int MT>
__device__ __forceinline__ void store_rows(unsigned short* dst, i64 row_stride, int row0, int rows,
                                           unsigned short* stage, const float (&acc)[MT][D / 8][4],
                                           const float (&mul)[MT][2]) {
    const int g = lane_g(), t = lane_t(), lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            unsigned short* at = stage + (mt * 16 + g) * (D + 8) + n * 8 + 2 * t;
            *(u32*)at = pack2<F16>(acc[mt][n][0] * mul[mt][0], acc[mt][n][1] * mul[mt][0]);
            *(u32*)(at + 8 * (D + 8)) = pack2<F16>(acc[mt][n][2] * mul[mt][1], acc[mt][n][3] * mul[mt][1]);
        }
    __syncwarp();
    constexpr int CHUNKS = D / 8, ROWS_PER_PASS = 32 / CHUNKS;
#pragma unroll
    for (int pass = 0; pass < 16 * MT / ROWS_PER_PASS; ++pass) {
        const int r = pass * ROWS_PER_PASS + lane / CHUNKS, c = (lane % CHUNKS) * 8;
        if (row0 + r < rows) *(uint4*)(dst + (i64)(row0 + r) * row_stride + c) = *(const uint4*)(stage + r * (D + 8) + c);
    }
}

__device__ __forceinline__ int key_length(const i64* key_lens, int b, int S) {
    return key_lens ? (int)max((i64)0, min((i64)S, key_lens[b])) : S;
}

// Key tiles a block of queries q0 .. q0 + rows - 1 walks: up to the key length and, if causal,
// up to its last query.
__device__ __forceinline__ int key_tiles(int key_len, int causal, int q0, int rows, int L) {
    const int tiles = (key_len + FA_TILE - 1) / FA_TILE;
    return causal ? min(tiles, (min(L, q0 + rows) - 1) / FA_TILE + 1) : tiles;
}


// Forward: out and the log-sum-exp of every query's scores (f32 [B, H, L], natural log). A
// block of 4 warps takes 64 MT queries, 16 MT per warp held as register fragments, and walks
// the key tiles with K and V in two shared buffers each.
template <bool F16, int D, int MT>
__device__ __forceinline__ void flash_forward(const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk,
                                              const unsigned short* v, Bhtd sv, unsigned short* out, float* lse,
                                              int H, int L, int S, const i64* key_lens, float scale, int causal) {
    constexpr int BM = 64 * MT, TILE = FA_TILE * (D + 8);
    unsigned short* q_tile = dynamic_smem();
    unsigned short* k_tiles = q_tile + BM * (D + 8);
    unsigned short* v_tiles = k_tiles + 2 * TILE;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x >> 5;
    // The longest causal walks start first, so that the last wave of blocks is a short one.
    const int q_block = (gridDim.x - 1 - blockIdx.x) * BM, q_warp = q_block + warp * 16 * MT;
    q += b * sq.b + h * sq.h;
    k += b * sk.b + h * sk.h;
    v += b * sv.b + h * sv.h;
    const int key_len = key_length(key_lens, b, S);
    const int tiles = key_tiles(key_len, causal, q_block, BM, L);
    copy_rows<D, BM>(q_tile, q, sq.t, q_block, L);
    if (tiles > 0) {
        copy_rows<D, FA_TILE>(k_tiles, k, sk.t, 0, S);
        copy_rows<D, FA_TILE>(v_tiles, v, sv.t, 0, S);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    u32 qa[MT][D / 16][4];
    load_a<D, MT>(qa, q_tile, warp * 16 * MT);
    const u32 lane_a = lane_a_order(D + 8) * 2, lane_b = lane_b_order(D + 8) * 2;
    const float c = scale * LOG2E;
    float m[MT][2], l[MT][2], o[MT][D / 8][4];
    zero(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
    for (int kt = 0; kt < tiles; ++kt) {
        const int buf = kt & 1, key0 = kt * FA_TILE;
        if (kt > 0) {
            // Tile kt has landed for every thread, and every warp is done with tile kt - 1,
            // whose buffers the next copies overwrite.
            cp_async_wait_all();
            __syncthreads();
        }
        if (kt + 1 < tiles) {
            copy_rows<D, FA_TILE>(k_tiles + (buf ^ 1) * TILE, k, sk.t, key0 + FA_TILE, S);
            copy_rows<D, FA_TILE>(v_tiles + (buf ^ 1) * TILE, v, sv.t, key0 + FA_TILE, S);
            cp_async_commit();
        }
        // A warp whose queries all come before the tile's first key sees none of it.
        if (causal && key0 > q_warp + 16 * MT - 1) continue;
        float s[MT][8][4];
        rows_times_tile<F16, D, MT, 8>(s, qa, smem_u32(k_tiles + buf * TILE) + lane_b);
        if (key0 + FA_TILE > key_len || (causal && key0 + FA_TILE - 1 > q_warp))
            mask_scores<MT, 8>(s, q_warp, key0, key_len, causal);
        online_softmax<D, MT>(s, m, l, o, c);
        probs_times_tile<F16, D, MT, 8>(o, s, smem_u32(v_tiles + buf * TILE) + lane_a);
    }
    // A query that sees no key gets 0/0 = NaN, as in PyTorch, and a log-sum-exp of -inf.
    float inv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[mt][r] = quad_sum(l[mt][r]);
            inv[mt][r] = 1.f / l[mt][r];
        }
    out += ((i64)b * L * H + h) * D;
    store_rows<F16, D, MT>(out, (i64)H * D, q_warp, L, q_tile + warp * 16 * MT * (D + 8), o, inv);
    if (lane_t() == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = q_warp + mt * 16 + lane_g() + r * 8;
                if (i < L) lse[(i64)bh * L + i] = (m[mt][r] * c + log2f(l[mt][r])) / LOG2E;
            }
    }
}

// 128 queries per block where the registers hold them (D <= 64), else 64.
#define ATTENTION_V2_FORWARD(SUFFIX, F16, D, MT)                                                                   \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attention_v2_forward_##SUFFIX##_d##D(                \
        const unsigned short* q, Bhtd sq, const unsigned short* k, Bhtd sk, const unsigned short* v, Bhtd sv,      \
        unsigned short* out, float* lse, int H, int L, int S, const i64* key_lens, float scale, int causal) {       \
        flash_forward<F16, D, MT>(q, sq, k, sk, v, sv, out, lse, H, L, S, key_lens, scale, causal);                \
    }
ATTENTION_V2_FORWARD(bf16, false, 32, 2)
ATTENTION_V2_FORWARD(bf16, false, 64, 2)
ATTENTION_V2_FORWARD(bf16, false, 128, 1)
ATTENTION_V2_FORWARD(f16, true, 32, 2)
ATTENTION_V2_FORWARD(f16, true, 64, 2)
ATTENTION_V2_FORWARD(f16, true, 128, 1)
