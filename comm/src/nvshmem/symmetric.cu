// Zero-copy all-reduce of a buffer on the symmetric heap (`NvshmemHeap::all_reduce`): every
// PE's copy of the buffer is reachable by load/store through nvshmem_ptr, so no staging slot
// and no local copy is needed. One pass per element, in place:
//   1. `ready` exchange: every peer's kernel has started, so its stream's earlier work (which
//      wrote its input) is complete; the peers passed the same buffer (ox_desc_match);
//   2. PE q owns the sub-shard q of each block's packs: it loads that part of every PE's copy
//      (its own from HBM, the peers' over NVLink), reduces in PE order, and stores the result
//      into every copy (its own and, over NVLink, the peers');
//   3. `done` exchange: the peers' stores into this copy are visible before the kernel ends.
// Each element is read and written by one thread of one PE, which reads every copy before it
// writes any, so in place is safe. Two-shot with user buffers moves the same NVLink bytes but
// also copies the peers' sub-shards out of the staging slots and runs in windows; this does
// neither. (After common.cu and collectives.cu: ox_exchange.)
//
// `bufs[p]` is member p's copy as seen here (bufs[me] the local one), `count` its elements.

#define OX_SYMM_UNROLL (OxReduceUnroll<typename E::raw>::n)

// Packs [k, k + U * bd) (stride bd) reduced over every member's copy, in PE order.
template <typename E, int U>
__device__ __forceinline__ void ox_symm_reduce(const CollArgs& a, long long k, long long bd, uint4* v) {
    ox_reduce_members<E, U>(a, k, bd, v, [&](int p) { return (const uint4*)a.bufs[p]; });
}

// Element i reduced over every member's copy (the scalar path: unaligned or partial packs).
template <typename E>
__device__ __forceinline__ typename E::raw ox_symm_element(const CollArgs& a, long long i) {
    typedef typename E::raw R;
    float acc = E::to_f(((volatile const R*)a.bufs[0])[i]);
    for (int p = 1; p < a.npes; ++p) acc = ox_combine(a.op, acc, E::to_f(((volatile const R*)a.bufs[p])[i]));
    return E::from_f(a.op == OX_AVG ? acc / (float)a.npes : acc);
}

template <typename E>
__device__ void ox_symm_all_reduce(const CollArgs& a) {
    typedef typename E::raw R;
    const long long EPP = 16 / sizeof(R);
    const long long npacks = (a.count + EPP - 1) / EPP;
    const long long p0 = ox_pack_split(npacks, gridDim.x, blockIdx.x);
    const long long p1 = ox_pack_split(npacks, gridDim.x, blockIdx.x + 1);
    ox_desc_publish(a);
    if (!ox_exchange(a, a.ready)) return;
    if (!ox_desc_match(a)) return;
    const long long len = p1 - p0;
    const long long s0 = p0 + ox_pack_split(len, a.npes, a.me), s1 = p0 + ox_pack_split(len, a.npes, a.me + 1);
    const long long bd = blockDim.x;
    // Whole 16-byte packs go vectorised; only a last partial pack (or an unaligned buffer)
    // goes element by element.
    const long long whole = a.aligned ? a.count / EPP : 0;
    const long long v1 = min(s1, max(s0, whole));
    long long k = s0 + threadIdx.x;
    for (; k + (OX_SYMM_UNROLL - 1) * bd < v1; k += OX_SYMM_UNROLL * bd) {
        uint4 v[OX_SYMM_UNROLL];
        ox_symm_reduce<E, OX_SYMM_UNROLL>(a, k, bd, v);
        for (int p = 0; p < a.npes; ++p) {
            uint4* dst = (uint4*)a.bufs[p];
#pragma unroll
            for (int j = 0; j < OX_SYMM_UNROLL; ++j) dst[k + j * bd] = v[j];
        }
    }
    // A remainder too short to unroll (all of a block's share in mid sizes): one pack at a time.
    for (; k < v1; k += bd) {
        uint4 v;
        ox_symm_reduce<E, 1>(a, k, bd, &v);
        for (int p = 0; p < a.npes; ++p) ((uint4*)a.bufs[p])[k] = v;
    }
    for (; k < s1; k += bd) {
        for (long long i = k * EPP; i < min((k + 1) * EPP, a.count); ++i) {
            R v = ox_symm_element<E>(a, i);
            for (int p = 0; p < a.npes; ++p) ((R*)a.bufs[p])[i] = v;
        }
    }
    ox_exchange(a, a.done);
}
