// Fused optimizer steps over contiguous f32 parameters and state; the gradient is f32, bf16
// or f16 (one kernel per gradient dtype) and is read as f32. Same formulas and operation order
// as the CPU kernels in cpu.rs (PyTorch's single-tensor SGD and AdamW).

__device__ __forceinline__ float grad_f32(const float* g, i64 i) { return g[i]; }
__device__ __forceinline__ float grad_bf16(const bf16_t* g, i64 i) { return bf16_to_f32(g[i]); }
__device__ __forceinline__ float grad_f16(const f16_t* g, i64 i) { return f16_to_f32(g[i]); }

#define OPTIM_KERNELS(SUF, G)                                                                      \
    extern "C" __global__ void sgd_step_##SUF(float* p, const G* g, float* buf, i64 n, float lr,  \
                                               float momentum, float keep, float weight_decay,    \
                                               int nesterov, int maximize, int has_buf,           \
                                               int first) {                                       \
        FOR_EACH(i, n) {                                                                          \
            float d = grad_##SUF(g, i);                                                           \
            if (maximize) d = -d;                                                                 \
            float pi = p[i];                                                                      \
            if (weight_decay != 0.0f) d = d + weight_decay * pi;                                  \
            if (has_buf) {                                                                        \
                float b = first ? d : momentum * buf[i] + keep * d;                               \
                buf[i] = b;                                                                       \
                d = nesterov ? d + momentum * b : b;                                              \
            }                                                                                     \
            p[i] = pi - lr * d;                                                                   \
        }                                                                                         \
    }                                                                                             \
    extern "C" __global__ void adamw_step_##SUF(float* p, const G* g, float* m, float* v,         \
                                                 float* vmax, i64 n, float decay,                 \
                                                 float one_minus_beta1, float beta2,              \
                                                 float one_minus_beta2, float step_size,          \
                                                 float bc2_sqrt, float eps, int maximize) {       \
        FOR_EACH(i, n) {                                                                          \
            float gi = grad_##SUF(g, i);                                                          \
            if (maximize) gi = -gi;                                                               \
            float pi = p[i] * decay;                                                              \
            float mi = m[i] + one_minus_beta1 * (gi - m[i]);                                      \
            float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;                                  \
            m[i] = mi;                                                                            \
            v[i] = vi;                                                                            \
            float second = vi;                                                                    \
            if (vmax) {                                                                           \
                float old = vmax[i];                                                              \
                second = (vi != vi || vi > old) ? vi : old;                                       \
                vmax[i] = second;                                                                 \
            }                                                                                     \
            float denom = sqrtf(second) / bc2_sqrt + eps;                                         \
            p[i] = pi + (-step_size) * (mi / denom);                                              \
        }                                                                                         \
    }

OPTIM_KERNELS(f32, float)
OPTIM_KERNELS(bf16, bf16_t)
OPTIM_KERNELS(f16, f16_t)
