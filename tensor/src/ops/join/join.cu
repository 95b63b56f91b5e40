// cat: each part's strided view copied into its stretch of every output row. The output is
// `outer` rows of `row_len` elements; a part fills `part_row` of them from column `at` on.
// By element size, whatever the dtype.
#define CAT(BITS, T)                                                                             \
    extern "C" __global__ void cat_b##BITS(Strided s, const T* in, T* out, i64 n, i64 part_row, \
                                             i64 row_len, i64 at) {                               \
        FOR_EACH(i, n) {                                                                          \
            i64 o = i / part_row;                                                                 \
            out[o * row_len + at + (i - o * part_row)] = in[strided_offset(s, i)];                \
        }                                                                                         \
    }
CAT(8, u8)
CAT(16, unsigned short)
CAT(32, u32)
CAT(64, unsigned long long)
