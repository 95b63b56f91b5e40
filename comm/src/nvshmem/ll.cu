// OX_LL: all_reduce for small messages, where latency is everything (appended to
// collectives.cu by device_code.rs).
//
// The low-latency protocol of NCCL's LL, on NVSHMEM's symmetric heap: every 16-byte line a PE
// stores into a peer's LL slot carries 8 bytes of data and, beside each 4 bytes, the epoch as a
// flag: {data0, epoch, data1, epoch}. An 8-byte half arrives whole, so a reader that sees the
// epoch in both flags has both halves of the data. No fence, no signal, no barrier: each
// thread pushes its lines to every peer with plain (posted) NVLink stores, then spins on the
// same lines of its own slots until the flags read this epoch, reduces in PE order and writes
// the output. The whole exchange is one NVLink crossing.
// Slots come in two sets by epoch parity (see the header of collectives.cu for why two are
// enough); flags are the low 32 bits of the epoch, and a set is written again only two epochs
// later, so a stale line never carries the flag being waited for.

template <typename R>
__device__ __forceinline__ bool ox_ll_whole(const CollArgs& a, long long i0) {
    return a.aligned && i0 + (long long)(8 / sizeof(R)) <= a.win_hi;
}

// The 8 data bytes of line k (global elements from win_lo + k * 8 / sizeof(R)), zero-padded
// past the window.
template <typename R>
__device__ __forceinline__ uint2 ox_ll_load(const CollArgs& a, unsigned long long base, long long k) {
    const long long EPL = 8 / sizeof(R);
    const long long i0 = a.win_lo + k * EPL;
    if (ox_ll_whole<R>(a, i0)) return *(const uint2*)(base + i0 * sizeof(R));
    uint2 v = make_uint2(0, 0);
    R* r = (R*)&v;
    for (long long i = i0; i < min(i0 + EPL, a.win_hi); ++i) r[i - i0] = ((const R*)base)[i];
    return v;
}

template <typename R>
__device__ __forceinline__ void ox_ll_store(const CollArgs& a, unsigned long long base, long long k, uint2 v) {
    const long long EPL = 8 / sizeof(R);
    const long long i0 = a.win_lo + k * EPL;
    if (ox_ll_whole<R>(a, i0)) {
        *(uint2*)(base + i0 * sizeof(R)) = v;
        return;
    }
    const R* r = (const R*)&v;
    for (long long i = i0; i < min(i0 + EPL, a.win_hi); ++i) ((R*)base)[i] = r[i - i0];
}

__device__ __forceinline__ void ox_ll_put(unsigned long long line, uint2 v, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(v.x), "r"(flag),
                 "r"(v.y), "r"(flag)
                 : "memory");
}

__device__ __forceinline__ void ox_ll_read(unsigned long long line, unsigned* d0, unsigned* f0, unsigned* d1, unsigned* f1) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(*d0), "=r"(*f0), "=r"(*d1), "=r"(*f1)
                 : "l"(line)
                 : "memory");
}

__device__ __noinline__ bool ox_ll_take_slow(OxWaitCtx c, unsigned long long line, unsigned flag, uint2* v) {
    unsigned d0, f0, d1, f1;
    const unsigned long long t0 = ox_now();
    for (unsigned n = 1;; ++n) {
        ox_ll_read(line, &d0, &f0, &d1, &f1);
        if (f0 == flag && f1 == flag) break;
        if ((n & 1023) == 0 && ox_now() - t0 > c.timeout_ns) {
            ox_record_fault(c, OX_FAULT_TIMEOUT);
            return false;
        }
    }
    *v = make_uint2(d0, d1);
    return true;
}

// Waits until line carries `flag` in both halves and gives its data; false once that has
// taken longer than the timeout (recorded for the host; see ox_wait_ge): member m never came.
__device__ __forceinline__ bool ox_ll_take(const CollArgs& a, unsigned long long line, unsigned long long epoch, int m,
                                           uint2* v) {
    const unsigned flag = (unsigned)epoch;
    unsigned d0, f0, d1, f1;
    ox_ll_read(line, &d0, &f0, &d1, &f1);
    if (f0 == flag && f1 == flag) {
        *v = make_uint2(d0, d1);
        return true;
    }
    OxWaitCtx c = ox_wait_ctx(a, m);
    c.epoch = epoch;
    return ox_ll_take_slow(c, line, flag, v);
}

// The launch count of this thread (a counter per thread of the grid, after the other launch
// counters: see entry.cu). A thread handles the same lines in every launch (line k goes to
// thread k mod (blocks x threads), and the block count depends only on the message size and
// the communicator's fixed cap), so a thread's own count can be its flag and pick its staging
// set: the same thread on the peer has made the same launches and counted the same, a line is
// only ever written by one thread of each PE, and that thread writes a set again only two of
// its own launches later, when the reader of that set has finished (see collectives.cu).
// Nothing is shared between threads: no barrier, no block filling in for others.
__device__ __forceinline__ unsigned long long* ox_ll_counter(const CollArgs& a) {
    return (unsigned long long*)a.counters + OX_LL_COUNTER_BASE + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

template <typename E>
__device__ void ox_ll_all_reduce(const CollArgs& a) {
    typedef typename E::raw R;
    const int EPL = 8 / sizeof(R);
    const long long lines = (a.win_hi - a.win_lo + EPL - 1) / EPL;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned long long* counter = ox_ll_counter(a);
    // Through L2 (__ldcg): an SM's L1 may still hold what an earlier launch read here. Stored
    // advanced at once: only this thread reads it in this launch.
    const unsigned long long epoch = __ldcg(counter) + 1;
    *counter = epoch;
    const unsigned long long set = (epoch & 1) * a.slot_bytes * (unsigned long long)a.npes;
    const unsigned flag = (unsigned)epoch;
    // 1. Push: line k of this PE's input to line k of slot `me` on every peer.
    for (long long k = first; k < lines; k += stride) {
        uint2 v = ox_ll_load<R>(a, a.in_base, k);
        for (int p = 0; p < a.npes; ++p)
            if (p != a.me) ox_ll_put(a.bufs[p] + set + (unsigned long long)a.me * a.slot_bytes + k * 16, v, flag);
    }
    // 2. Reduce the same lines in PE order once every peer's have landed.
    for (long long k = first; k < lines; k += stride) {
        float acc[8 / sizeof(R)];
        for (int p = 0; p < a.npes; ++p) {
            uint2 v;
            if (p == a.me) v = ox_ll_load<R>(a, a.in_base, k);
            else if (!ox_ll_take(a, a.bufs[a.me] + set + (unsigned long long)p * a.slot_bytes + k * 16, epoch, p, &v))
                return;
            const R* r = (const R*)&v;
#pragma unroll
            for (int j = 0; j < EPL; ++j) acc[j] = p == 0 ? E::to_f(r[j]) : ox_combine(a.op, acc[j], E::to_f(r[j]));
        }
        uint2 out;
        R* o = (R*)&out;
#pragma unroll
        for (int j = 0; j < EPL; ++j) o[j] = E::from_f(a.op == OX_AVG ? acc[j] / (float)a.npes : acc[j]);
        ox_ll_store<R>(a, a.out_base, k, out);
    }
}
