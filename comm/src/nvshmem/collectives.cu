// oxtrain's NVSHMEM collectives: one kernel per dtype that serves all_reduce (one-shot and
// two-shot), reduce, reduce_scatter, all_gather, broadcast and barrier, on NVLink.
//
// Every PE owns staging buffers on the symmetric heap: two sets (picked by the parity of the
// team's launch count, which the kernels keep on the GPU: entry.cu), each
// with one slot per source PE. PEs write into each other's slots directly through the
// addresses nvshmem_ptr gives (stores over NVLink are posted: one crossing, no round trip).
// Per launch ("epoch", a number that only grows and is the same on every PE):
//   1. each block pushes its part of this PE's input into slot `me` of the peers that need it,
//   2. fences, raises its `ready` signal on every peer (value = epoch), waits for theirs,
//   3. one-shot: computes its part of this PE's output from its own input and the slots;
//      two-shot (all_reduce): step 1 pushed only each peer's sub-shard; this PE reduces its own
//      sub-shard, pushes the result to every peer, raises `done`, waits for theirs, and copies
//      the peers' reduced sub-shards from its slots into the output.
// Block b on every PE handles the same elements, so signals are per (block, source PE): a
// block only waits for the same block on the peers, blocks never wait for each other.
// Why two sets of slots are enough: a PE writes a set again two launches of the team later,
// only after its launch in between saw every peer's ready signal of that launch, which the
// peers raise only after their previous launch (the last reader of that set) finished.
//
// Elements travel as bit patterns (bf16/f16 as 16-bit words) and reduce in f32 in PE order
// 0..n-1, rounding once: the arithmetic of the CPU backends, so results match exactly.
// (After common.cu, which has the argument block and the waits.)

// Raises this block's `sig` signal on every peer and waits for every peer's. The barrier
// orders every thread's writes (local and remote) before thread 0's fence, which is cumulative,
// so they are visible before the signal. Members reached by puts got their signal with the
// data (put-with-signal) when `puts_signalled`. False when a peer never came (the kernel then
// returns).
__device__ bool ox_exchange(const CollArgs& a, unsigned long long sig_base, bool puts_signalled = false) {
    __syncthreads();
    bool ok = true;
    if (threadIdx.x == 0) {
        __threadfence_system();
        for (int p = 0; p < a.npes; ++p)
            if (p != a.me && !(puts_signalled && ox_by_put(a, p)))
                nvshmemx_signal_op(ox_sig(a, sig_base, blockIdx.x, a.me), (uint64_t)ox_epoch(), NVSHMEM_SIGNAL_SET, a.pes[p]);
        for (int p = 0; p < a.npes && ok; ++p)
            if (p != a.me) ok = ox_wait_ge(a, ox_sig(a, sig_base, blockIdx.x, p), (uint64_t)ox_epoch(), p);
        // Our own puts read the input in the background: they must be done before an in-place
        // output overwrites it.
        if (puts_signalled && a.put_mask) nvshmem_quiet();
        __threadfence_system();
    }
    return ox_block_ok(ok);
}

