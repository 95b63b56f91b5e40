// Reductions and topk. The host (cuda.rs) splits the input layout into the kept dims (`outs`:
// output o's base offset is strided_offset(outs, o)) and the reduced dims (`red`: the j-th
// reduced element, in row-major order, sits at base + strided_offset(red, j); red.offset is 0).
//
// Three kernels per (op, dtype), all with the same arguments:
// - `_threads`: one thread per output folds its reduced elements in order (few reduced
//   elements, or many outputs whose kept innermost dim is the contiguous one: coalesced).
// - `_blocks`: one block per (output, split of the reduced range), a shared-memory tree merges
//   the threads' states; with one split it writes outputs, else partial states.
// - `_merge`: one thread per output merges its splits' partial states and writes the output.
// Every merge used below is symmetric (argmax breaks ties by index), so tree order is free.

#define RED_THREADS 256
#define I64_MAX 9223372036854775807LL

// Element kinds: storage type T, compute type C, sum accumulator Acc, sum output SumOut.
struct EF32 {
    typedef float T; typedef float C; typedef float Acc; typedef float SumOut;
    static __device__ C up(T x) { return x; }
    static __device__ T down(C c) { return c; }
    static __device__ T from_double(double d) { return (float)d; }
    static __device__ SumOut sum_out(Acc a) { return a; }
    static __device__ C lowest() { return __int_as_float(0xff800000); }
    static __device__ C highest() { return __int_as_float(0x7f800000); }
};
struct EF64 {
    typedef double T; typedef double C; typedef double Acc; typedef double SumOut;
    static __device__ C up(T x) { return x; }
    static __device__ T down(C c) { return c; }
    static __device__ T from_double(double d) { return d; }
    static __device__ SumOut sum_out(Acc a) { return a; }
    static __device__ C lowest() { return __longlong_as_double(0xfff0000000000000LL); }
    static __device__ C highest() { return __longlong_as_double(0x7ff0000000000000LL); }
};
struct EBF16 {
    typedef bf16_t T; typedef float C; typedef float Acc; typedef bf16_t SumOut;
    static __device__ C up(T x) { return bf16_to_f32(x); }
    static __device__ T down(C c) { return f32_to_bf16(c); }
    static __device__ T from_double(double d) { return f32_to_bf16((float)d); }
    static __device__ SumOut sum_out(Acc a) { return f32_to_bf16(a); }
    static __device__ C lowest() { return __int_as_float(0xff800000); }
    static __device__ C highest() { return __int_as_float(0x7f800000); }
};
struct EF16 {
    typedef f16_t T; typedef float C; typedef float Acc; typedef f16_t SumOut;
    static __device__ C up(T x) { return f16_to_f32(x); }
    static __device__ T down(C c) { return f32_to_f16(c); }
    static __device__ T from_double(double d) { return f32_to_f16((float)d); }
    static __device__ SumOut sum_out(Acc a) { return f32_to_f16(a); }
    static __device__ C lowest() { return __int_as_float(0xff800000); }
    static __device__ C highest() { return __int_as_float(0x7f800000); }
};
// Integer sums wrap in 64 bits, as PyTorch (unsigned arithmetic: no signed overflow).
#define INT_ELEM(NAME, TY, LO, HI)                                                   \
    struct NAME {                                                                    \
        typedef TY T; typedef long long C; typedef unsigned long long Acc;           \
        typedef long long SumOut;                                                    \
        static __device__ C up(T x) { return (long long)x; }                         \
        static __device__ T down(C c) { return (T)c; }                               \
        static __device__ T from_double(double d) { return (T)d; }                   \
        static __device__ SumOut sum_out(Acc a) { return (long long)a; }             \
        static __device__ C lowest() { return LO; }                                  \
        static __device__ C highest() { return HI; }                                 \
    };
INT_ELEM(EI64, long long, (-I64_MAX - 1), I64_MAX)
INT_ELEM(EU32, unsigned int, 0LL, 4294967295LL)
INT_ELEM(EU8, unsigned char, 0LL, 255LL)
INT_ELEM(EBOOL, unsigned char, 0LL, 1LL)

