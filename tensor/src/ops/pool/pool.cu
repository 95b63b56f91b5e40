// Pooling kernels over [N, C, H, W] planes. The windows of each output row and column are
// recomputed here with the formulas of `max_windows`, `avg_windows` and `adaptive_windows` in
// mod.rs (an `AxisRule` per axis), so no table travels to the device. f16/bf16 compute in f32.

// One axis's window rule (`CudaAxis` in cuda.rs). kind: 0 max sliding, 1 avg sliding, 2 adaptive.
struct PoolAxis {
    int kind;
    int count_include_pad;
    i64 input, output, kernel, stride, padding, dilation;
};

// Where a plane's elements sit: element (h, w) of plane p is at
// offset + (p / channels) * s0 + (p % channels) * s1 + h * s2 + w * s3 (`Planes` in cpu.rs).
struct PlaneLayout {
    i64 offset, s0, s1, s2, s3, channels;
};

struct Win {
    i64 start, end, step, count;
};

__device__ __forceinline__ i64 pmin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 pmax(i64 a, i64 b) { return a > b ? a : b; }

__device__ __forceinline__ i64 plane_base(const PlaneLayout& l, i64 p) {
    const i64 q = fast_div(p, l.channels);
    return l.offset + q * l.s0 + (p - q * l.channels) * l.s1;
}

// The window of output position `o` along axis `a`, exactly as mod.rs builds it.
__device__ Win pool_window(const PoolAxis& a, i64 o) {
    Win w;
    if (a.kind == 0) {
        const i64 first = o * a.stride - a.padding;
        const i64 end = pmin(first + (a.kernel - 1) * a.dilation + 1, a.input);
        const i64 skipped = first < 0 ? fast_div(-first + a.dilation - 1, a.dilation) : 0;
        w.start = first + skipped * a.dilation;
        w.end = pmax(end, 0);
        w.step = a.dilation;
        w.count = 0;
    } else if (a.kind == 1) {
        const i64 first = o * a.stride - a.padding;
        const i64 last = pmin(first + a.kernel, a.input + a.padding);
        const i64 start = pmax(first, 0), end = pmin(last, a.input);
        w.count = a.count_include_pad ? last - first : pmax(end - start, 0);
        w.start = start;
        w.end = pmax(end, start);
        w.step = 1;
    } else {
        w.start = fast_div(o * a.input, a.output);
        w.end = fast_div((o + 1) * a.input + a.output - 1, a.output);
        w.step = 1;
        w.count = w.end - w.start;
    }
    return w;
}

// A range of output positions that contains every window covering input position `pos` (the
// caller checks each candidate's window, so a superset is enough).
__device__ void covering_outputs(const PoolAxis& a, i64 pos, i64* lo, i64* hi) {
    if (a.kind == 2) {
        *lo = fast_div(pos * a.output, a.input) - 1;
        *hi = fast_div((pos + 1) * a.output + a.input - 1, a.input);
    } else {
        // Window o starts at o * stride - padding and spans `span` positions.
        const i64 span = a.kind == 0 ? (a.kernel - 1) * a.dilation + 1 : a.kernel;
        const i64 from = pos + a.padding - span;
        *lo = from < 0 ? 0 : fast_div(from, a.stride);
        *hi = fast_div(pos + a.padding, a.stride);
    }
    *lo = pmax(*lo, 0);
    *hi = pmin(*hi, a.output - 1);
}

