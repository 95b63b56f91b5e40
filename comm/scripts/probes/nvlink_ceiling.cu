// What NVLink between two GPUs gives each way when both send at once, by the ways a kernel or
// the copy engines can move data. It bounds what an all-reduce on 2 GPUs can reach: every
// all-reduce moves the whole message across the link each way, so busbw (nccl-tests) is at most
// the per-direction figure of the pattern it uses.
//   push:    SM stores into the peer (loads local)             - all-writes traffic
//   pull:    SM loads from the peer (stores local)             - all-reads traffic
//   mixed:   each GPU loads its half from both, adds, stores both (oxtrain's one-pass symmetric
//            kernel, OX_SYMM; with 64 blocks or more the symmetric all-reduce pushes instead)
//   ce:      cudaMemcpyAsync to the peer, one 1 GiB copy each way (copy engines)
//   ce-flag: the same in chunks, each followed by a flag written to the peer (cuStreamWriteValue32),
//            as a copy-engine collective needs to tell the peer that a chunk landed
//   ce+push, ce+pull: both at once, on two streams: a share of the bytes by one copy to the
//            peer, the rest by SM stores into the peer (push) or by the peer's SM loads (pull).
//            If these beat both ce and push alone, the engines feeding the link are the limit
//            rather than the link, and an all-reduce splitting its traffic between copy engines
//            and SMs could pass either ceiling.
// Build and run (one process, both GPUs): nvcc -O3 -arch=sm_90 nvlink_ceiling.cu -lcuda && ./a.out
// Prints one JSON object per line: {"pattern", "blocks"/"chunk_mb", "gbps_per_direction"}.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { fprintf(stderr, "%s:%d %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)
#define DK(x) do { CUresult e = (x); if (e) { fprintf(stderr, "%s:%d CUresult %d\n", #x, __LINE__, (int)e); exit(1); } } while (0)

#define U 4  // 16-byte packs in flight per thread

__global__ void copy(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n) {
    const long long bd = blockDim.x, stride = (long long)gridDim.x * bd * U;
    for (long long k = blockIdx.x * bd * U + threadIdx.x; k < n; k += stride) {
        uint4 v[U];
#pragma unroll
        for (int j = 0; j < U; ++j) if (k + j * bd < n) v[j] = __ldcv(src + k + j * bd);
#pragma unroll
        for (int j = 0; j < U; ++j) if (k + j * bd < n) dst[k + j * bd] = v[j];
    }
}

__global__ void mixed(uint4* __restrict__ mine, uint4* __restrict__ peer, long long n) {
    const long long bd = blockDim.x, stride = (long long)gridDim.x * bd * U;
    for (long long k = blockIdx.x * bd * U + threadIdx.x; k < n; k += stride) {
        float4 a[U], b[U];
#pragma unroll
        for (int j = 0; j < U; ++j) if (k + j * bd < n) { a[j] = __ldcv((float4*)mine + k + j * bd); b[j] = __ldcv((float4*)peer + k + j * bd); }
#pragma unroll
        for (int j = 0; j < U; ++j) if (k + j * bd < n) {
            const float4 s = make_float4(a[j].x + b[j].x, a[j].y + b[j].y, a[j].z + b[j].z, a[j].w + b[j].w);
            ((float4*)mine)[k + j * bd] = s;
            ((float4*)peer)[k + j * bd] = s;
        }
    }
}

// Spins until the host raises `go` to `tag` (pinned, mapped host memory).
__global__ void wait_go(volatile unsigned* go, unsigned tag) {
    while (*go < tag) {}
}

static const long long S = 1LL << 30;  // bytes each way
static uint4 *a[2], *b[2];
static unsigned* flags[2];
static cudaStream_t st[2];
static cudaEvent_t e0[2], e1[2];
static volatile unsigned* go;  // pinned host word: both GPUs start when the host raises it
static unsigned go_tag = 0;

// Median over 7 runs of the slower GPU's time (ms) of `enqueue(d)` issued on both GPUs at once.
template <typename F>
static float both_ways(F enqueue) {
    float ts[7];
    for (int it = 0; it < 7; ++it) {
        // Everything is queued behind a wait on `go` first, so both GPUs start together and the
        // host's queueing is not timed.
        ++go_tag;
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            wait_go<<<1, 1, 0, st[d]>>>(go, go_tag);
            CK(cudaEventRecord(e0[d], st[d]));
            enqueue(d);
            CK(cudaEventRecord(e1[d], st[d]));
        }
        *go = go_tag;
        float t = 0;
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaEventSynchronize(e1[d]));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0[d], e1[d]));
            t = std::max(t, ms);
        }
        ts[it] = t;
    }
    std::sort(ts, ts + 7);
    return ts[3];
}

