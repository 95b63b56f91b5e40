// Fused optimizer steps over contiguous f32 parameters and state; the gradient is f32, bf16
// or f16 (one kernel per gradient dtype) and is read as f32. Same formulas and operation order
// as the CPU kernels in cpu.rs (PyTorch's single-tensor SGD and AdamW). The per-tensor kernels
// and the multi-tensor ones call the same element updates, written with explicitly rounded
// operations: left to itself the compiler contracts a product and a sum into one fused
// multiply-add in one inlined copy and not in another, and the two kernels then differed in
// the last bit (seen on the H200).

__device__ __forceinline__ float grad_f32(const float* g, i64 i) { return g[i]; }
__device__ __forceinline__ float grad_bf16(const bf16_t* g, i64 i) { return bf16_to_f32(g[i]); }
__device__ __forceinline__ float grad_f16(const f16_t* g, i64 i) { return f16_to_f32(g[i]); }

// One SGD update of element i from its gradient d and value pi; returns the new value.
__device__ __forceinline__ float sgd_update(float d, float pi, float* buf, i64 i, float lr,
                                            float momentum, float keep, float weight_decay,
                                            int nesterov, int maximize, int has_buf, int first) {
    if (maximize) d = -d;
    if (weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(weight_decay, pi));
    if (has_buf) {
        float b = first ? d : __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(keep, d));
        buf[i] = b;
        d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
    }
    return __fsub_rn(pi, __fmul_rn(lr, d));
}

// One AdamW update of element i from its gradient gi and value p_i (moments updated in place);
// returns the new value.
__device__ __forceinline__ float adamw_update(float gi, float p_i, float* m, float* v,
                                              float* vmax, i64 i, float decay,
                                              float one_minus_beta1, float beta2,
                                              float one_minus_beta2, float step_size,
                                              float bc2_sqrt, float eps, int maximize) {
    if (maximize) gi = -gi;
    float pi = __fmul_rn(p_i, decay);
    float mi = __fadd_rn(m[i], __fmul_rn(one_minus_beta1, __fsub_rn(gi, m[i])));
    float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    float second = vi;
    if (vmax) {
        float old = vmax[i];
        second = (vi != vi || vi > old) ? vi : old;
        vmax[i] = second;
    }
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(second), bc2_sqrt), eps);
    return __fadd_rn(pi, __fmul_rn(-step_size, __fdiv_rn(mi, denom)));
}

#define OPTIM_KERNELS(SUF, G)                                                                      \
    extern "C" __global__ void sgd_step_##SUF(float* p, const G* g, float* buf, i64 n, float lr,  \
                                               float momentum, float keep, float weight_decay,    \
                                               int nesterov, int maximize, int has_buf,           \
                                               int first) {                                       \
        FOR_EACH(i, n) {                                                                          \
            p[i] = sgd_update(grad_##SUF(g, i), p[i], buf, i, lr, momentum, keep, weight_decay,   \
                              nesterov, maximize, has_buf, first);                                \
        }                                                                                         \
    }                                                                                             \
    extern "C" __global__ void adamw_step_##SUF(float* p, const G* g, float* m, float* v,         \
                                                 float* vmax, i64 n, float decay,                 \
                                                 float one_minus_beta1, float beta2,              \
                                                 float one_minus_beta2, float step_size,          \
                                                 float bc2_sqrt, float eps, int maximize) {       \
        FOR_EACH(i, n) {                                                                          \
            p[i] = adamw_update(grad_##SUF(g, i), p[i], m, v, vmax, i, decay, one_minus_beta1,    \
                                beta2, one_minus_beta2, step_size, bc2_sqrt, eps, maximize);      \
        }                                                                                         \
    }

OPTIM_KERNELS(f32, float)
OPTIM_KERNELS(bf16, bf16_t)
OPTIM_KERNELS(f16, f16_t)

// Multi-tensor steps: one launch over a list of parameters. The host uploads the list once
// (`MtTensor` per parameter, `MtChunk` per block) and reuses it while the parameters and their
// state keep their memory; the gradients, which move from step to step, come by value in the
// launch's arguments. Block b updates elements [start, start + chunk) of one tensor.
#define MT_MAX_TENSORS 320