// strided_offset out of line: every kernel here walks layouts, and one shared copy of the
// 64-bit division loop keeps this many kernels quick to compile. Contiguous layouts skip it.
__device__ __noinline__ i64 strided_offset_slow(const Strided& s, i64 i) { return strided_offset(s, i); }
__device__ __forceinline__ i64 offset_of(const Strided& s, i64 i) {
    if (s.contiguous) return s.offset + i;
    if (s.rank == 1) return s.offset + i * s.strides[0];
    return strided_offset_slow(s, i);
}

template <typename C> __device__ __forceinline__ bool is_nan(C x) { return x != x; }

template <class E> struct SumR {
    typedef typename E::Acc S; typedef typename E::SumOut O;
    int flag; long long correction;
    __device__ S init(long long) const { return (S)0; }
    __device__ S step(S s, typename E::T x, long long) const { return s + (S)E::up(x); }
    __device__ S merge(S a, S b) const { return a + b; }
    __device__ O finish(S s, long long) const { return E::sum_out(s); }
};

template <class E> struct MeanR {
    typedef typename E::Acc S; typedef typename E::T O;
    int flag; long long correction;
    __device__ S init(long long) const { return (S)0; }
    __device__ S step(S s, typename E::T x, long long) const { return s + (S)E::up(x); }
    __device__ S merge(S a, S b) const { return a + b; }
    __device__ O finish(S s, long long n) const { return E::from_double((double)s / (double)n); }
};

// max (flag 1) or min (flag 0); a NaN, once seen, stays.
template <class E> struct ExtR {
    typedef typename E::C S; typedef typename E::T O;
    int flag; long long correction;
    __device__ S init(long long) const { return flag ? E::lowest() : E::highest(); }
    __device__ S step(S s, typename E::T x, long long) const {
        S v = E::up(x);
        bool better = flag ? v > s : v < s;
        return (better || is_nan(v)) ? v : s;
    }
    __device__ S merge(S a, S b) const {
        bool better = flag ? b > a : b < a;
        return (better || is_nan(b)) ? b : a;
    }
    __device__ O finish(S s, long long) const { return E::down(s); }
};

template <typename C> struct ArgState { C v; long long i; };

// argmax (flag 1) or argmin (flag 0): the first best index; the first NaN beats everything.
// A state starts as (identity, index of the fold's first element), so a run of identities
// (all -inf, say) answers its first element; a fold with no elements has index I64_MAX.
template <class E> struct ArgR {
    typedef typename E::C C; typedef ArgState<C> S; typedef long long O;
    int flag; long long correction;
    __device__ S init(long long first) const { S s; s.v = flag ? E::lowest() : E::highest(); s.i = first; return s; }
    __device__ bool beats(C x, C best) const {
        if (is_nan(best)) return false;
        return (flag ? x > best : x < best) || is_nan(x);
    }
    __device__ S step(S s, typename E::T x, long long j) const {
        C v = E::up(x);
        if (beats(v, s.v)) { s.v = v; s.i = j; }
        return s;
    }
    __device__ S merge(S a, S b) const {
        bool an = is_nan(a.v), bn = is_nan(b.v);
        if (an || bn) {
            if (an && bn) return a.i <= b.i ? a : b;
            return an ? a : b;
        }
        if (flag ? a.v > b.v : a.v < b.v) return a;
        if (flag ? b.v > a.v : b.v < a.v) return b;
        return a.i <= b.i ? a : b;
    }
    __device__ O finish(S s, long long) const { return s.i; }
};

struct Moments { double n, mean, m2; };

