// Indexing kernels: one gather kernel serves index_select, embedding and gather; scatter_add
// and index_add sum each output element's contributions in one thread, in index order (the
// host sorts the contributions by target), so results are deterministic and equal the CPU's.
// Embedding's backward sorts the ids on the device instead (a stable radix sort), so a training
// step never waits for the host.

// Where a kernel records the first bad index it meets (`ErrorRecordArg` in host_waits.rs): a
// claim flag in device memory and four words in mapped host memory, the check number last.
struct ErrorRecord {
    unsigned int* claimed;
    unsigned long long* words;
};
#define CHECK_GATHER_INDEX 1ull
#define CHECK_EMBEDDING_ID 2ull
__device__ __noinline__ void report_bad_index(ErrorRecord e, unsigned long long check, i64 value, i64 bound) {
    if (atomicCAS(e.claimed, 0u, 1u) == 0u) {
        e.words[1] = (unsigned long long)value;
        e.words[2] = (unsigned long long)bound;
        __threadfence_system();
        e.words[0] = check;
    }
}

// out[i] = src[view(i) + ids[ids_view(i)] * dim_stride]: both views have the output's shape,
// `view` with stride 0 along the indexed dim. Element types by size, any index dtype. An id
// outside 0..bound is reported and its element set to zero bits.
#define GATHER(BITS, T, IN, I)                                                                   \
    extern "C" __global__ void gather_b##BITS##_##IN(Strided view, const T* src, i64 dim_stride, \
                                                       Strided ids_view, const I* ids, T* out,    \
                                                       i64 n, i64 bound, ErrorRecord err) {       \
        FOR_EACH(i, n) {                                                                          \
            i64 id = (i64)ids[strided_offset(ids_view, i)];                                       \
            if (id < 0 || id >= bound) {                                                          \
                report_bad_index(err, CHECK_GATHER_INDEX, id, bound);                             \
                out[i] = 0;                                                                       \
                continue;                                                                         \
            }                                                                                     \
            out[i] = src[strided_offset(view, i) + id * dim_stride];                              \
        }                                                                                         \
    }
#define GATHER_BY_INDEX(BITS, T) GATHER(BITS, T, i64, i64) GATHER(BITS, T, u32, u32)
GATHER_BY_INDEX(8, u8)
GATHER_BY_INDEX(16, unsigned short)
GATHER_BY_INDEX(32, u32)
GATHER_BY_INDEX(64, unsigned long long)

// `acc + alpha * x` rounded as the CPU backend does: one product and one sum, each rounded
// (no fused multiply-add), f16/bf16 in f32 and rounded back after every addition; integers
// wrap (unsigned arithmetic, so no signed overflow).
#define ADD_F32(acc, x, a) __fadd_rn((acc), __fmul_rn((a), (x)))
#define ADD_F64(acc, x, a) __dadd_rn((acc), __dmul_rn((a), (x)))
#define ADD_BF16(acc, x, a) f32_to_bf16(__fadd_rn(bf16_to_f32(acc), __fmul_rn((a), bf16_to_f32(x))))
#define ADD_F16(acc, x, a) f32_to_f16(__fadd_rn(f16_to_f32(acc), __fmul_rn((a), f16_to_f32(x))))
#define ADD_I64(acc, x, a) \
    ((i64)((unsigned long long)(acc) + (unsigned long long)(x) * (unsigned long long)(a)))
#define ADD_U32(acc, x, a) ((u32)((u32)(acc) + (u32)(x) * (u32)(a)))
#define ADD_U8(acc, x, a) ((u8)((u32)(acc) + (u32)(x) * (u32)(u8)(a)))

// Group g adds src[src_view(perm[k])] for k in starts[g]..starts[g+1] into out[targets[g]];
// `out` already holds a copy of self. Groups have distinct targets, so no two threads meet.
#define SCATTER_ADD(N, T, A, ADD, ONE)                                                           \
    extern "C" __global__ void scatter_add_##N(Strided src_view, const T* src, const i64* perm,  \
                                                 const i64* starts, const i64* targets,           \
                                                 i64 groups, T* out) {                            \
        const A one = ONE;                                                                        \
        FOR_EACH(g, groups) {                                                                     \
            i64 t = targets[g];                                                                   \
            T acc = out[t];                                                                       \
            for (i64 k = starts[g]; k < starts[g + 1]; ++k) {                                     \
                acc = ADD(acc, src[strided_offset(src_view, perm[k])], one);                      \
            }                                                                                     \
            out[t] = acc;                                                                         \
        }                                                                                         \
    }

