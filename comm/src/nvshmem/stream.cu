// OX_STREAM: all_reduce for large messages, where the link must never idle (appended to
// collectives.cu by device_code.rs).
//
// One launch handles the whole tensor. Pusher block b pushes range b of this PE's input to
// every peer, chunk after chunk, and a reducer block reduces the same range as the peers' chunks
// land, so pushing (NVLink) and reducing (local memory) overlap instead of taking turns. Each (source PE, range) has a ring of `depth` chunks in slot `src` of this
// epoch's staging set on every PE:
//   ring(X, src, b, j) = bufs[X] + src * slot_bytes + (b * depth + j) * chunk_packs * 16.
// (The parity argument of collectives.cu covers the staging sets: this launch's pushers write
// only after every peer's reducer has started it, so the peers' previous launches are over.)
// Flow control is by signals whose values only grow: tag(s) = (epoch << 24) + s + 1 for
// chunk s of this launch, tag base (epoch << 24) = "nothing yet":
//   ready[b][src] on PE X: the last chunk of range b that src has pushed to X;
//   done[b][X] on PE src: the last chunk of range b that X has reduced out of its ring (a
//   credit: src may overwrite that ring slot), raised to the base when X's reducer starts (X's
//   previous launch, the last reader of the staging memory, is over);
//   ready[b][me] on PE me: local progress of this PE's own pusher (the reducer must not write
//   an in-place output before the pusher has read that input).
// Pushers end only when every peer has consumed all their chunks. Both halves of the grid must be resident at once (a pusher can
// wait on a reducer of the other PE, which waits on ours): the host keeps the grid within what
// the driver says stays resident.
// Needs 16-byte aligned input and output (the host checks); a last partial pack moves element
// by element.

#define OX_STREAM_TAG_BITS 24

// Pack k (of the whole tensor) from `base`, zero-padded past `count`.
template <typename R>
__device__ __forceinline__ uint4 ox_stream_load(const CollArgs& a, unsigned long long base, long long k) {
    const long long EPP = 16 / sizeof(R);
    if ((k + 1) * EPP <= a.count) return ((const uint4*)base)[k];
    uint4 v = make_uint4(0, 0, 0, 0);
    R* r = (R*)&v;
    for (long long i = k * EPP; i < a.count; ++i) r[i - k * EPP] = ((const R*)base)[i];
    return v;
}

template <typename R>
__device__ __forceinline__ void ox_stream_store(const CollArgs& a, unsigned long long base, long long k, uint4 v) {
    const long long EPP = 16 / sizeof(R);
    if ((k + 1) * EPP <= a.count) {
        ((uint4*)base)[k] = v;
        return;
    }
    const R* r = (const R*)&v;
    for (long long i = k * EPP; i < a.count; ++i) ((R*)base)[i] = r[i - k * EPP];
}

// The ring slot for chunk j of range b from source `src`, on the PE whose staging is `buf`.
__device__ __forceinline__ unsigned long long ox_ring(const CollArgs& a, unsigned long long buf, int src, int b, int j) {
    return buf + (unsigned long long)src * a.slot_bytes + ((unsigned long long)b * a.depth + j) * a.chunk_packs * 16;
}

// Packs per thread of one pusher chunk, held in registers: the host keeps chunk_packs at most
// OX_PUSH_REGS * blockDim.x.
#define OX_PUSH_REGS 8

// Loads this thread's packs of chunk [q0, q1) of the input into v.
template <typename R>
__device__ __forceinline__ void ox_stream_fetch(const CollArgs& a, long long q0, long long q1, uint4* v) {
#pragma unroll
    for (int u = 0; u < OX_PUSH_REGS; ++u) {
        const long long k = q0 + threadIdx.x + (long long)u * blockDim.x;
        if (k < q1) v[u] = ox_stream_load<R>(a, a.in_base, k);
    }
}

