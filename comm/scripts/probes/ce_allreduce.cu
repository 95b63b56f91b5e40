// Prototype of a copy-engine all-reduce on 2 GPUs (one process here; the mechanics are those of
// two processes on peer-mapped memory): copy engines move every NVLink byte, a small persistent
// kernel adds, stream memory operations (write/wait value) carry the flags. Per chunk c:
//   stream A: copy my part of the peer's half into its scratch, raise arrived[c] on the peer;
//   reducer:  wait arrived[c], add the scratch into my half, count itself done[c];
//   stream B: wait done[c] from every block, copy my reduced part into the peer's copy, raise
//             gathered[c] on the peer; finally wait every gathered[c] of mine.
// It checks the result once per configuration and prints busbw (nccl-tests: size / time on 2
// GPUs) and, for the copies alone ("phase-1 copies only"), GB/s per direction.
// Build and run: nvcc -O3 -arch=sm_90 ce_allreduce.cu -lcuda && ./a.out
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)
#define DK(x) do { CUresult e = (x); if (e) { printf("%s:%d %d\n", #x, __LINE__, (int)e); exit(1); } } while (0)
#include <algorithm>
#include <cstdlib>
// Block b of G adds its part of every chunk as the chunk lands: x[i] += scratch[i]; counts
// itself done on done[c] (the CE stream waits for G * epoch there).
__global__ void reducer(float4* x, const float4* scratch, long long chunk4, int nch, long long n4,
                        volatile unsigned* arrived, unsigned* done, unsigned epoch) {
    const long long bd = blockDim.x, stride = (long long)gridDim.x * bd * 4;
    for (int c = 0; c < nch; ++c) {
        if (threadIdx.x == 0) { while (arrived[c] < epoch) {} }
        __syncthreads();
        __threadfence();
        long long lo = c * chunk4, hi = min(n4, lo + chunk4);
        for (long long i = lo + blockIdx.x * bd * 4 + threadIdx.x; i < hi; i += stride) {
            float4 a[4], b[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) if (i + j * bd < hi) { a[j] = x[i + j * bd]; b[j] = __ldcv(scratch + i + j * bd); }
#pragma unroll
            for (int j = 0; j < 4; ++j) if (i + j * bd < hi) x[i + j * bd] = make_float4(a[j].x + b[j].x, a[j].y + b[j].y, a[j].z + b[j].z, a[j].w + b[j].w);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(done + c, 1u);
    }
}
__global__ void init(float* x, long long n, int m) { for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) x[i] = (float)((i % 1000) * m); }
__global__ void check(const float* x, long long n, int m, unsigned long long* bad) { for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) if (x[i] != (float)((i % 1000) * m)) atomicAdd(bad, 1ull); }
__global__ void hold(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }
int main(int argc, char** argv) {
    const long long SMAX = 1LL << 30;
    float *x[2], *scr[2]; unsigned *fl[2];  // flags: arrived[1024], done[1024], gathered[1024]
    cudaStream_t main_s[2], A[2], B[2], R[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d)); CK(cudaDeviceEnablePeerAccess(1 - d, 0));
        CK(cudaMalloc(&x[d], SMAX)); CK(cudaMalloc(&scr[d], SMAX / 2)); CK(cudaMalloc(&fl[d], 3 * 1024 * 4));
        CK(cudaMemset(fl[d], 0, 3 * 1024 * 4));
        cudaStreamCreateWithFlags(&main_s[d], cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&A[d], cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&B[d], cudaStreamNonBlocking); cudaStreamCreateWithFlags(&R[d], cudaStreamNonBlocking);
    }
    unsigned epoch = 0;
    
    long long sizes[] = {256LL << 20, 1LL << 30};
    long long chunks[] = {8LL << 20, 32LL << 20, 64LL << 20};
    int grids[] = {32, 64};
    for (long long S : sizes) for (long long CH : chunks) for (int G : grids) for (int aonly = 0; aonly <= (G == 32); ++aonly) {
        for (int d = 0; d < 2; ++d) { cudaSetDevice(d); CK(cudaDeviceSynchronize()); CK(cudaMemset(fl[d], 0, 3 * 1024 * 4)); CK(cudaDeviceSynchronize()); }
        epoch = 0;
        long long n = S / 4, half = n / 2, ch = CH / 2 / 4;  // elements: half-chunk per chunk
        int nch = (half + ch - 1) / ch;
        if (nch > 1024) continue;
        float ts[9];
        for (int it = 0; it < 9; ++it) {
            ++epoch;
            if (it == 0) for (int d = 0; d < 2; ++d) {
                cudaSetDevice(d);
                init<<<264, 512>>>(x[d], n, d + 1); CK(cudaDeviceSynchronize());
            }
            cudaEvent_t t0[2], t1[2];
            for (int d = 0; d < 2; ++d) {
                int p = 1 - d;
                cudaSetDevice(d);
                cudaEventCreate(&t0[d]); cudaEventCreate(&t1[d]);
                cudaEvent_t fork; cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
                hold<<<1, 1, 0, main_s[d]>>>(40000000LL); cudaEventRecord(t0[d], main_s[d]); cudaEventRecord(fork, main_s[d]);
                cudaStreamWaitEvent(A[d], fork); cudaStreamWaitEvent(B[d], fork); cudaStreamWaitEvent(R[d], fork);
                unsigned *arr_p = fl[p], *gat_p = fl[p] + 2048, *done_d = fl[d] + 1024, *arr_d = fl[d], *gat_d = fl[d] + 2048;
                for (int c = 0; c < nch; ++c) {
                    long long lo = c * ch, len = std::min(half, lo + ch) - lo;
                    cudaStream_t a = A[d];
                    CK(cudaMemcpyAsync(scr[p] + lo, x[d] + p * half + lo, len * 4, cudaMemcpyDeviceToDevice, a));
                    DK(cuStreamWriteValue32((CUstream)a, (CUdeviceptr)(arr_p + c), epoch, 0));
                }
                if (!aonly) {
                reducer<<<G, 512, 0, R[d]>>>((float4*)(x[d] + d * half), (const float4*)scr[d], ch / 4, nch, half / 4, arr_d, done_d, epoch);
                for (int c = 0; c < nch; ++c) {
                    long long lo = c * ch, len = std::min(half, lo + ch) - lo;
                    DK(cuStreamWaitValue32((CUstream)B[d], (CUdeviceptr)(done_d + c), (unsigned)G * epoch, CU_STREAM_WAIT_VALUE_GEQ));
                    CK(cudaMemcpyAsync(x[p] + d * half + lo, x[d] + d * half + lo, len * 4, cudaMemcpyDeviceToDevice, B[d]));
                    DK(cuStreamWriteValue32((CUstream)B[d], (CUdeviceptr)(gat_p + c), epoch, 0));
                }
                for (int c = 0; c < nch; ++c) DK(cuStreamWaitValue32((CUstream)B[d], (CUdeviceptr)(gat_d + c), epoch, CU_STREAM_WAIT_VALUE_GEQ));
                } else {
                    for (int c = 0; c < nch; ++c) DK(cuStreamWaitValue32((CUstream)B[d], (CUdeviceptr)(arr_d + c), epoch, CU_STREAM_WAIT_VALUE_GEQ));
                }
                cudaEvent_t j; cudaEventCreateWithFlags(&j, cudaEventDisableTiming);
                cudaEventRecord(j, A[d]); cudaStreamWaitEvent(main_s[d], j);
                cudaEventRecord(j, R[d]); cudaStreamWaitEvent(main_s[d], j);
                cudaEventRecord(j, B[d]); cudaStreamWaitEvent(main_s[d], j);
                cudaEventRecord(t1[d], main_s[d]);
            }
            float t = 0;
            for (int d = 0; d < 2; ++d) { cudaSetDevice(d); CK(cudaEventSynchronize(t1[d])); float ms; cudaEventElapsedTime(&ms, t0[d], t1[d]); t = std::max(t, ms); }
            ts[it] = t;
            if (it == 0 && !aonly) for (int d = 0; d < 2; ++d) {  // check: x = sum of both ranks' inputs
                cudaSetDevice(d); unsigned long long* db; cudaMalloc(&db, 8); cudaMemset(db, 0, 8);
                check<<<264, 512>>>(x[d], n, 3, db); unsigned long long bad; CK(cudaMemcpy(&bad, db, 8, cudaMemcpyDeviceToHost));
                if (bad) printf("WRONG d%d: %llu\n", d, bad);
            }
        }
        std::sort(ts + 1, ts + 9);
        if (aonly) printf("S %4lld MB chunk %2lld MB phase-1 copies only: %.1f GB/s per direction\n", S >> 20, CH >> 20, S / 2 / (ts[5] * 1e-3) / 1e9);
        else printf("S %4lld MB chunk %2lld MB G %2d: busbw %.1f GB/s (median of 8)\n", S >> 20, CH >> 20, G, S / (ts[5] * 1e-3) / 1e9);
        fflush(stdout);
    }
}