// The all-reduce of a buffer on the symmetric heap stores into the peers' copies at this PE's
// offset, so every PE must have passed the same buffer: a PE that passed another would have
// one of its other buffers overwritten. Each block therefore publishes what it was given (the
// buffer's offset from the signal array, a symmetric object, and its length) to every peer
// before its first signal, and compares what the peers published after it (a peer that ran an
// ordinary all-reduce instead published nothing for this epoch). The descriptors
// are a third array after the two signal arrays (connect.rs); a descriptor is rewritten only
// in the next call, after the peer's `done` signal, raised after its comparison.
// The descriptor also carries the epoch, so a descriptor left by an earlier call never matches
// (a peer running an ordinary all-reduce meanwhile publishes none).
__device__ __forceinline__ unsigned long long ox_desc_of(const CollArgs& a) {
    return (((a.out_base - a.ready) << 20) ^ (unsigned long long)a.count ^ ((unsigned long long)a.count << 44)) +
           ox_epoch() * 0x9E3779B97F4A7C15ull;
}
__device__ __forceinline__ uint64_t* ox_desc(const CollArgs& a, int block, int m) {
    return ox_sig(a, a.ready + 2 * (a.done - a.ready), block, m);
}
// The members' global PEs, a byte each (the symmetric modes run on one node of at most 8).
__device__ __forceinline__ unsigned long long ox_pes8(const CollArgs& a) {
    unsigned long long r = 0;
    for (int p = 0; p < a.npes; ++p) r |= (unsigned long long)(a.pes[p] & 0xff) << (8 * p);
    return r;
}
// Out of line, taking values only (as the slow waits), to spare the hot loops' registers.
__device__ __noinline__ void ox_desc_publish_slow(uint64_t* slot, unsigned long long v, int npes, int me,
                                                  unsigned long long pes8) {
    for (int p = 0; p < npes; ++p)
        if (p != me) nvshmem_uint64_p(slot, v, (int)((pes8 >> (8 * p)) & 0xff));
}
__device__ __noinline__ bool ox_desc_match_slow(OxWaitCtx c, volatile const uint64_t* row, unsigned long long v,
                                                int npes, int me, unsigned long long pes8) {
    for (int p = 0; p < npes; ++p) {
        const int pe = (int)((pes8 >> (8 * p)) & 0xff);
        if (p != me && row[pe] != v) {
            c.peer = pe;
            ox_record_fault(c, OX_FAULT_MISMATCH);
            return false;
        }
    }
    return true;
}
// Thread 0 stores this block's descriptor into its column on every peer (before `ready`).
__device__ __forceinline__ void ox_desc_publish(const CollArgs& a) {
    if (threadIdx.x == 0) ox_desc_publish_slow(ox_desc(a, blockIdx.x, a.me), ox_desc_of(a), a.npes, a.me, ox_pes8(a));
}
// After the `ready` exchange; false (recorded for the host) when a peer passed another buffer.
__device__ __forceinline__ bool ox_desc_match(const CollArgs& a) {
    bool ok = true;
    if (threadIdx.x == 0)
        ok = ox_desc_match_slow(ox_wait_ctx(a, a.me), ox_desc(a, blockIdx.x, 0) - a.pes[0], ox_desc_of(a), a.npes,
                                a.me, ox_pes8(a));
    return ox_block_ok(ok);
}

// The PEs' output ranges, in global indices.
__device__ __forceinline__ void ox_out_range(const CollArgs& a, int p, long long* lo, long long* hi) {
    *lo = 0;
    *hi = a.count;
    if ((a.out == OX_OUT_ROOT && p != a.root) || (a.out == OX_OUT_NOT_ROOT && p == a.root)) *hi = 0;
    if (a.out == OX_OUT_SHARD) {
        *lo = ox_shard_start(a.count, a.npes, p);
        *hi = ox_shard_start(a.count, a.npes, p + 1);
    }
}

// One-shot push to member p on another node: this block's part of the window, as one
// put-with-signal (NVSHMEM's proxy moves it; the signal lands after the data).
template <typename E>
__device__ void ox_put_block(const CollArgs& a, int p, long long p0, long long p1) {
    typedef typename E::raw R;
    const long long EPP = 16 / sizeof(R);
    long long olo, ohi;
    ox_out_range(a, p, &olo, &ohi);
    const long long lo = max(max(a.win_lo + p0 * EPP, a.in_lo), olo);
    const long long hi = min(min(min(a.win_lo + p1 * EPP, a.win_hi), a.in_hi), ohi);
    uint64_t* sig = ox_sig(a, a.ready, blockIdx.x, a.me);
    if (lo < hi) {
        // Our slot on p, by its symmetric address (the same as ours).
        R* dst = (R*)(ox_buf(a, a.me) + (unsigned long long)a.me * a.slot_bytes) + (lo - a.win_lo);
        nvshmemx_putmem_signal_nbi_block(dst, (const R*)a.in_base + lo, (size_t)(hi - lo) * sizeof(R), sig,
                                         (uint64_t)ox_epoch(), NVSHMEM_SIGNAL_SET, a.pes[p]);
    } else if (threadIdx.x == 0) {
        nvshmemx_signal_op(sig, (uint64_t)ox_epoch(), NVSHMEM_SIGNAL_SET, a.pes[p]);
    }
}