// Stores this thread's packs v of chunk [q0, q1) into ring slot j of range b on every peer.
template <typename R>
__device__ __forceinline__ void ox_stream_send(const CollArgs& a, int b, long long q0, long long q1, int j,
                                               const uint4* v) {
    for (int p = 0; p < a.npes; ++p) {
        if (p == a.me) continue;
        uint4* ring = (uint4*)ox_ring(a, ox_buf(a, p), a.me, b, j);
#pragma unroll
        for (int u = 0; u < OX_PUSH_REGS; ++u) {
            const long long k = q0 + threadIdx.x + (long long)u * blockDim.x;
            if (k < q1) ring[k - q0] = v[u];
        }
    }
}

// Reduces packs [q0, q1) of range b in PE order: this PE's input and the peers' ring slots,
// OX_UNROLL packs per thread loaded before any is combined (the loads are the latency).
template <typename E>
__device__ __forceinline__ void ox_stream_reduce(const CollArgs& a, int b, long long q0, long long q1, int j) {
    typedef typename E::raw R;
    const int EPP = 16 / sizeof(R);
    const long long bd = blockDim.x;
    for (long long k0 = q0 + threadIdx.x; k0 < q1; k0 += OX_UNROLL * bd) {
        float acc[OX_UNROLL][16 / sizeof(R)];
        for (int p = 0; p < a.npes; ++p) {
            uint4 v[OX_UNROLL];
            const uint4* ring = (const uint4*)ox_ring(a, ox_buf(a, a.me), p, b, j);
#pragma unroll
            for (int u = 0; u < OX_UNROLL; ++u) {
                const long long k = k0 + u * bd;
                if (k < q1) v[u] = p == a.me ? ox_stream_load<R>(a, a.in_base, k) : __ldcv(ring + (k - q0));
            }
#pragma unroll
            for (int u = 0; u < OX_UNROLL; ++u) {
                const R* r = (const R*)&v[u];
#pragma unroll
                for (int e = 0; e < EPP; ++e)
                    acc[u][e] = p == 0 ? E::to_f(r[e]) : ox_combine(a.op, acc[u][e], E::to_f(r[e]));
            }
        }
#pragma unroll
        for (int u = 0; u < OX_UNROLL; ++u) {
            const long long k = k0 + u * bd;
            if (k >= q1) continue;
            uint4 out;
            R* o = (R*)&out;
#pragma unroll
            for (int e = 0; e < EPP; ++e) o[e] = E::from_f(a.op == OX_AVG ? acc[u][e] / (float)a.npes : acc[u][e]);
            ox_stream_store<R>(a, a.out_base, k, out);
        }
    }
}

// Range g of the packs (ox_pack_split(npacks, pushers, g)), and its chunk count.
struct OxRange {
    long long r0, r1, nchunks;
};
__device__ __forceinline__ OxRange ox_range(const CollArgs& a, long long npacks, int pushers, int g) {
    OxRange r;
    r.r0 = ox_pack_split(npacks, pushers, g);
    r.r1 = ox_pack_split(npacks, pushers, g + 1);
    r.nchunks = (r.r1 - r.r0 + a.chunk_packs - 1) / a.chunk_packs;
    return r;
}

