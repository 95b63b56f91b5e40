// The kernels' entry points (appended last to collectives.cu, ll.cu, stream.cu and symmetric.cu by
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

template <typename E>
__device__ void ox_entry(const CollArgs& a) {
    ox_dependent_launch();
    if (a.mode == OX_LL) ox_ll_all_reduce<E>(a);
    else if (a.mode == OX_STREAM) ox_stream_all_reduce<E>(a);
    else if (a.mode == OX_SYMM) ox_symm_all_reduce<E>(a);
    else ox_collective<E>(a);
}

// Launched with OX_THREADS threads per block (kernels.rs THREADS); the bound keeps the register
// count low enough for that block size.
#define OX_THREADS 512
extern "C" __global__ void __launch_bounds__(OX_THREADS) oxtrain_nvshmem_coll_f32(CollArgs a) { ox_entry<F32>(a); }
extern "C" __global__ void __launch_bounds__(OX_THREADS) oxtrain_nvshmem_coll_bf16(CollArgs a) { ox_entry<BF16>(a); }
extern "C" __global__ void __launch_bounds__(OX_THREADS) oxtrain_nvshmem_coll_f16(CollArgs a) { ox_entry<F16>(a); }

// Empty kernels for `NvshmemCommunicator::launch_probe`: the driver's cost of a launch with the
// collectives' argument block, and with one pointer.
extern "C" __global__ void oxtrain_nvshmem_coll_nop(CollArgs a) {}
extern "C" __global__ void oxtrain_nvshmem_coll_nop8(unsigned long long a) {}