// Output element i = (outer, j, inner) of a contiguous [outer, dim_size, inner] result:
// self's element plus alpha times source rows perm[starts[j]..starts[j+1]] (index order).
// `src_view` has the output's shape with stride 0 along dim.
#define INDEX_ADD(N, T, A, ADD)                                                                  \
    extern "C" __global__ void index_add_##N(Strided dst_view, const T* dst, Strided src_view,   \
                                               const T* src, i64 src_dim_stride, const i64* perm, \
                                               const i64* starts, i64 dim_size, i64 inner,        \
                                               A alpha, T* out, i64 n) {                          \
        FOR_EACH(i, n) {                                                                          \
            i64 j = (i / inner) % dim_size;                                                       \
            i64 base = strided_offset(src_view, i);                                               \
            T acc = dst[strided_offset(dst_view, i)];                                             \
            for (i64 k = starts[j]; k < starts[j + 1]; ++k) {                                     \
                acc = ADD(acc, src[base + perm[k] * src_dim_stride], alpha);                      \
            }                                                                                     \
            out[i] = acc;                                                                         \
        }                                                                                         \
    }

#define ACCUMULATING(N, T, A, ADD, ONE) SCATTER_ADD(N, T, A, ADD, ONE) INDEX_ADD(N, T, A, ADD)
ACCUMULATING(f32, float, float, ADD_F32, 1.0f)
ACCUMULATING(f64, double, double, ADD_F64, 1.0)
ACCUMULATING(bf16, bf16_t, float, ADD_BF16, 1.0f)
ACCUMULATING(f16, f16_t, float, ADD_F16, 1.0f)
ACCUMULATING(i64, i64, i64, ADD_I64, 1)
ACCUMULATING(u32, u32, i64, ADD_U32, 1)
ACCUMULATING(u8, u8, i64, ADD_U8, 1)

// out[r * classes + c] = (ids[r] == c), int64; every element written, so no memset first.
#define ONE_HOT(IN, I)                                                                           \
    extern "C" __global__ void one_hot_##IN(Strided ids_view, const I* ids, i64 classes,         \
                                              i64* out, i64 n) {                                  \
        FOR_EACH(i, n) {                                                                          \
            i64 r = i / classes;                                                                  \
            out[i] = ((i64)ids[strided_offset(ids_view, r)] == i - r * classes) ? 1 : 0;          \
        }                                                                                         \
    }
ONE_HOT(i64, i64)
ONE_HOT(u32, u32)

// --- Embedding backward without the host: the ids sorted by a stable LSD radix sort (8-bit
// digits) of (id, position) pairs, then each run of equal ids summed in position order, which
// is the order the CPU adds them in, so the result has the same bits.

#define SORT_TILE 2048
#define RADIX 256

// keys[i] = the i-th id, or `num` (sorted last and skipped) for an id outside 0..num, which is
// reported; pos[i] = i.
#define EMBEDDING_KEYS(IN, I)                                                                    \
    extern "C" __global__ void embedding_keys_##IN(Strided ids_view, const I* ids, i64 n, i64 num, \
                                                   u32* keys, u32* pos, ErrorRecord err) {        \
        FOR_EACH(i, n) {                                                                          \
            i64 id = (i64)ids[strided_offset(ids_view, i)];                                       \
            if (id < 0 || id >= num) {                                                            \
                report_bad_index(err, CHECK_EMBEDDING_ID, id, num);                               \
                id = num;                                                                         \
            }                                                                                     \
            keys[i] = (u32)id;                                                                    \
            pos[i] = (u32)i;                                                                      \
        }                                                                                         \
    }
EMBEDDING_KEYS(i64, i64)
EMBEDDING_KEYS(u32, u32)