#define ID(x) (x)
#define POOL(SUFFIX, T, C, LOAD, STORE)                                                          \
    /* Max and its flat index into the H*W plane; NaN wins, a later NaN over an earlier one. */  \
    /* nhwc: thread i is output element (n, r, c, channel) of a channels-last result.          */ \
    extern "C" __global__ void max_pool_##SUFFIX(PoolAxis rows, PoolAxis cols, PlaneLayout lx,   \
                                                 const T* x, T* out, i64* idx, i64 n, int nhwc) { \
        const i64 oh = rows.output, ow = cols.output, width = cols.input;                        \
        FOR_EACH(i, n) {                                                                         \
            i64 p, r, c;                                                                         \
            if (nhwc) {                                                                          \
                const i64 ch = lx.channels, t = fast_div(i, ch), tr = fast_div(t, ow);           \
                c = t - tr * ow;                                                                 \
                r = fast_mod(tr, oh);                                                            \
                p = fast_div(tr, oh) * ch + (i - t * ch);                                        \
            } else {                                                                             \
                p = fast_div(i, oh * ow);                                                        \
                const i64 rc = i - p * (oh * ow);                                                \
                r = fast_div(rc, ow);                                                            \
                c = rc - r * ow;                                                                 \
            }                                                                                    \
            const Win rw = pool_window(rows, r), cw = pool_window(cols, c);                      \
            const i64 base = plane_base(lx, p);                                                  \
            C best = (C)__longlong_as_double(0xfff0000000000000ull); /* -inf */                  \
            i64 best_at = rw.start * width + cw.start;                                           \
            for (i64 h = rw.start; h < rw.end; h += rw.step) {                                   \
                for (i64 w = cw.start; w < cw.end; w += cw.step) {                               \
                    const C v = LOAD(x[base + h * lx.s2 + w * lx.s3]);                           \
                    if (v > best || v != v) {                                                    \
                        best = v;                                                                \
                        best_at = h * width + w;                                                 \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            out[i] = STORE(best);                                                                \
            idx[i] = best_at;                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* Window means; an empty window (all padding) gives 0. divisor 0: the windows' counts. */   \
    extern "C" __global__ void avg_pool_##SUFFIX(PoolAxis rows, PoolAxis cols, i64 divisor,      \
                                                 PlaneLayout lx, const T* x, T* out, i64 n) {    \
        const i64 oh = rows.output, ow = cols.output;                                            \
        FOR_EACH(i, n) {                                                                         \
            const i64 p = fast_div(i, oh * ow), rc = i - p * (oh * ow), r = fast_div(rc, ow), c = rc - r * ow;   \
            const Win rw = pool_window(rows, r), cw = pool_window(cols, c);                      \
            if (rw.start >= rw.end || cw.start >= cw.end) {                                      \
                out[i] = STORE((C)0);                                                            \
                continue;                                                                        \
            }                                                                                    \
            const i64 base = plane_base(lx, p);                                                  \
            C sum = 0;                                                                           \
            for (i64 h = rw.start; h < rw.end; ++h)                                              \
                for (i64 w = cw.start; w < cw.end; ++w) sum += LOAD(x[base + h * lx.s2 + w * lx.s3]); \
            out[i] = STORE(sum / (C)(divisor ? divisor : rw.count * cw.count));                  \
        }                                                                                        \
    }                                                                                            \
    /* Gradient of the mean: each input element gathers the shares of the windows covering   */  \
    /* it, in the CPU's (row, column) order, so the result is deterministic.                  */ \
    extern "C" __global__ void avg_pool_backward_##SUFFIX(PoolAxis rows, PoolAxis cols,          \
                                                          i64 divisor, PlaneLayout lg,           \
                                                          const T* g, T* out, i64 n) {           \
        const i64 ih_len = rows.input, iw_len = cols.input;                                      \
        FOR_EACH(i, n) {                                                                         \
            const i64 p = fast_div(i, ih_len * iw_len), hw = i - p * (ih_len * iw_len);          \
            const i64 ih = fast_div(hw, iw_len), iw = hw - ih * iw_len;                          \
            i64 r_lo, r_hi, c_lo, c_hi;                                                          \
            covering_outputs(rows, ih, &r_lo, &r_hi);                                            \
            covering_outputs(cols, iw, &c_lo, &c_hi);                                            \
            const i64 base = plane_base(lg, p);                                                  \
            C acc = 0;                                                                           \
            for (i64 r = r_lo; r <= r_hi; ++r) {                                                 \
                const Win rw = pool_window(rows, r);                                             \
                if (ih < rw.start || ih >= rw.end) continue;                                     \
                for (i64 c = c_lo; c <= c_hi; ++c) {                                             \
                    const Win cw = pool_window(cols, c);                                         \
                    if (iw < cw.start || iw >= cw.end) continue;                                 \
                    const C d = (C)(divisor ? divisor : rw.count * cw.count);                    \
                    acc += LOAD(g[base + r * lg.s2 + c * lg.s3]) / d;                            \
                }                                                                                \
            }                                                                                    \
            out[i] = STORE(acc);                                                                 \
        }                                                                                        \
    }                                                                                            \
    /* Gradient of the max: one thread per plane adds the plane's output gradients at their  */  \
    /* indices in row-major order, as the CPU does: deterministic, no atomics. `acc` is the   */ \
    /* output itself for f32/f64, else an f32 scratch converted at the end. A bad index is    */ \
    /* recorded in err = [flag, index] and skipped; the host panics on it.                    */ \
    extern "C" __global__ void max_pool_backward_##SUFFIX(PlaneLayout lg, PlaneLayout li,        \
                                                          const T* g, const i64* idx, C* acc,    \
                                                          T* out, i64 planes, i64 oh, i64 ow,    \
                                                          i64 plane, unsigned long long* err) {  \
        FOR_EACH(p, planes) {                                                                    \
            C* a = acc + p * plane;                                                              \
            for (i64 k = 0; k < plane; ++k) a[k] = 0;                                            \
            const i64 gb = plane_base(lg, p), ib = plane_base(li, p);                            \
            for (i64 r = 0; r < oh; ++r) {                                                       \
                for (i64 c = 0; c < ow; ++c) {                                                   \
                    const i64 at = idx[ib + r * li.s2 + c * li.s3];                              \
                    if (at < 0 || at >= plane) {                                                 \
                        if (atomicCAS(err, 0ull, 1ull) == 0ull) err[1] = (unsigned long long)at; \
                        continue;                                                                \
                    }                                                                            \
                    a[at] += LOAD(g[gb + r * lg.s2 + c * lg.s3]);                                \
                }                                                                                \
            }                                                                                    \
            if ((void*)a != (void*)(out + p * plane))                                            \
                for (i64 k = 0; k < plane; ++k) out[p * plane + k] = STORE(a[k]);                \
        }                                                                                        \
    }                                                                                            \
    /* Gradient of the max, one thread per input element: it adds the gradients of the        */ \
    /* covering windows whose index names it, in row-major order as the per-plane kernel       */ \
    /* does, so both give the same bits. nhwc: thread i is element (n, h, w, c) of a           */ \
    /* channels-last result (coalesced for channels-last inputs), else (n, c, h, w).            */ \
    extern "C" __global__ void max_pool_backward_gather_##SUFFIX(                                \
        PoolAxis rows, PoolAxis cols, PlaneLayout lg, PlaneLayout li, const T* g,                \
        const i64* idx, T* out, i64 n, int nhwc) {                                               \
        const i64 ih_len = rows.input, iw_len = cols.input, ch = lg.channels;                    \
        FOR_EACH(i, n) {                                                                         \
            i64 p, ih, iw;                                                                       \
            if (nhwc) {                                                                          \
                const i64 t = fast_div(i, ch), c = i - t * ch, th = fast_div(t, iw_len);         \
                iw = t - th * iw_len;                                                            \
                ih = fast_mod(th, ih_len);                                                       \
                p = fast_div(th, ih_len) * ch + c;                                               \
            } else {                                                                             \
                p = fast_div(i, ih_len * iw_len);                                                \
                const i64 hw = i - p * (ih_len * iw_len);                                        \
                ih = fast_div(hw, iw_len);                                                       \
                iw = hw - ih * iw_len;                                                           \
            }                                                                                    \
            const i64 at = ih * iw_len + iw;                                                     \
            i64 r_lo, r_hi, c_lo, c_hi;                                                          \
            covering_outputs(rows, ih, &r_lo, &r_hi);                                            \
            covering_outputs(cols, iw, &c_lo, &c_hi);                                            \
            const i64 gb = plane_base(lg, p), ib = plane_base(li, p);                            \
            C acc = 0;                                                                           \
            for (i64 r = r_lo; r <= r_hi; ++r)                                                   \
                for (i64 c = c_lo; c <= c_hi; ++c)                                               \
                    if (idx[ib + r * li.s2 + c * li.s3] == at) acc += LOAD(g[gb + r * lg.s2 + c * lg.s3]); \
            out[i] = STORE(acc);                                                                 \
        }                                                                                        \
    }
POOL(f32, float, float, ID, ID)
POOL(f64, double, double, ID, ID)
POOL(bf16, bf16_t, float, bf16_to_f32, f32_to_bf16)
POOL(f16, f16_t, float, f16_to_f32, f32_to_f16)

// The max-pool gradient for dense channels-last g, idx and out (the ResNet stem), VEC channels
// per thread: 32-bit index arithmetic once per VEC channels, 16-byte loads of g and stores of
// out. Same sums in the same (row, column) order as max_pool_backward_gather, so the same bits.
// Thread t is (n, ih, iw, channel group); `groups` = channels / VEC.
template <typename T, int N> struct alignas(sizeof(T) * N) PoolVec { T v[N]; };
struct PF32 { typedef float T; typedef float C; static const int V = 4;
    static __device__ C up(T x) { return x; } static __device__ T down(C c) { return c; } };
struct PF64 { typedef double T; typedef double C; static const int V = 2;
    static __device__ C up(T x) { return x; } static __device__ T down(C c) { return c; } };
struct PBF16 { typedef bf16_t T; typedef float C; static const int V = 8;
    static __device__ C up(T x) { return bf16_to_f32(x); } static __device__ T down(C c) { return f32_to_bf16(c); } };
struct PF16 { typedef f16_t T; typedef float C; static const int V = 8;
    static __device__ C up(T x) { return f16_to_f32(x); } static __device__ T down(C c) { return f32_to_f16(c); } };

template <class E>
__device__ void max_pool_backward_cl(const PoolAxis& rows, const PoolAxis& cols, const typename E::T* g,
                                     const i64* idx, typename E::T* out, int n, int groups, int channels) {
    typedef typename E::T T;
    typedef typename E::C C;
    const int ih_len = (int)rows.input, iw_len = (int)cols.input, oh = (int)rows.output, ow = (int)cols.output;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        const int cg = t % groups, pos = t / groups;
        const int iw = pos % iw_len, nh = pos / iw_len, ih = nh % ih_len, img = nh / ih_len;
        i64 r_lo, r_hi, c_lo, c_hi;
        covering_outputs(rows, ih, &r_lo, &r_hi);
        covering_outputs(cols, iw, &c_lo, &c_hi);
        const i64 at = (i64)ih * iw_len + iw;
        C acc[E::V];
#pragma unroll
        for (int e = 0; e < E::V; ++e) acc[e] = 0;
        for (int r = (int)r_lo; r <= (int)r_hi; ++r) {
            for (int c = (int)c_lo; c <= (int)c_hi; ++c) {
                const int base = ((img * oh + r) * ow + c) * channels + cg * E::V;
                const PoolVec<T, E::V> gv = *(const PoolVec<T, E::V>*)(g + base);
#pragma unroll
                for (int e = 0; e < E::V; ++e)
                    if (idx[base + e] == at) acc[e] += E::up(gv.v[e]);
            }
        }
        PoolVec<T, E::V> o;
#pragma unroll
        for (int e = 0; e < E::V; ++e) o.v[e] = E::down(acc[e]);
        *(PoolVec<T, E::V>*)(out + (i64)t * E::V) = o;
    }
}

#define POOL_BACKWARD_CL(SUFFIX, E)                                                                     \
    extern "C" __global__ void max_pool_backward_cl_##SUFFIX(PoolAxis rows, PoolAxis cols, const E::T* g, \
                                                             const i64* idx, E::T* out, int n, int groups, \
                                                             int channels) {                             \
        max_pool_backward_cl<E>(rows, cols, g, idx, out, n, groups, channels);                          \
    }
POOL_BACKWARD_CL(f32, PF32)
POOL_BACKWARD_CL(f64, PF64)
POOL_BACKWARD_CL(bf16, PBF16)
POOL_BACKWARD_CL(f16, PF16)