// Variance (flag 0) or std (flag 1) in f64: Welford per element, Chan's formula to merge.
template <class E> struct VarR {
    typedef Moments S; typedef typename E::T O;
    int flag; long long correction;
    __device__ S init(long long) const { S s; s.n = 0; s.mean = 0; s.m2 = 0; return s; }
    __device__ S step(S s, typename E::T x, long long) const {
        double v = (double)E::up(x);
        double n = s.n + 1.0, d = v - s.mean, mean = s.mean + d / n;
        S r; r.n = n; r.mean = mean; r.m2 = s.m2 + d * (v - mean);
        return r;
    }
    __device__ S merge(S a, S b) const {
        if (a.n == 0.0) return b;
        if (b.n == 0.0) return a;
        double n = a.n + b.n, d = b.mean - a.mean;
        S r; r.n = n; r.mean = a.mean + d * (b.n / n); r.m2 = a.m2 + b.m2 + d * d * (a.n * b.n / n);
        return r;
    }
    __device__ O finish(S s, long long count) const {
        long long dof = count > correction ? count - correction : 0;
        double var = s.m2 / (double)dof;
        return E::from_double(flag ? sqrt(var) : var);
    }
};

template <class R, class E>
__device__ void reduce_threads(R r, const Strided& outs, const Strided& red, const typename E::T* in,
                               long long n_out, long long n_red, typename R::O* out) {
    FOR_EACH(o, n_out) {
        long long base = offset_of(outs, o);
        typename R::S s = r.init(0);
        for (long long j = 0; j < n_red; ++j) s = r.step(s, in[base + offset_of(red, j)], j);
        out[o] = r.finish(s, n_red);
    }
}

template <class R, class E>
__device__ void reduce_blocks(R r, const Strided& outs, const Strided& red, const typename E::T* in,
                              long long n_out, long long n_red, long long splits, long long chunk,
                              typename R::S* partial, typename R::O* out) {
    typedef typename R::S S;
    __shared__ double smem_raw[RED_THREADS * sizeof(S) / sizeof(double) + 1];
    S* sm = (S*)smem_raw;
    const int t = threadIdx.x;
    for (long long w = blockIdx.x; w < n_out * splits; w += gridDim.x) {
        long long o = w / splits, sp = w - o * splits;
        long long base = offset_of(outs, o);
        long long j0 = sp * chunk, j1 = min(j0 + chunk, n_red), first = j0 + t;
        S s = r.init(first < j1 ? first : I64_MAX);
        for (long long j = first; j < j1; j += RED_THREADS) s = r.step(s, in[base + offset_of(red, j)], j);
        sm[t] = s;
        __syncthreads();
        for (int h = RED_THREADS / 2; h > 0; h >>= 1) {
            if (t < h) sm[t] = r.merge(sm[t], sm[t + h]);
            __syncthreads();
        }
        if (t == 0) {
            if (splits > 1) partial[w] = sm[0];
            else out[o] = r.finish(sm[0], n_red);
        }
        __syncthreads();
    }
}

template <class R>
__device__ void reduce_merge(R r, const typename R::S* partial, long long n_out, long long n_red, long long splits,
                             typename R::O* out) {
    FOR_EACH(o, n_out) {
        typename R::S s = partial[o * splits];
        for (long long sp = 1; sp < splits; ++sp) s = r.merge(s, partial[o * splits + sp]);
        out[o] = r.finish(s, n_red);
    }
}

// Sum or mean over the rows of a [rows, cols] view with contiguous columns (sum over dim 0 of
// [N, C]: a bias gradient). The generic kernels give such a reduction one block per column,
// whose threads read down the column, 2 bytes from every 32-byte sector; here the 32 lanes of
// a warp read 32 neighbouring columns of one row, the 8 warps of a block interleave rows, and
// blockIdx.y splits the rows so a few hundred columns still fill the GPU. Split partials go to
// partial[col * splits + split], which the merge kernel folds in split order (deterministic).
#define COLS_WARPS 8
template <class R, class E>
__device__ void reduce_cols(R r, const typename E::T* in, long long rows, long long cols, long long row_stride,
                            long long rows_per_split, typename R::S* partial, typename R::O* out) {
    typedef typename R::S S;
    __shared__ double smem_raw[COLS_WARPS * 32 * sizeof(S) / sizeof(double) + 1];
    S* sm = (S*)smem_raw;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long c = (long long)blockIdx.x * 32 + lane;
    const long long r0 = (long long)blockIdx.y * rows_per_split, r1 = min(r0 + rows_per_split, rows);
    S s = r.init(0);
    if (c < cols) {
        for (long long j = r0 + warp; j < r1; j += COLS_WARPS) s = r.step(s, in[j * row_stride + c], j);
    }
    sm[warp * 32 + lane] = s;
    __syncthreads();
    if (warp == 0 && c < cols) {
        for (int w = 1; w < COLS_WARPS; ++w) s = r.merge(s, sm[w * 32 + lane]);
        if (gridDim.y > 1) partial[c * gridDim.y + blockIdx.y] = s;
        else out[c] = r.finish(s, rows);
    }
}