// This PE's slot `src` (the data PE `src` pushed here), as a typed pointer indexed by window offset.
template <typename R>
__device__ __forceinline__ volatile R* ox_local_slot(const CollArgs& a, int src) {
    return (volatile R*)(ox_buf(a, a.me) + (unsigned long long)src * a.slot_bytes);
}
// PE p's slot `me` (where this PE pushes), as seen from here.
template <typename R>
__device__ __forceinline__ R* ox_remote_slot(const CollArgs& a, int p) {
    return (R*)(ox_buf(a, p) + (unsigned long long)a.me * a.slot_bytes);
}

// PE p's contribution to element i: this PE's input, or what p pushed into our slot p.
template <typename E>
__device__ __forceinline__ float ox_value(const CollArgs& a, int p, long long i) {
    typedef typename E::raw R;
    if (p == a.me) return E::to_f(((const R*)a.in_base)[i]);
    return E::to_f(ox_local_slot<R>(a, p)[i - a.win_lo]);
}
template <typename E>
__device__ __forceinline__ typename E::raw ox_raw(const CollArgs& a, int p, long long i) {
    typedef typename E::raw R;
    if (p == a.me) return ((const R*)a.in_base)[i];
    return ox_local_slot<R>(a, p)[i - a.win_lo];
}

// Output element i (scalar path).
template <typename E>
__device__ __forceinline__ typename E::raw ox_source(const CollArgs& a, long long i) {
    if (a.src == OX_SRC_ROOT) return ox_raw<E>(a, a.root, i);
    if (a.src == OX_SRC_OWNER) return ox_raw<E>(a, ox_owner(a.count, a.npes, i), i);
    float acc = ox_value<E>(a, 0, i);
    for (int p = 1; p < a.npes; ++p) acc = ox_combine(a.op, acc, ox_value<E>(a, p, i));
    if (a.op == OX_AVG) acc = acc / (float)a.npes;
    return E::from_f(acc);
}

// PE p's contribution to window pack k, 16 bytes.
template <typename R>
__device__ __forceinline__ uint4 ox_pack_of(const CollArgs& a, int p, long long k) {
    if (p == a.me) return ((const uint4*)(a.in_base + a.win_lo * sizeof(R)))[k];
    return __ldcv((const uint4*)(ox_buf(a, a.me) + (unsigned long long)p * a.slot_bytes) + k);
}

// Window pack k reduced over all PEs.
template <typename E>
__device__ __forceinline__ uint4 ox_reduce_pack(const CollArgs& a, long long k) {
    typedef typename E::raw R;
    const int EPP = 16 / sizeof(R);
    uint4 v = ox_pack_of<R>(a, 0, k);
    float acc[16 / sizeof(R)];
    const R* r = (const R*)&v;
#pragma unroll
    for (int j = 0; j < EPP; ++j) acc[j] = E::to_f(r[j]);
    for (int p = 1; p < a.npes; ++p) {
        uint4 w = ox_pack_of<R>(a, p, k);
        const R* s = (const R*)&w;
#pragma unroll
        for (int j = 0; j < EPP; ++j) acc[j] = ox_combine(a.op, acc[j], E::to_f(s[j]));
    }
    uint4 out;
    R* o = (R*)&out;
#pragma unroll
    for (int j = 0; j < EPP; ++j) o[j] = E::from_f(a.op == OX_AVG ? acc[j] / (float)a.npes : acc[j]);
    return out;
}

// The global element range [*i0, *i1) of window pack k; true when it is a whole pack.
template <typename R>
__device__ __forceinline__ bool ox_pack_range(const CollArgs& a, long long k, long long* i0, long long* i1) {
    const long long EPP = 16 / sizeof(R);
    *i0 = a.win_lo + k * EPP;
    *i1 = min(*i0 + EPP, a.win_hi);
    return *i1 - *i0 == EPP;
}