// One block of RADIX threads per tile of SORT_TILE keys; the tile's keys in shared memory.
__device__ __forceinline__ u32 load_tile(u32* tile, const u32* keys, u32 n) {
    const u32 t0 = blockIdx.x * SORT_TILE;
    const u32 len = min((u32)SORT_TILE, n - t0);
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) tile[i] = keys[t0 + i];
    __syncthreads();
    return len;
}

// counts[d * tiles + b] = how many keys of tile b have digit d. Thread d counts digit d
// (every thread reads the same key at once: a shared-memory broadcast).
extern "C" __global__ void radix_count(const u32* keys, u32 n, int shift, u32* counts, u32 tiles) {
    __shared__ u32 tile[SORT_TILE];
    const u32 len = load_tile(tile, keys, n);
    const u32 d = threadIdx.x;
    u32 c = 0;
    for (u32 i = 0; i < len; ++i) c += ((tile[i] >> shift) & (RADIX - 1)) == d;
    counts[d * tiles + blockIdx.x] = c;
}

// In-place exclusive prefix sum of counts[0..len], by one block: each thread sums a
// contiguous chunk, thread 0 scans the chunk sums, each thread then writes its chunk's prefixes.
extern "C" __global__ void radix_scan(u32* counts, u32 len) {
    __shared__ u32 sums[1024];
    const u32 per = (len + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(len, threadIdx.x * per), hi = min(len, lo + per);
    u32 s = 0;
    for (u32 i = lo; i < hi; ++i) s += counts[i];
    sums[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 run = 0;
        for (u32 k = 0; k < blockDim.x; ++k) {
            const u32 v = sums[k];
            sums[k] = run;
            run += v;
        }
    }
    __syncthreads();
    u32 run = sums[threadIdx.x];
    for (u32 i = lo; i < hi; ++i) {
        const u32 v = counts[i];
        counts[i] = run;
        run += v;
    }
}

// Moves tile b's pairs to their sorted places: thread d walks the tile in order and places the
// keys of digit d from offsets[d * tiles + b] on, so equal digits keep their order (stable).
extern "C" __global__ void radix_scatter(const u32* keys, const u32* vals, u32 n, int shift,
                                         const u32* offsets, u32 tiles, u32* keys_out, u32* vals_out) {
    __shared__ u32 tile[SORT_TILE];
    const u32 len = load_tile(tile, keys, n);
    const u32 d = threadIdx.x, t0 = blockIdx.x * SORT_TILE;
    u32 at = offsets[d * tiles + blockIdx.x];
    for (u32 i = 0; i < len; ++i) {
        const u32 k = tile[i];
        if (((k >> shift) & (RADIX - 1)) == d) {
            keys_out[at] = k;
            vals_out[at] = vals[t0 + i];
            ++at;
        }
    }
}

// out[id][c] = the sum, in position order, of grad[p][c] over the positions p whose id it is.
// Thread (s, c) works only where sorted position s starts a run of equal keys; `out` was
// zeroed, so ids that never occur keep zero rows. `grad` is [n, dim] contiguous.
#define EMBEDDING_SUM(N, T, A, ADD, ONE)                                                         \
    extern "C" __global__ void embedding_backward_##N(const u32* keys, const u32* pos, i64 n,    \
                                                      u32 num, const T* grad, i64 dim, T* out) {  \
        const A one = ONE;                                                                        \
        FOR_EACH(i, n * dim) {                                                                    \
            const i64 s = fast_div(i, dim), c = i - s * dim;                                      \
            const u32 k = keys[s];                                                                \
            if (k >= num || (s > 0 && keys[s - 1] == k)) continue;                                \
            T acc = 0;                                                                            \
            for (i64 j = s; j < n && keys[j] == k; ++j) acc = ADD(acc, grad[(i64)pos[j] * dim + c], one); \
            out[(i64)k * dim + c] = acc;                                                          \
        }                                                                                         \
    }
EMBEDDING_SUM(f32, float, float, ADD_F32, 1.0f)
EMBEDDING_SUM(f64, double, double, ADD_F64, 1.0)
EMBEDDING_SUM(bf16, bf16_t, float, ADD_BF16, 1.0f)
EMBEDDING_SUM(f16, f16_t, float, ADD_F16, 1.0f)