#define REDUCE_COLS_KERNEL(OP, RED, E, SUFFIX)                                                                \
    extern "C" __global__ void __launch_bounds__(COLS_WARPS * 32)                                            \
    reduce_##OP##_cols_##SUFFIX(const E::T* in, long long rows, long long cols, long long row_stride,           \
                                long long rows_per_split, RED<E>::S* partial, RED<E>::O* out) {             \
        RED<E> r; r.flag = 0; r.correction = 0;                                                              \
        reduce_cols<RED<E>, E>(r, in, rows, cols, row_stride, rows_per_split, partial, out);                 \
    }
#define REDUCE_COLS_FLOAT_DTYPES(OP, RED)      \
    REDUCE_COLS_KERNEL(OP, RED, EF32, f32)     \
    REDUCE_COLS_KERNEL(OP, RED, EF64, f64)     \
    REDUCE_COLS_KERNEL(OP, RED, EBF16, bf16)   \
    REDUCE_COLS_KERNEL(OP, RED, EF16, f16)

#define REDUCE_KERNELS(OP, RED, E, SUFFIX)                                                                   \
    extern "C" __global__ void __launch_bounds__(RED_THREADS)                                              \
    reduce_##OP##_blocks_##SUFFIX(Strided outs, Strided red, const E::T* in, long long n_out, long long n_red, \
                                  long long splits, long long chunk, RED<E>::S* partial, RED<E>::O* out,     \
                                  int flag, long long correction) {                                         \
        RED<E> r; r.flag = flag; r.correction = correction;                                                  \
        reduce_blocks<RED<E>, E>(r, outs, red, in, n_out, n_red, splits, chunk, partial, out);               \
    }                                                                                                        \
    extern "C" __global__ void reduce_##OP##_threads_##SUFFIX(                                               \
        Strided outs, Strided red, const E::T* in, long long n_out, long long n_red, long long splits,       \
        long long chunk, RED<E>::S* partial, RED<E>::O* out, int flag, long long correction) {               \
        RED<E> r; r.flag = flag; r.correction = correction;                                                  \
        reduce_threads<RED<E>, E>(r, outs, red, in, n_out, n_red, out);                                      \
    }                                                                                                        \
    extern "C" __global__ void reduce_##OP##_merge_##SUFFIX(                                                 \
        Strided outs, Strided red, const E::T* in, long long n_out, long long n_red, long long splits,       \
        long long chunk, RED<E>::S* partial, RED<E>::O* out, int flag, long long correction) {               \
        RED<E> r; r.flag = flag; r.correction = correction;                                                  \
        reduce_merge<RED<E>>(r, partial, n_out, n_red, splits, out);                                         \
    }

#define REDUCE_ALL_DTYPES(OP, RED)        \
    REDUCE_KERNELS(OP, RED, EF32, f32)    \
    REDUCE_KERNELS(OP, RED, EF64, f64)    \
    REDUCE_KERNELS(OP, RED, EBF16, bf16)  \
    REDUCE_KERNELS(OP, RED, EF16, f16)    \
    REDUCE_KERNELS(OP, RED, EI64, i64)    \
    REDUCE_KERNELS(OP, RED, EU32, u32)    \
    REDUCE_KERNELS(OP, RED, EU8, u8)      \
    REDUCE_KERNELS(OP, RED, EBOOL, bool)