struct MtTensor {
    float* p;
    float* s0;       // SGD: momentum buffer (null without momentum); AdamW: exp_avg
    float* s1;       // AdamW: exp_avg_sq
    float* s2;       // AdamW: max_exp_avg_sq (null without AMSGrad)
    void* shadow;    // a kept cast of p, rewritten with it (null when none)
    i64 n;
    int shadow_kind; // 1 bf16, 2 f16, 3 f64
    int pad;
};

struct MtChunk {
    int tensor;      // index into the launch's tensors and gradients
    int pad;
    i64 start;
};

struct MtGrads {
    const void* g[MT_MAX_TENSORS];
};

// The kept cast of element i: the same conversions as convert.cu's casts from f32.
__device__ __forceinline__ void store_shadow(void* s, int kind, i64 i, float x) {
    if (kind == 1) {
        ((bf16_t*)s)[i] = f32_to_bf16(x);
    } else if (kind == 2) {
        ((f16_t*)s)[i] = f32_to_f16(x);
    } else if (kind == 3) {
        ((double*)s)[i] = (double)x;
    }
}

#define MULTI_KERNELS(SUF, G)                                                                      \
    extern "C" __global__ void sgd_multi_##SUF(MtGrads grads, const MtTensor* tensors,            \
                                                const MtChunk* chunks, i64 chunk, float lr,        \
                                                float momentum, float keep, float weight_decay,    \
                                                int nesterov, int maximize, int has_buf,           \
                                                int first) {                                       \
        const MtChunk c = chunks[blockIdx.x];                                                      \
        const MtTensor t = tensors[c.tensor];                                                      \
        const G* g = (const G*)grads.g[c.tensor];                                                  \
        const i64 end = c.start + chunk < t.n ? c.start + chunk : t.n;                             \
        for (i64 i = c.start + threadIdx.x; i < end; i += blockDim.x) {                            \
            const float x = sgd_update(grad_##SUF(g, i), t.p[i], t.s0, i, lr, momentum, keep,      \
                                       weight_decay, nesterov, maximize, has_buf, first);          \
            t.p[i] = x;                                                                            \
            store_shadow(t.shadow, t.shadow_kind, i, x);                                           \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void adamw_multi_##SUF(MtGrads grads, const MtTensor* tensors,          \
                                                  const MtChunk* chunks, i64 chunk, float decay,   \
                                                  float one_minus_beta1, float beta2,              \
                                                  float one_minus_beta2, float step_size,          \
                                                  float bc2_sqrt, float eps, int maximize) {       \
        const MtChunk c = chunks[blockIdx.x];                                                      \
        const MtTensor t = tensors[c.tensor];                                                      \
        const G* g = (const G*)grads.g[c.tensor];                                                  \
        const i64 end = c.start + chunk < t.n ? c.start + chunk : t.n;                             \
        for (i64 i = c.start + threadIdx.x; i < end; i += blockDim.x) {                            \
            const float x = adamw_update(grad_##SUF(g, i), t.p[i], t.s0, t.s1, t.s2, i, decay,     \
                                         one_minus_beta1, beta2, one_minus_beta2, step_size,       \
                                         bc2_sqrt, eps, maximize);                                 \
            t.p[i] = x;                                                                            \
            store_shadow(t.shadow, t.shadow_kind, i, x);                                           \
        }                                                                                          \
    }

MULTI_KERNELS(f32, float)
MULTI_KERNELS(bf16, bf16_t)
MULTI_KERNELS(f16, f16_t)

// Batch norm's running statistics in one launch, with the roundings of the composed f32 ops it
// replaces (each scalar product an affine kernel's fused multiply-add with a zero addend, then
// one rounded add): running = running * keep + batch * factor, the variance's batch value
// first scaled by `unbiased`; `count` (the i64 batch counter, or null) gains one.
extern "C" __global__ void running_stats_update(float* rmean, float* rvar, const float* mean,
                                                const float* var, i64* count, i64 n, float keep,
                                                float factor, float unbiased) {
    if (count && blockIdx.x == 0 && threadIdx.x == 0) *count += 1;
    FOR_EACH(c, n) {
        rmean[c] = __fadd_rn(__fmaf_rn(rmean[c], keep, 0.0f), __fmaf_rn(mean[c], factor, 0.0f));
        const float uv = __fmaf_rn(var[c], unbiased, 0.0f);
        rvar[c] = __fadd_rn(__fmaf_rn(rvar[c], keep, 0.0f), __fmaf_rn(uv, factor, 0.0f));
    }
}
