// Indexing kernels: one gather kernel serves index_select, embedding and gather; scatter_add
// and index_add sum each output element's contributions in one thread, in index order (the
// host sorts the contributions by target), so results are deterministic and equal the CPU's.

// out[i] = src[view(i) + ids[ids_view(i)] * dim_stride]: both views have the output's shape,
// `view` with stride 0 along the indexed dim. Element types by size, any index dtype.
#define GATHER(BITS, T, IN, I)                                                                   \
    extern "C" __global__ void gather_b##BITS##_##IN(Strided view, const T* src, i64 dim_stride, \
                                                       Strided ids_view, const I* ids, T* out,    \
                                                       i64 n) {                                   \
        FOR_EACH(i, n) {                                                                          \
            i64 id = (i64)ids[strided_offset(ids_view, i)];                                       \
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