#define REDUCE_FLOAT_DTYPES(OP, RED)      \
    REDUCE_KERNELS(OP, RED, EF32, f32)    \
    REDUCE_KERNELS(OP, RED, EF64, f64)    \
    REDUCE_KERNELS(OP, RED, EBF16, bf16)  \
    REDUCE_KERNELS(OP, RED, EF16, f16)

REDUCE_ALL_DTYPES(sum, SumR)
REDUCE_ALL_DTYPES(ext, ExtR)
REDUCE_ALL_DTYPES(arg, ArgR)
REDUCE_FLOAT_DTYPES(mean, MeanR)
REDUCE_FLOAT_DTYPES(var, VarR)
REDUCE_COLS_FLOAT_DTYPES(sum, SumR)
REDUCE_COLS_FLOAT_DTYPES(mean, MeanR)

// ---- topk ----------------------------------------------------------------------------------
// Lanes are rows of `lanes` (the searched dim moved last): lane l's i-th element sits at
// strided_offset(bases, l) + i * stride. Element i's rank is the number of lane elements that
// come before it in the wanted order (value, NaN above every number, then index), so ranks are
// a permutation and the top k are the ranks below k. O(n^2) per lane: the host uses this for
// lanes of moderate length only.

template <class E>
__device__ __forceinline__ bool topk_before(typename E::C a, long long ia, typename E::C b, long long ib, int largest) {
    bool an = is_nan(a), bn = is_nan(b);
    if (an != bn) return largest ? an : bn;  // NaN is the largest value
    if (!an && a != b) return largest ? a > b : a < b;
    return ia < ib;
}

template <class E>
__device__ void topk_rank(Strided bases, long long stride, const typename E::T* in, long long lanes, long long n,
                          int largest, int* rank) {
    FOR_EACH(e, lanes * n) {
        long long l = e / n, i = e - l * n, base = offset_of(bases, l);
        typename E::C x = E::up(in[base + i * stride]);
        int r = 0;
        for (long long j = 0; j < n; ++j) r += topk_before<E>(E::up(in[base + j * stride]), j, x, i, largest);
        rank[e] = r;
    }
}

// Writes the selected elements: by rank when `sorted`, else in index order (the position is
// the number of selected elements before it in the lane).
template <class E>
__device__ void topk_write(Strided bases, long long stride, const typename E::T* in, long long lanes, long long n,
                           long long k, int sorted, const int* rank, typename E::T* values, long long* indices) {
    FOR_EACH(e, lanes * n) {
        long long r = rank[e];
        if (r >= k) continue;
        long long l = e / n, i = e - l * n;
        long long pos = r;
        if (!sorted) {
            pos = 0;
            for (long long j = 0; j < i; ++j) pos += rank[l * n + j] < k;
        }
        values[l * k + pos] = in[offset_of(bases, l) + i * stride];
        indices[l * k + pos] = i;
    }
}

#define TOPK_KERNELS(E, SUFFIX)                                                                              \
    extern "C" __global__ void topk_rank_##SUFFIX(Strided bases, long long stride, const E::T* in,           \
                                                  long long lanes, long long n, int largest, int* rank) {    \
        topk_rank<E>(bases, stride, in, lanes, n, largest, rank);                                            \
    }                                                                                                        \
    extern "C" __global__ void topk_write_##SUFFIX(Strided bases, long long stride, const E::T* in,          \
                                                   long long lanes, long long n, long long k, int sorted,    \
                                                   const int* rank, E::T* values, long long* indices) {      \
        topk_write<E>(bases, stride, in, lanes, n, k, sorted, rank, values, indices);                        \
    }
TOPK_KERNELS(EF32, f32)
TOPK_KERNELS(EF64, f64)
TOPK_KERNELS(EBF16, bf16)
TOPK_KERNELS(EF16, f16)
TOPK_KERNELS(EI64, i64)
TOPK_KERNELS(EU32, u32)
TOPK_KERNELS(EU8, u8)
TOPK_KERNELS(EBOOL, bool)