// Pushes window pack k of this PE's input (the part in [in_lo, in_hi) and in PE p's output
// range) into PE p's slot `me`.
template <typename E>
__device__ __forceinline__ void ox_push(const CollArgs& a, int p, long long k) {
    typedef typename E::raw R;
    long long i0, i1, olo, ohi;
    bool whole = ox_pack_range<R>(a, k, &i0, &i1);
    ox_out_range(a, p, &olo, &ohi);
    long long lo = max(max(i0, a.in_lo), olo), hi = min(min(i1, a.in_hi), ohi);
    if (lo >= hi) return;
    R* dst = ox_remote_slot<R>(a, p);
    if (a.aligned && whole && lo == i0 && hi == i1) {
        ((uint4*)dst)[k] = ((const uint4*)(a.in_base + a.win_lo * sizeof(R)))[k];
        return;
    }
    for (long long i = lo; i < hi; ++i) dst[i - a.win_lo] = ((const R*)a.in_base)[i];
}

// One-shot output, window pack k (this PE's output range only).
template <typename E>
__device__ __forceinline__ void ox_output(const CollArgs& a, long long k) {
    typedef typename E::raw R;
    long long i0, i1, olo, ohi;
    bool whole = ox_pack_range<R>(a, k, &i0, &i1);
    ox_out_range(a, a.me, &olo, &ohi);
    long long lo = max(i0, olo), hi = min(i1, ohi);
    if (lo >= hi) return;
    if (a.aligned && whole && lo == i0 && hi == i1) {
        uint4* out = (uint4*)(a.out_base + a.win_lo * sizeof(R));
        if (a.src == OX_SRC_REDUCE) {
            out[k] = ox_reduce_pack<E>(a, k);
            return;
        }
        int from = a.src == OX_SRC_ROOT ? a.root : ox_owner(a.count, a.npes, i0);
        if (a.src == OX_SRC_ROOT || from == ox_owner(a.count, a.npes, i1 - 1)) {
            out[k] = ox_pack_of<R>(a, from, k);
            return;
        }
    }
    for (long long i = lo; i < hi; ++i) ((R*)a.out_base)[i] = ox_source<E>(a, i);
}

// Packs per thread in flight in the bulk loops below: several 16-byte loads issued before
// their stores, so a block keeps enough NVLink traffic outstanding to approach the link rate.
#define OX_UNROLL 4

// A pointer the compiler may take for global memory (staging, peers' memory through
// nvshmem_ptr, tensors): stores through it then cannot alias the shared memory that holds this
// launch's staging addresses (ox_buf), whose loads may stay out of the hot loops.
template <typename T>
__device__ __forceinline__ T* ox_g(T* p) {
    __builtin_assume(__isGlobal(p));
    return p;
}

// dst[k] = src[k] for packs k in [q0, q1), OX_UNROLL loads in flight per thread.
__device__ __forceinline__ void ox_copy_packs(uint4* dst, const uint4* src, long long q0, long long q1) {
    dst = ox_g(dst);
    const long long bd = blockDim.x;
    long long k = q0 + threadIdx.x;
    for (; k + (OX_UNROLL - 1) * bd < q1; k += OX_UNROLL * bd) {
        uint4 v[OX_UNROLL];
#pragma unroll
        for (int j = 0; j < OX_UNROLL; ++j) v[j] = __ldcv(src + k + j * bd);
#pragma unroll
        for (int j = 0; j < OX_UNROLL; ++j) dst[k + j * bd] = v[j];
    }
    for (; k < q1; k += bd) dst[k] = __ldcv(src + k);
}

// Where the reduced packs go on member p: its slot `me`; or, for a buffer on the symmetric heap
// (OX_SYMM_PUSH), p's copy of the buffer itself, at the same offset from p's staging set as ours
// is from our set (the heap is mapped linearly; the host checked it against nvshmem_ptr).
template <typename R>
__device__ __forceinline__ uint4* ox_result_dst(const CollArgs& a, int p) {
    if (a.mode == OX_SYMM_PUSH) return ox_g((uint4*)(a.out_base + a.win_lo * sizeof(R) + (a.bufs[p] - a.bufs[a.me])));
    return ox_g((uint4*)ox_remote_slot<R>(a, p));
}

