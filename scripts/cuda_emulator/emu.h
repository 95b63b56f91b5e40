// Host emulation of the CUDA features the attention_v2 kernels use, from the PTX ISA's
// definitions: one std::thread per GPU thread; warp collectives (mma.sync m16n8k16 with its
// fragment layouts, ldmatrix .x4 with and without .trans, shuffles) as exchanges between the 32
// lanes of a warp under a barrier; cp.async copies either at issue ("early") or at the wait
// ("late"); shared memory of exactly the bytes launched with, filled with NaN patterns so that a
// read of anything never written shows in the results. Barriers are mutex and condition
// variable, which ThreadSanitizer understands.
#pragma once
#include <algorithm>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define OXTRAIN_EMULATED_PTX 1
using std::max;
using std::min;

struct dim3 {
    unsigned x = 0, y = 0, z = 0;
};
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct alignas(8) float2 {
    float x, y;
};
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned i;
    memcpy(&i, &f, 4);
    return i;
}

struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    int n, count = 0;
    unsigned gen = 0;
    explicit Barrier(int n) : n(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(m);
        unsigned g = gen;
        if (++count == n) {
            count = 0;
            ++gen;
            cv.notify_all();
        } else {
            cv.wait(lk, [&] { return gen != g; });
        }
    }
};

struct WarpState {
    Barrier bar{32};
    uint32_t u[32][8];
    float f[32][8];
};

// The block being run: its shared memory (exactly the requested bytes, so ASan sees overruns),
// barriers and warps.
struct BlockState {
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    Barrier* block_bar = nullptr;
    WarpState* warps = nullptr;
};
BlockState g_block;
bool g_late_copies = false;

inline int lane_id() { return threadIdx.x & 31; }
inline WarpState& my_warp() { return g_block.warps[threadIdx.x >> 5]; }

inline void __syncthreads() { g_block.block_bar->wait(); }
inline void __syncwarp() { my_warp().bar.wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
    WarpState& w = my_warp();
    w.f[lane_id()][0] = v;
    w.bar.wait();
    float r = w.f[lane_id() ^ mask][0];
    w.bar.wait();
    return r;
}

inline unsigned short* dynamic_smem() { return (unsigned short*)g_block.smem; }
inline uint32_t smem_u32(const void* p) {
    ptrdiff_t off = (const unsigned char*)p - g_block.smem;
    if (off < 0 || (size_t)off > g_block.smem_bytes) {
        fprintf(stderr, "smem_u32: pointer outside shared memory (offset %td)\n", off);
        abort();
    }
    return (uint32_t)off;
}
inline unsigned char* smem_at(uint32_t addr, size_t bytes, size_t align) {
    if (addr + bytes > g_block.smem_bytes || addr % align) {
        fprintf(stderr, "shared access at %u (+%zu) outside %zu bytes or misaligned\n", addr, bytes, g_block.smem_bytes);
        abort();
    }
    return g_block.smem + addr;
}

// cp.async: copies in flight per thread, grouped by commit.
struct PendingCopy {
    unsigned char* dst;
    const void* src;
    int bytes;
};
thread_local std::vector<PendingCopy> t_uncommitted;
thread_local std::vector<PendingCopy> t_committed;
inline void cp_async(uint32_t dst, const void* src, int bytes) {
    if ((uintptr_t)src % bytes) {
        fprintf(stderr, "cp.async: global source misaligned\n");
        abort();
    }
    unsigned char* d = smem_at(dst, bytes, bytes);
    if (g_late_copies)
        t_uncommitted.push_back({d, src, bytes});
    else
        memcpy(d, src, bytes);
}
inline void cp_async_16(uint32_t dst, const void* src) { cp_async(dst, src, 16); }
inline void cp_async_4(uint32_t dst, const void* src) { cp_async(dst, src, 4); }
inline void cp_async_commit() {
    t_committed.insert(t_committed.end(), t_uncommitted.begin(), t_uncommitted.end());
    t_uncommitted.clear();
}
inline void cp_async_wait_all() {
    if (!t_uncommitted.empty()) {
        fprintf(stderr, "cp.async.wait_group 0 with uncommitted copies\n");
        abort();
    }
    for (auto& c : t_committed) memcpy(c.dst, c.src, c.bytes);
    t_committed.clear();
}

