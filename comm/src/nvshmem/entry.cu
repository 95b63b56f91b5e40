// The kernels' entry points (appended last to collectives.cu, ll.cu and symmetric.cu by
// device_code.rs): one per dtype, dispatching on the mode.

// Programmatic dependent launch (Hopper): launched with that attribute, a collective may be
// scheduled while the previous one on the stream finishes; it waits here until that one is
// complete and its memory visible, and at once lets the next one be scheduled in turn. This
// hides the gap between back-to-back collectives. Without the attribute both are no-ops.
__device__ __forceinline__ void ox_dependent_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The launch counters (`counters`, device memory of this PE): row 0 counts every launch (the
// epoch: the same on every PE, as every PE makes the same launches), row 1 + k the launches on
// team k (their parity picks the staging set: see collectives.cu on why two sets suffice).
// Each row has a column per block, so no block waits for another or shares an atomic: thread 0
// of block b reads its column and stores it advanced at once (no one else touches it in this
// launch), and block 0 also advances the columns of the blocks this launch does not have.
// Every column of a row thus holds the same count between launches, and the next launch reads
// them only once this one is complete (stream order, or griddepcontrol.wait under dependent
// launch). Storing at the start keeps the stores off the launch's tail (storing at the end cost
// the low-latency path 0.2 us a call; a column per warp, whose filling made block 0 store 16
// values a thread, cost 0.9 us). Counting on the device, not passing the epoch from the host,
// is what lets a CUDA graph replay a collective. (The low-latency kernel counts apart: ll.cu.)
__device__ __forceinline__ unsigned long long* ox_counter(unsigned long long counters, int row, int block) {
    return (unsigned long long*)counters + (size_t)row * OX_MAX_BLOCKS + block;
}

// Block 0's part: the columns of the blocks this launch does not have (out of line: it keeps
// the callers' registers free).
__device__ __noinline__ void ox_counters_fill(unsigned long long counters, int kind, unsigned long long epoch,
                                              unsigned long long launches) {
    unsigned long long* epoch_row = ox_counter(counters, 0, 0);
    unsigned long long* team_row = ox_counter(counters, 1 + kind, 0);
    for (unsigned b = gridDim.x + threadIdx.x; b < OX_MAX_BLOCKS; b += blockDim.x) {
        epoch_row[b] = epoch;
        team_row[b] = launches;
    }
}

// This launch's epoch (ox_s_epoch) and staging set (ox_s_bufs) for every thread of the block.
// Thread 0 takes the counters and fills in both before the one barrier; block 0 then also
// advances the columns of the blocks this launch does not have.
template <int M>
__device__ __forceinline__ void ox_counters_take(const CollArgs& a) {
    __shared__ unsigned long long s_launches;
    if (threadIdx.x == 0) {
        unsigned long long* e = ox_counter(a.counters, 0, blockIdx.x);
        unsigned long long* l = ox_counter(a.counters, 1 + a.kind, blockIdx.x);
        // Through L2 (__ldcg): an SM's L1 may still hold what an earlier launch read here.
        const unsigned long long ev = __ldcg(e) + 1, lv = __ldcg(l) + 1;
        *e = ev;
        *l = lv;
        ox_s_epoch = ev;
        s_launches = lv;
        // Set 1 follows set 0. A symmetric buffer (OX_SYMM) is read in place: bufs are its copies.
        const unsigned long long set = M == OX_SYMM ? 0 : (lv & 1) * a.slot_bytes * (unsigned long long)a.npes;
#pragma unroll
        for (int m = 0; m < OX_MAX_PES; ++m) ox_s_bufs[m] = a.bufs[m] + set;
    }
    __syncthreads();
    if (blockIdx.x == 0) ox_counters_fill(a.counters, a.kind, ox_s_epoch, s_launches);
}

// One kernel per algorithm family and dtype (mode M: OX_LL, OX_SYMM, or any other for
// ox_collective): compiled apart, each gets the registers it needs alone; in one kernel the
// families' register needs added up and the bf16 and f16 kernels spilled.
template <typename E, int M>
__device__ __forceinline__ void ox_entry(const CollArgs& a) {
    ox_dependent_launch();
    if (M == OX_LL) {
        // Counts on counters of its own, one per thread (ll.cu).
        ox_ll_all_reduce<E>(a);
        return;
    }
    ox_counters_take<M>(a);
    if (M == OX_SYMM) ox_symm_all_reduce<E>(a);
    else ox_collective<E>(a);
}

// Launched with OX_THREADS threads per block (kernels.rs THREADS); the bound keeps the register
// count low enough for that block size. Names: oxtrain_nvshmem_coll_[ll_|symm_]<dtype>.
#define OX_THREADS 512
#define OX_KERNEL(name, E, M) \
    extern "C" __global__ void __launch_bounds__(OX_THREADS) oxtrain_nvshmem_coll_##name(CollArgs a) { ox_entry<E, M>(a); }
#define OX_KERNELS(dtype, E)                    \
    OX_KERNEL(dtype, E, OX_ONESHOT)             \
    OX_KERNEL(ll_##dtype, E, OX_LL)             \
    OX_KERNEL(symm_##dtype, E, OX_SYMM)
OX_KERNELS(f32, F32)
OX_KERNELS(bf16, BF16)
OX_KERNELS(f16, F16)

// Empty kernels for `NvshmemCommunicator::launch_probe`: the driver's cost of a launch with the
// collectives' argument block, and with one pointer.
extern "C" __global__ void oxtrain_nvshmem_coll_nop(CollArgs a) {}
extern "C" __global__ void oxtrain_nvshmem_coll_nop8(unsigned long long a) {}