static double gbps(long long bytes, float ms) { return bytes / (ms * 1e-3) / 1e9; }

int main() {
    const long long n = S / 16;
    CK(cudaHostAlloc((void**)&go, 4, cudaHostAllocMapped | cudaHostAllocPortable));
    *go = 0;
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceEnablePeerAccess(1 - d, 0));
        CK(cudaMalloc(&a[d], S));
        CK(cudaMalloc(&b[d], S));
        CK(cudaMalloc(&flags[d], 4096 * 4));
        CK(cudaMemset(a[d], 0, S));
        CK(cudaMemset(b[d], 0, S));
        CK(cudaMemset(flags[d], 0, 4096 * 4));
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
        CK(cudaEventCreate(&e0[d]));
        CK(cudaEventCreate(&e1[d]));
    }
    const int threads = 512;
    for (int blocks : {16, 32, 64, 128, 132, 264}) {
        float t = both_ways([&](int d) { copy<<<blocks, threads, 0, st[d]>>>(a[d], b[1 - d], n); });
        printf("{\"pattern\": \"push\", \"blocks\": %d, \"gbps_per_direction\": %.1f}\n", blocks, gbps(S, t));
        t = both_ways([&](int d) { copy<<<blocks, threads, 0, st[d]>>>(a[1 - d], b[d], n); });
        printf("{\"pattern\": \"pull\", \"blocks\": %d, \"gbps_per_direction\": %.1f}\n", blocks, gbps(S, t));
        // Each GPU reads half from the peer and writes half to it: S bytes each way in all.
        t = both_ways([&](int d) { mixed<<<blocks, threads, 0, st[d]>>>(a[d] + d * (n / 2), a[1 - d] + d * (n / 2), n / 2); });
        printf("{\"pattern\": \"mixed\", \"blocks\": %d, \"gbps_per_direction\": %.1f}\n", blocks, gbps(S, t));
        fflush(stdout);
    }
    float t = both_ways([&](int d) { CK(cudaMemcpyAsync(b[1 - d], a[d], S, cudaMemcpyDeviceToDevice, st[d])); });
    printf("{\"pattern\": \"ce\", \"chunk_mb\": %lld, \"gbps_per_direction\": %.1f}\n", S >> 20, gbps(S, t));
    unsigned tag = 0;
    for (long long chunk : {4LL << 20, 16LL << 20, 64LL << 20}) {
        t = both_ways([&](int d) {
            ++tag;
            for (long long off = 0, c = 0; off < S; off += chunk, ++c) {
                CK(cudaMemcpyAsync((char*)b[1 - d] + off, (char*)a[d] + off, chunk, cudaMemcpyDeviceToDevice, st[d]));
                DK(cuStreamWriteValue32((CUstream)st[d], (CUdeviceptr)(flags[1 - d] + c), tag, 0));
            }
        });
        printf("{\"pattern\": \"ce-flag\", \"chunk_mb\": %lld, \"gbps_per_direction\": %.1f}\n", chunk >> 20, gbps(S, t));
        fflush(stdout);
    }
    cudaStream_t side[2];
    cudaEvent_t fork[2], join[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaStreamCreateWithFlags(&side[d], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&fork[d], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&join[d], cudaEventDisableTiming));
    }
    for (int pull = 0; pull < 2; ++pull) {
        for (int pct : {20, 35, 50, 65}) {
            for (int blocks : {32, 64, 132}) {
                const long long ce_packs = n * pct / 100, rest = n - ce_packs;
                t = both_ways([&](int d) {
                    // The copy runs on the side stream, forked after the start and joined before
                    // the end event, so both are timed together.
                    CK(cudaEventRecord(fork[d], st[d]));
                    CK(cudaStreamWaitEvent(side[d], fork[d], 0));
                    CK(cudaMemcpyAsync(b[1 - d], a[d], ce_packs * 16, cudaMemcpyDeviceToDevice, side[d]));
                    if (pull)  // this GPU loads the rest of the peer's share: the peer's bytes come here
                        copy<<<blocks, threads, 0, st[d]>>>(a[1 - d] + ce_packs, b[d] + ce_packs, rest);
                    else
                        copy<<<blocks, threads, 0, st[d]>>>(a[d] + ce_packs, b[1 - d] + ce_packs, rest);
                    CK(cudaEventRecord(join[d], side[d]));
                    CK(cudaStreamWaitEvent(st[d], join[d], 0));
                });
                printf("{\"pattern\": \"%s\", \"ce_percent\": %d, \"blocks\": %d, \"gbps_per_direction\": %.1f}\n",
                       pull ? "ce+pull" : "ce+push", pct, blocks, gbps(S, t));
                fflush(stdout);
            }
        }
    }
    return 0;
}