// Packs per thread in flight per member in the reduce loops (two-shot, one-shot, symmetric): 4
// for 32-bit types, 2 for 16-bit ones (whose 8 accumulators per pack would otherwise spill
// registers).
template <typename R>
struct OxReduceUnroll {
    static const int n = sizeof(R) == 4 ? 4 : 2;
};

// Packs [k, k + U * bd) (stride bd) reduced over every member in PE order, member p's packs
// read from src(p). Each member's U packs are loaded together before any is combined. With a
// load per pack and the branch on p between them (ox_reduce_pack), each thread had one or two
// loads in flight, and the two-shot moved 7-9 GB/s per block (235 GB/s with 32 blocks) where
// plain stores move 11-21.
template <typename E, int U, typename Src>
__device__ __forceinline__ void ox_reduce_members(const CollArgs& a, long long k, long long bd, uint4* v, Src src) {
    typedef typename E::raw R;
    const int EPP = 16 / sizeof(R);
    float acc[U][16 / sizeof(R)];
    for (int p = 0; p < a.npes; ++p) {
        const uint4* from = src(p);
        uint4 w[U];
#pragma unroll
        for (int j = 0; j < U; ++j) w[j] = __ldcv(from + k + j * bd);
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const R* r = (const R*)&w[j];
#pragma unroll
            for (int e = 0; e < EPP; ++e) acc[j][e] = p == 0 ? E::to_f(r[e]) : ox_combine(a.op, acc[j][e], E::to_f(r[e]));
        }
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
        R* o = (R*)&v[j];
#pragma unroll
        for (int e = 0; e < EPP; ++e) o[e] = E::from_f(a.op == OX_AVG ? acc[j][e] / (float)a.npes : acc[j][e]);
    }
}

// The staged reduce's members: this PE's input, or what member p pushed into slot p.
template <typename E, int U>
__device__ __forceinline__ void ox_reduce_batch(const CollArgs& a, long long k, long long bd, uint4* v) {
    typedef typename E::raw R;
    const uint4* in = (const uint4*)(a.in_base + a.win_lo * sizeof(R));
    ox_reduce_members<E, U>(a, k, bd, v, [&](int p) {
        return p == a.me ? in : (const uint4*)(ox_buf(a, a.me) + (unsigned long long)p * a.slot_bytes);
    });
}

// Reduce of window packs [s0, s1) into the output; with PEERS (two-shot) the reduced pack also
// goes to every peer (ox_result_dst).
template <typename E, bool PEERS>
__device__ __forceinline__ void ox_reduce_packs(const CollArgs& a, long long s0, long long s1) {
    typedef typename E::raw R;
    const int U = OxReduceUnroll<R>::n;
    const long long bd = blockDim.x;
    uint4* out = ox_g((uint4*)(a.out_base + a.win_lo * sizeof(R)));
    long long k = s0 + threadIdx.x;
    for (; k + (U - 1) * bd < s1; k += U * bd) {
        uint4 v[U];
        ox_reduce_batch<E, U>(a, k, bd, v);
#pragma unroll
        for (int j = 0; j < U; ++j) {
            if (PEERS)
                for (int p = 0; p < a.npes; ++p)
                    if (p != a.me) ox_result_dst<R>(a, p)[k + j * bd] = v[j];
            out[k + j * bd] = v[j];
        }
    }
    for (; k < s1; k += bd) {
        uint4 v;
        ox_reduce_batch<E, 1>(a, k, bd, &v);
        if (PEERS)
            for (int p = 0; p < a.npes; ++p)
                if (p != a.me) ox_result_dst<R>(a, p)[k] = v;
        out[k] = v;
    }
}

// Two-shot copy-out of one block's packs [p0, p1) of a window: the peers' reduced sub-shards,
// from this PE's slots in staging set `set` into `out` (the window's output).
__device__ __forceinline__ void ox_copy_out_block(const CollArgs& a, uint4* out, unsigned long long set, long long p0,
                                                  long long p1) {
    const long long len = p1 - p0;
    for (int p = 0; p < a.npes; ++p) {
        if (p == a.me) continue;
        const long long q0 = p0 + ox_pack_split(len, a.npes, p), q1 = p0 + ox_pack_split(len, a.npes, p + 1);
        ox_copy_packs(out, (const uint4*)(set + (unsigned long long)p * a.slot_bytes), q0, q1);
    }
}