inline float fast_exp2(float x) {
    float y = exp2f(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}

inline uint16_t lo16(uint32_t x) { return x & 0xffff; }
inline uint16_t hi16(uint32_t x) { return x >> 16; }

// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8.
inline void ldsm_common(uint32_t (&r)[4], uint32_t addr, bool trans) {
    WarpState& w = my_warp();
    const int lane = lane_id(), g = lane >> 2, t = lane & 3;
    w.u[lane][0] = addr;
    w.bar.wait();
    for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
            const unsigned char* row = smem_at(w.u[8 * i + g][0], 16, 16);
            memcpy(&lo, row + 4 * t, 2);
            memcpy(&hi, row + 4 * t + 2, 2);
        } else {
            const unsigned char* r0 = smem_at(w.u[8 * i + 2 * t][0], 16, 16);
            const unsigned char* r1 = smem_at(w.u[8 * i + 2 * t + 1][0], 16, 16);
            memcpy(&lo, r0 + 2 * g, 2);
            memcpy(&hi, r1 + 2 * g, 2);
        }
        r[i] = lo | ((uint32_t)hi << 16);
    }
    w.bar.wait();
}
inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) { ldsm_common(r, addr, false); }
inline void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) { ldsm_common(r, addr, true); }

float host_bf16_to_f32(uint16_t x);
// Defined by the harness, after common.cuh's conversions.
uint32_t pack_bf16x2(float lo, float hi);
uint32_t pack_f16x2(float lo, float hi);
float host_f16_to_f32(uint16_t x);

// mma.m16n8k16 with PTX's fragment layouts (lane = 4 g + t).
template <bool F16> inline void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    WarpState& w = my_warp();
    const int lane = lane_id();
    for (int i = 0; i < 4; ++i) w.u[lane][i] = a[i];
    w.u[lane][4] = b[0];
    w.u[lane][5] = b[1];
    w.bar.wait();
    auto cvt = [](uint16_t x) { return F16 ? host_f16_to_f32(x) : host_bf16_to_f32(x); };
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        const uint32_t* s = w.u[l];
        A[g][2 * t] = cvt(lo16(s[0]));
        A[g][2 * t + 1] = cvt(hi16(s[0]));
        A[g + 8][2 * t] = cvt(lo16(s[1]));
        A[g + 8][2 * t + 1] = cvt(hi16(s[1]));
        A[g][2 * t + 8] = cvt(lo16(s[2]));
        A[g][2 * t + 9] = cvt(hi16(s[2]));
        A[g + 8][2 * t + 8] = cvt(lo16(s[3]));
        A[g + 8][2 * t + 9] = cvt(hi16(s[3]));
        B[2 * t][g] = cvt(lo16(s[4]));
        B[2 * t + 1][g] = cvt(hi16(s[4]));
        B[2 * t + 8][g] = cvt(lo16(s[5]));
        B[2 * t + 9][g] = cvt(hi16(s[5]));
    }
    w.bar.wait();
    const int g = lane >> 2, t = lane & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; ++e) {
        double acc = 0;
        for (int kk = 0; kk < 16; ++kk) acc += (double)A[rows[e]][kk] * B[kk][cols[e]];
        d[e] += (float)acc;
    }
}

// Runs `kernel` over the grid, one block after another, each block's threads in parallel.
inline void launch(dim3 grid, unsigned threads, size_t smem_bytes, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::vector<unsigned char> smem_fill(smem_bytes, 0xff);  // NaN patterns: unwritten reads show
            unsigned char* smem = (unsigned char*)malloc(smem_bytes);
            memcpy(smem, smem_fill.data(), smem_bytes);
            Barrier bar(threads);
            std::vector<WarpState> warps(threads / 32);
            g_block = {smem, smem_bytes, &bar, warps.data()};
            std::vector<std::thread> ts;
            for (unsigned tx = 0; tx < threads; ++tx)
                ts.emplace_back([&, tx] {
                    threadIdx = {tx, 0, 0};
                    blockIdx = {bx, by, 0};
                    kernel();
                    t_committed.clear();
                });
            for (auto& th : ts) th.join();
            free(smem);
        }
}
