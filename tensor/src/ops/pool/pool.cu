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

// Max pooling's compact argmax: the position of the maximum inside its window, row-major over
// the kernel's taps, ki * kernel_w + kj for the element at (o_h * stride_h - padding_h +
// ki * dilation_h, likewise for w); NO_OFFSET for a window with no element. It needs a
// kernel of at most 255 taps (the host checks), and 32-bit positions.
#define NO_OFFSET 255
__device__ __forceinline__ u8 window_offset(const PoolAxis& rows, const PoolAxis& cols, int r, int c, int h,
                                            int w) {
    const int ki = (h - (r * (int)rows.stride - (int)rows.padding)) / (int)rows.dilation;
    const int kj = (w - (c * (int)cols.stride - (int)cols.padding)) / (int)cols.dilation;
    return (u8)(ki * (int)cols.kernel + kj);
}

// The tap of window o (along a max axis) that lands on input position pos, or -1 when none
// does (pos outside the window or between its dilated taps).
__device__ __forceinline__ int window_tap(const PoolAxis& a, int o, int pos) {
    const int into = pos - (o * (int)a.stride - (int)a.padding), d = (int)a.dilation;
    if (into < 0 || into % d != 0 || into / d >= (int)a.kernel) return -1;
    return into / d;
}

#define ID(x) (x)
#define POOL(SUFFIX, T, C, LOAD, STORE)                                                          \
    /* Max and its flat index into the H*W plane (idx), or its offset in the window (off,    */ \
    /* see window_offset; 255 for a window with no element), whichever is set; NaN wins, a     */ \
    /* later NaN over an earlier one. nhwc: thread i is output element (n, r, c, channel) of   */ \
    /* a channels-last result.                                                                  */ \
    extern "C" __global__ void max_pool_##SUFFIX(PoolAxis rows, PoolAxis cols, PlaneLayout lx,   \
                                                 const T* x, T* out, i64* idx, u8* off, i64 n,   \
                                                 int nhwc) {                                     \
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
            i64 best_h = rw.start, best_w = cw.start;                                            \
            for (i64 h = rw.start; h < rw.end; h += rw.step) {                                   \
                for (i64 w = cw.start; w < cw.end; w += cw.step) {                               \
                    const C v = LOAD(x[base + h * lx.s2 + w * lx.s3]);                           \
                    if (v > best || v != v) {                                                    \
                        best = v;                                                                \
                        best_h = h;                                                              \
                        best_w = w;                                                              \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            out[i] = STORE(best);                                                                \
            if (idx) idx[i] = best_h * width + best_w;                                           \
            if (off) {                                                                           \
                const bool empty = rw.start >= rw.end || cw.start >= cw.end;                     \
                off[i] = empty ? NO_OFFSET                                                       \
                               : window_offset(rows, cols, r, c, (int)best_h, (int)best_w);      \
            }                                                                                    \
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
    /* covering windows whose index (idx) or window offset (off, whichever is set) names it,  */ \
    /* in row-major order as the per-plane kernel does, so both give the same bits. nhwc:     */ \
    /* thread i is element (n, h, w, c) of a channels-last result (coalesced for              */ \
    /* channels-last inputs), else (n, c, h, w).                                               */ \
    extern "C" __global__ void max_pool_backward_gather_##SUFFIX(                                \
        PoolAxis rows, PoolAxis cols, PlaneLayout lg, PlaneLayout li, const T* g,                \
        const i64* idx, const u8* off, T* out, i64 n, int nhwc) {                                \
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
            for (i64 r = r_lo; r <= r_hi; ++r) {                                                 \
                const int ki = off ? window_tap(rows, (int)r, (int)ih) : 0;                      \
                for (i64 c = c_lo; c <= c_hi; ++c) {                                             \
                    const i64 k = ib + r * li.s2 + c * li.s3;                                    \
                    bool chosen;                                                                 \
                    if (off) {                                                                   \
                        const int kj = window_tap(cols, (int)c, (int)iw);                        \
                        chosen = ki >= 0 && kj >= 0 && off[k] == ki * (int)cols.kernel + kj;     \
                    } else {                                                                     \
                        chosen = idx[k] == at;                                                   \
                    }                                                                            \
                    if (chosen) acc += LOAD(g[gb + r * lg.s2 + c * lg.s3]);                      \
                }                                                                                \
            }                                                                                    \
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

// Max pooling of a dense channels-last input with window offsets (see window_offset), E::V
// channels per thread: 16-byte loads of x and stores of the maxima, one V-byte store of the
// offsets, 32-bit index arithmetic. Same maxima, ties and NaN rule as max_pool (the window in
// row-major order, the first maximum wins, NaN wins and a later NaN over an earlier one).
// Thread t is (n, oh, ow, channel group); `groups` = channels / V.
template <class E>
__device__ void max_pool_offsets_cl(const PoolAxis& rows, const PoolAxis& cols, const typename E::T* x,
                                    typename E::T* out, u8* offsets, int n, int groups, int channels) {
    typedef typename E::T T;
    typedef typename E::C C;
    const int ih_len = (int)rows.input, iw_len = (int)cols.input, oh = (int)rows.output, ow = (int)cols.output;
    const int kw = (int)cols.kernel, dh = (int)rows.dilation, dw = (int)cols.dilation;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        const int cg = t % groups, pos = t / groups;
        const int c = pos % ow, q = pos / ow, r = q % oh, img = q / oh;
        // The window's first tap (maybe in the padding), its first tap inside the input, the
        // end, and how many taps the padding skipped, per axis (as pool_window).
        const int fh = r * (int)rows.stride - (int)rows.padding, fw = c * (int)cols.stride - (int)cols.padding;
        const int skip_h = fh < 0 ? (-fh + dh - 1) / dh : 0, skip_w = fw < 0 ? (-fw + dw - 1) / dw : 0;
        const int h0 = fh + skip_h * dh, w0 = fw + skip_w * dw;
        const int h_end = min(fh + ((int)rows.kernel - 1) * dh + 1, ih_len);
        const int w_end = min(fw + (kw - 1) * dw + 1, iw_len);
        const bool empty = h0 >= h_end || w0 >= w_end;
        C best[E::V];
        int at[E::V];
#pragma unroll
        for (int e = 0; e < E::V; ++e) {
            best[e] = (C)__longlong_as_double(0xfff0000000000000ull);  // -inf
            at[e] = empty ? NO_OFFSET : skip_h * kw + skip_w;
        }
        for (int h = h0, ki = skip_h; h < h_end; h += dh, ++ki) {
            for (int w = w0, kj = skip_w; w < w_end; w += dw, ++kj) {
                const int base = ((img * ih_len + h) * iw_len + w) * channels + cg * E::V;
                const PoolVec<T, E::V> xv = *(const PoolVec<T, E::V>*)(x + base);
#pragma unroll
                for (int e = 0; e < E::V; ++e) {
                    const C v = E::up(xv.v[e]);
                    if (v > best[e] || v != v) {
                        best[e] = v;
                        at[e] = ki * kw + kj;
                    }
                }
            }
        }
        PoolVec<T, E::V> o;
        PoolVec<u8, E::V> k;
#pragma unroll
        for (int e = 0; e < E::V; ++e) {
            o.v[e] = E::down(best[e]);
            k.v[e] = (u8)at[e];
        }
        *(PoolVec<T, E::V>*)(out + (i64)t * E::V) = o;
        *(PoolVec<u8, E::V>*)(offsets + (i64)t * E::V) = k;
    }
}

// The output positions o (along a max axis) whose window may hold input position pos: o * stride -
// padding <= pos <= o * stride - padding + span - 1, clipped to the output.
__device__ __forceinline__ void covering_windows(const PoolAxis& a, int pos, int* lo, int* hi) {
    const int s = (int)a.stride, span = ((int)a.kernel - 1) * (int)a.dilation + 1;
    const int from = pos + (int)a.padding - span + 1;
    *lo = from <= 0 ? 0 : (from + s - 1) / s;
    *hi = min((pos + (int)a.padding) / s, (int)a.output - 1);
}

// The gradient of max_pool_offsets_cl for dense channels-last g, offsets and out, E::V
// channels per thread: each input element adds the gradients of the windows covering it whose
// offset names it, in (row, column) order as max_pool_backward_gather does, so the same bits.
// Thread t is (n, ih, iw, channel group).
template <class E>
__device__ void max_pool_offsets_backward_cl(const PoolAxis& rows, const PoolAxis& cols, const typename E::T* g,
                                             const u8* offsets, typename E::T* out, int n, int groups,
                                             int channels) {
    typedef typename E::T T;
    typedef typename E::C C;
    const int ih_len = (int)rows.input, iw_len = (int)cols.input, oh = (int)rows.output, ow = (int)cols.output;
    const int kw = (int)cols.kernel;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        const int cg = t % groups, pos = t / groups;
        const int iw = pos % iw_len, q = pos / iw_len, ih = q % ih_len, img = q / ih_len;
        int r_lo, r_hi, c_lo, c_hi;
        covering_windows(rows, ih, &r_lo, &r_hi);
        covering_windows(cols, iw, &c_lo, &c_hi);
        C acc[E::V];
#pragma unroll
        for (int e = 0; e < E::V; ++e) acc[e] = 0;
        for (int r = r_lo; r <= r_hi; ++r) {
            const int ki = window_tap(rows, r, ih);
            if (ki < 0) continue;
            for (int c = c_lo; c <= c_hi; ++c) {
                const int kj = window_tap(cols, c, iw);
                if (kj < 0) continue;
                const int tap = ki * kw + kj;
                const int base = ((img * oh + r) * ow + c) * channels + cg * E::V;
                const PoolVec<u8, E::V> k = *(const PoolVec<u8, E::V>*)(offsets + base);
                const PoolVec<T, E::V> gv = *(const PoolVec<T, E::V>*)(g + base);
#pragma unroll
                for (int e = 0; e < E::V; ++e)
                    if (k.v[e] == tap) acc[e] += E::up(gv.v[e]);
            }
        }
        PoolVec<T, E::V> o;
#pragma unroll
        for (int e = 0; e < E::V; ++e) o.v[e] = E::down(acc[e]);
        *(PoolVec<T, E::V>*)(out + (i64)t * E::V) = o;
    }
}

#define POOL_OFFSETS_CL(SUFFIX, E)                                                                       \
    extern "C" __global__ void max_pool_offsets_cl_##SUFFIX(PoolAxis rows, PoolAxis cols, const E::T* x, \
                                                            E::T* out, u8* offsets, int n, int groups,   \
                                                            int channels) {                              \
        max_pool_offsets_cl<E>(rows, cols, x, out, offsets, n, groups, channels);                        \
    }                                                                                                    \
    extern "C" __global__ void max_pool_offsets_backward_cl_##SUFFIX(                                    \
        PoolAxis rows, PoolAxis cols, const E::T* g, const u8* offsets, E::T* out, int n, int groups,    \
        int channels) {                                                                                  \
        max_pool_offsets_backward_cl<E>(rows, cols, g, offsets, out, n, groups, channels);               \
    }
POOL_OFFSETS_CL(f32, PF32)
POOL_OFFSETS_CL(f64, PF64)
POOL_OFFSETS_CL(bf16, PBF16)
POOL_OFFSETS_CL(f16, PF16)
