// Ranges and identity matrices generated on the device. Each element is computed in double
// exactly as the CPU backend computes it (`ops/creation/mod.rs`), then stored with the same
// cast rules as the CPU's `Element::from_f64` (the STORE_* macros of `cuda/common.cuh`).
// The arithmetic uses __dmul_rn / __dadd_rn because NVRTC runs with --fmad=true, and a fused
// multiply-add would round once where the CPU rounds twice.

#define CREATION(SN, T, STORE)                                                                   \
    extern "C" __global__ void arange_##SN(double start, double step, T* out, i64 n) {           \
        FOR_EACH(i, n) { out[i] = STORE(__dadd_rn(start, __dmul_rn((double)i, step))); }         \
    }                                                                                            \
    /* Filled from both ends, as the CPU (and PyTorch) does, so the last value is `end`. */      \
    extern "C" __global__ void linspace_##SN(double start, double end, double step, i64 half,    \
                                             T* out, i64 n) {                                    \
        FOR_EACH(i, n) {                                                                         \
            double v = (i < half || n == 1) ? __dadd_rn(start, __dmul_rn(step, (double)i))       \
                                            : __dsub_rn(end, __dmul_rn(step, (double)(n - 1 - i))); \
            out[i] = STORE(v);                                                                   \
        }                                                                                        \
    }                                                                                            \
    extern "C" __global__ void eye_##SN(i64 rows, T* out, i64 n) {                               \
        FOR_EACH(i, n) { out[i] = STORE((i / rows == i % rows) ? 1.0 : 0.0); }                   \
    }
CREATION(f32, float, STORE_F32)
CREATION(f64, double, STORE_F64)
CREATION(bf16, bf16_t, STORE_BF16)
CREATION(f16, f16_t, STORE_F16)
CREATION(i64, i64, STORE_I64)
CREATION(u32, u32, STORE_U32)
CREATION(u8, u8, STORE_U8)
CREATION(bool, u8, STORE_BOOL)
