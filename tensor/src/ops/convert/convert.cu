// Dtype conversion (with PyTorch's cast semantics, matching the CPU backend), strided copies
// and fills. Conversions go through double, which holds every f32/f16/bf16/u32/u8 value exactly.

#define LOAD_F32(x) ((double)(x))
#define LOAD_F64(x) ((double)(x))
#define LOAD_BF16(x) ((double)bf16_to_f32(x))
#define LOAD_F16(x) ((double)f16_to_f32(x))
#define LOAD_I64(x) ((double)(x))
#define LOAD_U32(x) ((double)(x))
#define LOAD_U8(x) ((double)(x))
#define LOAD_BOOL(x) ((x) ? 1.0 : 0.0)

// Float to integer truncates toward zero and saturates (NaN gives 0), like Rust's `as`.
__device__ __forceinline__ double sat(double d, double lo, double hi) {
    if (d != d) return 0.0;
    d = trunc(d);
    return d < lo ? lo : (d > hi ? hi : d);
}
#define STORE_F32(d) ((float)(d))
#define STORE_F64(d) (d)
#define STORE_BF16(d) f32_to_bf16((float)(d))
#define STORE_F16(d) f32_to_f16((float)(d))
#define STORE_I64(d) ((i64)sat(d, -9223372036854775808.0, 9223372036854775807.0))
#define STORE_U32(d) ((u32)sat(d, 0.0, 4294967295.0))
#define STORE_U8(d) ((u8)sat(d, 0.0, 255.0))
#define STORE_BOOL(d) ((u8)((d) != 0.0))

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
CONVERT_FROM(f32, float, LOAD_F32)
CONVERT_FROM(f64, double, LOAD_F64)
CONVERT_FROM(bf16, bf16_t, LOAD_BF16)
CONVERT_FROM(f16, f16_t, LOAD_F16)
CONVERT_FROM(i64, i64, LOAD_I64)
CONVERT_FROM(u32, u32, LOAD_U32)
CONVERT_FROM(u8, u8, LOAD_U8)
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
