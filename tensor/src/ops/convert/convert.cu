// Dtype conversion (with PyTorch's cast semantics, matching the CPU backend), strided copies
// and fills. Conversions go through double, which holds every f32/f16/bf16/u32/u8 value
// exactly; integer-to-integer casts below stay in integers so large i64 values keep every bit.

#define CONVERT(SN, ST, SL, DN, DT, DS)                                                          \
    extern "C" __global__ void convert_##SN##_##DN(Strided s, const ST* in, DT* out, i64 n) {    \
        FOR_EACH(i, n) { out[i] = DS(SL(in[strided_offset(s, i)])); }                           \
    }
#define CONVERT_FROM(SN, ST, SL)                                                                 \
    CONVERT(SN, ST, SL, f32, float, STORE_F32)                                                   \
    CONVERT(SN, ST, SL, f64, double, STORE_F64)                                                  \
    CONVERT(SN, ST, SL, bf16, bf16_t, STORE_BF16)                                                \
    CONVERT(SN, ST, SL, f16, f16_t, STORE_F16)                                                   \
    CONVERT(SN, ST, SL, i64, i64, STORE_I64)                                                     \
    CONVERT(SN, ST, SL, u32, u32, STORE_U32)                                                     \
    CONVERT(SN, ST, SL, u8, u8, STORE_U8)                                                        \
    CONVERT(SN, ST, SL, bool, u8, STORE_BOOL)
// Integer sources to integer targets: plain truncation of the two's-complement bits.
#define INT_CAST(SN, ST, DN, DT)                                                                 \
    extern "C" __global__ void convert_##SN##_##DN(Strided s, const ST* in, DT* out, i64 n) {    \
        FOR_EACH(i, n) { out[i] = (DT)(i64)in[strided_offset(s, i)]; }                           \
    }
// Integers to f32 and the half types round once, to f32 first (as the CPU backend).
#define LOAD_INT_F32(x) ((float)(i64)(x))
#define CONVERT_FROM_INT(SN, ST, SL)                                                             \
    CONVERT(SN, ST, LOAD_INT_F32, f32, float, STORE_F32)                                         \
    CONVERT(SN, ST, SL, f64, double, STORE_F64)                                                  \
    CONVERT(SN, ST, LOAD_INT_F32, bf16, bf16_t, STORE_BF16)                                      \
    CONVERT(SN, ST, LOAD_INT_F32, f16, f16_t, STORE_F16)                                         \
    INT_CAST(SN, ST, i64, i64)                                                                   \
    INT_CAST(SN, ST, u32, u32)                                                                   \
    INT_CAST(SN, ST, u8, u8)                                                                     \
    CONVERT(SN, ST, SL, bool, u8, STORE_BOOL)
CONVERT_FROM(f32, float, LOAD_F32)
CONVERT_FROM(f64, double, LOAD_F64)
CONVERT_FROM(bf16, bf16_t, LOAD_BF16)
CONVERT_FROM(f16, f16_t, LOAD_F16)
CONVERT_FROM_INT(i64, i64, LOAD_I64)
CONVERT_FROM_INT(u32, u32, LOAD_U32)
CONVERT_FROM_INT(u8, u8, LOAD_U8)
CONVERT_FROM(bool, u8, LOAD_BOOL)

// A strided view gathered into contiguous memory; by element size, whatever the dtype.
#define COPY(BITS, T)                                                                            \
    extern "C" __global__ void copy_b##BITS(Strided s, const T* in, T* out, i64 n) {             \
        FOR_EACH(i, n) { out[i] = in[strided_offset(s, i)]; }                                    \
    }                                                                                            \
    extern "C" __global__ void fill_b##BITS(T value, T* out, i64 n) {                            \
        FOR_EACH(i, n) { out[i] = value; }                                                       \
    }
COPY(8, u8)
COPY(16, unsigned short)
COPY(32, u32)
COPY(64, unsigned long long)

// Float-to-float conversions of contiguous data, four elements a thread (16-byte loads from
// f32, 8-byte ones from the half types): the casts of autocast, which move the most bytes.
template <typename T> struct alignas(4 * sizeof(T)) Pack4 { T v[4]; };
#define CONVERT_VEC(SN, ST, SL, DN, DT, DS)                                                      \
    extern "C" __global__ void convert_vec_##SN##_##DN(const ST* in, DT* out, i64 n) {           \
        const i64 nv = n / 4;                                                                    \
        FOR_EACH(i, nv) {                                                                        \
            const Pack4<ST> a = ((const Pack4<ST>*)in)[i];                                       \
            Pack4<DT> r;                                                                         \
            _Pragma("unroll") for (int j = 0; j < 4; ++j) r.v[j] = DS(SL(a.v[j]));               \
            ((Pack4<DT>*)out)[i] = r;                                                            \
        }                                                                                        \
        FOR_EACH(k, n - nv * 4) {                                                                \
            const i64 i = nv * 4 + k;                                                            \
            out[i] = DS(SL(in[i]));                                                              \
        }                                                                                        \
    }
#define CONVERT_VEC_FROM(SN, ST, SL)                                                             \
    CONVERT_VEC(SN, ST, SL, f32, float, STORE_F32)                                               \
    CONVERT_VEC(SN, ST, SL, f64, double, STORE_F64)                                              \
    CONVERT_VEC(SN, ST, SL, bf16, bf16_t, STORE_BF16)                                            \
    CONVERT_VEC(SN, ST, SL, f16, f16_t, STORE_F16)
CONVERT_VEC_FROM(f32, float, LOAD_F32)
CONVERT_VEC_FROM(f64, double, LOAD_F64)
CONVERT_VEC_FROM(bf16, bf16_t, LOAD_BF16)
CONVERT_VEC_FROM(f16, f16_t, LOAD_F16)
