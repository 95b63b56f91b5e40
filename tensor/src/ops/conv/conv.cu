// Convolution without cuDNN: im2col unfolds input patches into a column matrix that cuBLAS
// multiplies with the weight; col2im folds a column matrix of gradients back onto the input.

// Shapes and hyper-parameters (struct ConvArgs in ops/conv/cuda.rs), for samples n0..n0+count.
struct ConvArgs {
    i64 n0, count;
    i64 c, h, w;
    i64 kh, kw, oh, ow;
    i64 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

// col[nl * col_n + row * col_row + oy * OW + ox] = x[n0 + nl, c, iy, ix] (0 in the padding),
// with row = (c * KH + ki) * KW + kj. x is read through its four strides (any layout).
template <typename T>
__device__ void im2col(const T* x, i64 x_off, i64 sn, i64 sc, i64 sh, i64 sw, ConvArgs g, T* col,
                       i64 col_n, i64 col_row) {
    const i64 total = g.count * g.c * g.kh * g.kw * g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 t = i;
        const i64 ox = t % g.ow; t /= g.ow;
        const i64 oy = t % g.oh; t /= g.oh;
        const i64 kj = t % g.kw; t /= g.kw;
        const i64 ki = t % g.kh; t /= g.kh;
        const i64 c = t % g.c;
        const i64 nl = t / g.c;
        const i64 iy = oy * g.stride_h - g.pad_h + ki * g.dil_h;
        const i64 ix = ox * g.stride_w - g.pad_w + kj * g.dil_w;
        T v = (T)0;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = x[x_off + (g.n0 + nl) * sn + c * sc + iy * sh + ix * sw];
        const i64 row = (c * g.kh + ki) * g.kw + kj;
        col[nl * col_n + row * col_row + oy * g.ow + ox] = v;
    }
}

// dx[n0 + nl, c, iy, ix] = sum of the column entries that im2col took from that pixel; one thread
// per input pixel (a gather, so no atomics and a fixed summation order). dx is contiguous NCHW.
template <typename A, typename T, typename Store>
__device__ void col2im(const A* col, i64 col_n, ConvArgs g, T* dx, Store store) {
    const i64 total = g.count * g.c * g.h * g.w;
    const i64 plane = g.oh * g.ow;
    FOR_EACH(i, total) {
        i64 t = i;
        const i64 ix = t % g.w; t /= g.w;
        const i64 iy = t % g.h; t /= g.h;
        const i64 c = t % g.c;
        const i64 nl = t / g.c;
        A acc = 0;
        for (i64 ki = 0; ki < g.kh; ++ki) {
            const i64 ty = iy + g.pad_h - ki * g.dil_h;
            if (ty < 0 || ty % g.stride_h != 0) continue;
            const i64 oy = ty / g.stride_h;
            if (oy >= g.oh) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                const i64 tx = ix + g.pad_w - kj * g.dil_w;
                if (tx < 0 || tx % g.stride_w != 0) continue;
                const i64 ox = tx / g.stride_w;
                if (ox >= g.ow) continue;
                const i64 row = (c * g.kh + ki) * g.kw + kj;
                acc += col[nl * col_n + row * plane + oy * g.ow + ox];
            }
        }
        dx[((g.n0 + nl) * g.c + c) * g.h * g.w + iy * g.w + ix] = store(acc);
    }
}

struct StoreF32 { __device__ float operator()(float v) const { return v; } };
struct StoreF64 { __device__ double operator()(double v) const { return v; } };
struct StoreBF16 { __device__ bf16_t operator()(float v) const { return f32_to_bf16(v); } };
struct StoreF16 { __device__ f16_t operator()(float v) const { return f32_to_f16(v); } };

// 16-bit types are copied as bit patterns by im2col; their column gradients are f32.
#define CONV_KERNELS(SUF, T, A, STORE)                                                              \
    extern "C" __global__ void im2col_##SUF(const T* x, i64 x_off, i64 sn, i64 sc, i64 sh, i64 sw,  \
                                            ConvArgs g, T* col, i64 col_n, i64 col_row) {           \
        im2col<T>(x, x_off, sn, sc, sh, sw, g, col, col_n, col_row);                                \
    }                                                                                               \
    extern "C" __global__ void col2im_##SUF(const A* col, i64 col_n, ConvArgs g, T* dx) {           \
        col2im<A, T, STORE>(col, col_n, g, dx, STORE());                                            \
    }

CONV_KERNELS(f32, float, float, StoreF32)
CONV_KERNELS(f64, double, double, StoreF64)
CONV_KERNELS(bf16, bf16_t, float, StoreBF16)
CONV_KERNELS(f16, f16_t, float, StoreF16)