// The copy-out of the previous window of this two-shot all-reduce (the host set prev_lo..prev_hi
// and deferred it there), from this PE's slots of the other staging set. Done here, between
// this window's pushes and its `ready` exchange, it overlaps NVLink traffic instead of idling
// the link at the end of every window.
// Safe: the previous launch is over (its `done` exchange saw every peer's results land), the
// peers push into the other set in this launch, and they write that set again only in the next
// launch, after this one's `done` exchange, which follows this copy.
template <typename R>
__device__ void ox_copy_out_prev(const CollArgs& a) {
    if (a.prev_hi <= a.prev_lo) return;
    const long long EPP = 16 / sizeof(R);
    // Consecutive launches of a team alternate staging sets (entry.cu).
    const unsigned long long set0 = a.bufs[a.me], set_bytes = a.slot_bytes * (unsigned long long)a.npes;
    const unsigned long long prev = ox_buf(a, a.me) == set0 ? set0 + set_bytes : set0;
    const long long npacks = (a.prev_hi - a.prev_lo) / EPP;
    uint4* out = (uint4*)(a.out_base + a.prev_lo * sizeof(R));
    // The previous launch's blocks, spread over this launch's (the same number but for a last
    // window smaller than the others).
    for (int b = blockIdx.x; b < a.prev_blocks; b += gridDim.x)
        ox_copy_out_block(a, out, prev, ox_pack_split(npacks, a.prev_blocks, b),
                          ox_pack_split(npacks, a.prev_blocks, b + 1));
}

