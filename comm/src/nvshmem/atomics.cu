// Atomics on the symmetric heap, for `SymmetricMemory::atomic_fetch_add` and
// `atomic_compare_swap` (appended to collectives.cu by device_code.rs). NVSHMEM's host library
// (3.4.5) exports host-initiated atomics but does not implement them, so the host launches this
// one-thread kernel, which calls NVSHMEM's device atomics (remote atomics over NVLink, or the
// proxy between nodes), and reads the old value back. Signed and unsigned elements share the
// unsigned calls: two's-complement addition and bitwise comparison are the same operation.

// Mirrored by `AtomicArgs` in comm/src/nvshmem/kernels.rs (48 bytes).
struct AtomicArgs {
    unsigned long long target;   // symmetric address of the element
    unsigned long long old;      // where the previous value is written (device memory)
    unsigned long long value;    // addend, or the value swapped in
    unsigned long long expected; // compare-swap: the value the element must hold
    int pe, kind, width, pad_;   // kind 0 fetch-add, 1 compare-swap; width 4 or 8 bytes
};
static_assert(sizeof(AtomicArgs) == 48, "AtomicArgs must match the Rust side");

extern "C" __global__ void oxtrain_nvshmem_coll_atomic(AtomicArgs a) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (a.width == 8) {
        uint64_t* t = (uint64_t*)a.target;
        uint64_t old = a.kind == 0 ? nvshmem_uint64_atomic_fetch_add(t, (uint64_t)a.value, a.pe)
                                   : nvshmem_uint64_atomic_compare_swap(t, (uint64_t)a.expected, (uint64_t)a.value, a.pe);
        *(uint64_t*)a.old = old;
    } else {
        uint32_t* t = (uint32_t*)a.target;
        uint32_t old = a.kind == 0 ? nvshmem_uint32_atomic_fetch_add(t, (uint32_t)a.value, a.pe)
                                   : nvshmem_uint32_atomic_compare_swap(t, (uint32_t)a.expected, (uint32_t)a.value, a.pe);
        *(uint32_t*)a.old = old;
    }
}