template <typename E>
__device__ void ox_stream_all_reduce(const CollArgs& a) {
    typedef typename E::raw R;
    const long long EPP = 16 / sizeof(R);
    // Blocks [0, pushers) push range b each; blocks [pushers, grid) reduce ranges r, r + reducers,
    // ... in turn (a reducer's work is local and lighter, so fewer of them leave more SMs to push).
    const int reducers = a.reducers;
    const int pushers = gridDim.x - reducers;
    const long long npacks = (a.count + EPP - 1) / EPP;
    const uint64_t base = (uint64_t)ox_epoch() << OX_STREAM_TAG_BITS;

    if ((int)blockIdx.x < pushers) {
        const int b = blockIdx.x;
        const OxRange rg = ox_range(a, npacks, pushers, b);
        const long long r0 = rg.r0, r1 = rg.r1, nchunks = rg.nchunks;
        // A software pipeline: chunk s + 1 is loaded into registers while chunk s's stores
        // drain and are fenced, so the input's load latency and the fence overlap.
        uint4 v[OX_PUSH_REGS];
        if (nchunks > 0) ox_stream_fetch<R>(a, r0, min(r0 + a.chunk_packs, r1), v);
        for (long long s = 0; s < nchunks; ++s) {
            const int j = (int)(s % a.depth);
            bool ok = true;
            if (threadIdx.x == 0) {
                const uint64_t credit = base + (s >= a.depth ? s - a.depth + 1 : 0);
                for (int p = 0; p < a.npes && ok; ++p)
                    if (p != a.me) ok = ox_wait_ge(a, ox_sig(a, a.done, b, p), credit, p);
            }
            if (!ox_block_ok(ok)) return;
            const long long q0 = r0 + s * a.chunk_packs, q1 = min(q0 + a.chunk_packs, r1);
            ox_stream_send<R>(a, b, q0, q1, j, v);
            // One fence after the barrier covers the whole block's stores (the barrier orders
            // them before it, and the fence is cumulative), as NCCL posts its flags.
            __syncthreads();
            if (s + 1 < nchunks) ox_stream_fetch<R>(a, q1, min(q1 + a.chunk_packs, r1), v);
            if (threadIdx.x == 0) {
                __threadfence_system();
                for (int p = 0; p < a.npes; ++p)
                    if (p != a.me) nvshmemx_signal_op(ox_sig(a, a.ready, b, a.me), base + s + 1, NVSHMEM_SIGNAL_SET, a.pes[p]);
                *(volatile uint64_t*)ox_sig(a, a.ready, b, a.me) = base + s + 1;
            }
        }
        // Drain: every peer has reduced every chunk we pushed (and, with nothing to push, has
        // at least started this launch).
        if (threadIdx.x == 0)
            for (int p = 0; p < a.npes; ++p)
                if (p != a.me && !ox_wait_ge(a, ox_sig(a, a.done, b, p), base + nchunks, p)) break;
        return;
    }

    // Reducer: grant the peers the rings of our ranges, then consume their chunks round-robin
    // (chunk s of every range before chunk s + 1 of any, so every pusher keeps moving).
    const int r = blockIdx.x - pushers;
    long long most = 0;
    for (int g = r; g < pushers; g += reducers) {
        most = max(most, ox_range(a, npacks, pushers, g).nchunks);
        if (threadIdx.x == 0)
            for (int p = 0; p < a.npes; ++p)
                if (p != a.me) nvshmemx_signal_op(ox_sig(a, a.done, g, a.me), base, NVSHMEM_SIGNAL_SET, a.pes[p]);
    }
    for (long long s = 0; s < most; ++s) {
        const int j = (int)(s % a.depth);
        for (int g = r; g < pushers; g += reducers) {
            const OxRange rg = ox_range(a, npacks, pushers, g);
            if (s >= rg.nchunks) continue;
            bool ok = true;
            if (threadIdx.x == 0) {
                for (int p = 0; p < a.npes && ok; ++p)
                    if (p != a.me) ok = ox_wait_ge(a, ox_sig(a, a.ready, g, p), base + s + 1, p);
                // Our own pusher (it gives up too when its peers never come).
                ok = ok && ox_wait_ge(a, ox_sig(a, a.ready, g, a.me), base + s + 1, a.me);
                __threadfence_system();
            }
            if (!ox_block_ok(ok)) return;
            const long long q0 = rg.r0 + s * a.chunk_packs, q1 = min(q0 + a.chunk_packs, rg.r1);
            ox_stream_reduce<E>(a, g, q0, q1, j);
            __syncthreads();
            if (threadIdx.x == 0)
                for (int p = 0; p < a.npes; ++p)
                    if (p != a.me) nvshmemx_signal_op(ox_sig(a, a.done, g, a.me), base + s + 1, NVSHMEM_SIGNAL_SET, a.pes[p]);
        }
    }
}