template <typename E>
__device__ void ox_collective(const CollArgs& a) {
    typedef typename E::raw R;
    const long long EPP = 16 / sizeof(R);
    const long long npacks = (a.win_hi - a.win_lo + EPP - 1) / EPP;
    // This block's packs (whole 512-byte units, see ox_pack_split), the same on every PE.
    const long long p0 = ox_pack_split(npacks, gridDim.x, blockIdx.x);
    const long long p1 = ox_pack_split(npacks, gridDim.x, blockIdx.x + 1);

    if (a.mode == OX_ONESHOT) {
        // An all_reduce window of whole aligned packs takes the bulk loops (several packs in
        // flight per thread); other ops and partial packs go pack by pack.
        const bool bulk = a.src == OX_SRC_REDUCE && a.out == OX_OUT_ALL && a.aligned &&
                          (a.win_hi - a.win_lo) % EPP == 0 && a.in_lo <= a.win_lo && a.in_hi >= a.win_hi;
        for (int p = 0; p < a.npes; ++p)
            if (p != a.me && ox_by_put(a, p)) ox_put_block<E>(a, p, p0, p1);
        if (bulk) {
            const uint4* in = (const uint4*)(a.in_base + a.win_lo * sizeof(R));
            for (int p = 0; p < a.npes; ++p)
                if (p != a.me && !ox_by_put(a, p)) ox_copy_packs((uint4*)ox_remote_slot<R>(a, p), in, p0, p1);
        } else {
            for (long long k = p0 + threadIdx.x; k < p1; k += blockDim.x)
                for (int p = 0; p < a.npes; ++p)
                    if (p != a.me && !ox_by_put(a, p)) ox_push<E>(a, p, k);
        }
        if (!ox_exchange(a, a.ready, true)) return;
        if (bulk) {
            ox_reduce_packs<E, false>(a, p0, p1);
            return;
        }
        for (long long k = p0 + threadIdx.x; k < p1; k += blockDim.x) ox_output<E>(a, k);
        return;
    }

    // Two-shot all_reduce (input and output are the whole window; OX_SYMM_PUSH: a buffer on the
    // symmetric heap, whole aligned packs only). PE q owns the sub-shard [sub(q), sub(q + 1)) of
    // the block's packs.
    const long long len = p1 - p0;
    if (a.aligned && (a.win_hi - a.win_lo) % EPP == 0) {
        // Every pack whole and 16-byte aligned: the bulk loops, several packs in flight.
        const uint4* in = (const uint4*)(a.in_base + a.win_lo * sizeof(R));
        for (int p = 0; p < a.npes; ++p) {
            if (p == a.me) continue;
            const long long q0 = p0 + ox_pack_split(len, a.npes, p), q1 = p0 + ox_pack_split(len, a.npes, p + 1);
            ox_copy_packs((uint4*)ox_remote_slot<R>(a, p), in, q0, q1);
        }
        ox_copy_out_prev<R>(a);
        if (a.mode == OX_SYMM_PUSH) ox_desc_publish(a);
        if (!ox_exchange(a, a.ready)) return;
        if (a.mode == OX_SYMM_PUSH && !ox_desc_match(a)) return;
        const long long s0 = p0 + ox_pack_split(len, a.npes, a.me), s1 = p0 + ox_pack_split(len, a.npes, a.me + 1);
        ox_reduce_packs<E, true>(a, s0, s1);
        if (!ox_exchange(a, a.done)) return;
        // A symmetric buffer already holds the peers' reduced sub-shards: they stored them here.
        // A window whose copy-out the host deferred leaves it to the next launch.
        if (a.mode == OX_SYMM_PUSH || a.defer_out) return;
        ox_copy_out_block(a, (uint4*)(a.out_base + a.win_lo * sizeof(R)), ox_buf(a, a.me), p0, p1);
        return;
    }
    for (int p = 0; p < a.npes; ++p) {
        if (p == a.me) continue;
        const long long q0 = p0 + ox_pack_split(len, a.npes, p), q1 = p0 + ox_pack_split(len, a.npes, p + 1);
        for (long long k = q0 + threadIdx.x; k < q1; k += blockDim.x) ox_push<E>(a, p, k);
    }
    // (A last window with a partial pack; the host defers only whole-pack windows.)
    ox_copy_out_prev<R>(a);
    if (!ox_exchange(a, a.ready)) return;
    // Reduce this PE's sub-shard; push the result into the same slot `me` of every peer
    // (its sub-shard part of that slot is unused in this epoch).
    const long long s0 = p0 + ox_pack_split(len, a.npes, a.me), s1 = p0 + ox_pack_split(len, a.npes, a.me + 1);
    R* out = (R*)a.out_base;
    for (long long k = s0 + threadIdx.x; k < s1; k += blockDim.x) {
        long long i0, i1;
        bool whole = ox_pack_range<R>(a, k, &i0, &i1);
        if (a.aligned && whole) {
            uint4 v = ox_reduce_pack<E>(a, k);
            for (int p = 0; p < a.npes; ++p)
                if (p != a.me) ((uint4*)ox_remote_slot<R>(a, p))[k] = v;
            // In place: our input pack is read above before this write.
            ((uint4*)(a.out_base + a.win_lo * sizeof(R)))[k] = v;
        } else {
            for (long long i = i0; i < i1; ++i) {
                R v = ox_source<E>(a, i);
                for (int p = 0; p < a.npes; ++p)
                    if (p != a.me) ox_remote_slot<R>(a, p)[i - a.win_lo] = v;
                out[i] = v;
            }
        }
    }
    if (!ox_exchange(a, a.done)) return;
    // The peers' reduced sub-shards are in our slots.
    for (int p = 0; p < a.npes; ++p) {
        if (p == a.me) continue;
        const long long q0 = p0 + ox_pack_split(len, a.npes, p), q1 = p0 + ox_pack_split(len, a.npes, p + 1);
        for (long long k = q0 + threadIdx.x; k < q1; k += blockDim.x) {
            long long i0, i1;
            bool whole = ox_pack_range<R>(a, k, &i0, &i1);
            if (a.aligned && whole) {
                ((uint4*)(a.out_base + a.win_lo * sizeof(R)))[k] = ox_pack_of<R>(a, p, k);
            } else {
                for (long long i = i0; i < i1; ++i) out[i] = ox_local_slot<R>(a, p)[i - a.win_lo];
            }
        }
    }
}
