// What every NVSHMEM collective kernel shares (the first piece of the source device_code.rs
// concatenates): the NVSHMEM includes, the argument block mirrored by kernels.rs, the element
// types and reduction rule, shard arithmetic, and the waits that give up after the timeout.

// NVRTC workarounds for the NVSHMEM 3.x headers (see device_code.rs):
// reduce.cuh uses std:: traits without including them, and the IBGDA headers want InfiniBand.
#include <cuda/std/type_traits>
namespace std { using namespace cuda::std; }
#include <non_abi/nvshmem_build_options.h>
#undef NVSHMEM_IBGDA_SUPPORT
#include <nvshmem.h>
#include <nvshmemx.h>

#define OX_MAX_PES 8
#define OX_MAX_BLOCKS 256

// Algorithm.
#define OX_ONESHOT 0
#define OX_TWOSHOT 1
#define OX_LL 2     // all_reduce of small messages: data and flag in each 8-byte word (ll.cu)
#define OX_SYMM 4   // all_reduce in place of a buffer on the symmetric heap, no staging (symmetric.cu)
#define OX_SYMM_PUSH 5 // the same as two-shot pushes: results stored into the peers' copies (collectives.cu)
// Where output element i comes from.
#define OX_SRC_REDUCE 0 // the reduction over every PE's input (all_reduce, reduce, reduce_scatter)
#define OX_SRC_ROOT 1   // PE `root`'s input (broadcast)
#define OX_SRC_OWNER 2  // the input of the PE whose shard holds i (all_gather)
// Which PEs write output, and where.
#define OX_OUT_ALL 0      // every PE, every element
#define OX_OUT_ROOT 1     // PE `root` only (reduce)
#define OX_OUT_NOT_ROOT 2 // every PE but `root` (broadcast: the root already has the data)
#define OX_OUT_SHARD 3    // PE p its shard_range(count, npes, p) (reduce_scatter)
// ReduceOp, in oxtrain_comm::ReduceOp's order.
#define OX_SUM 0
#define OX_AVG 1
#define OX_MAX 2
#define OX_MIN 3

// Mirrored by `CollArgs` in comm/src/nvshmem/kernels.rs (288 bytes, checked on both sides).
// A launch runs over a team of PEs (all of them, or one node's, or one per node for the
// hierarchical all-reduce): `npes`, `me`, `bufs`, slots and shards are indexed by member, and
// `pes` names each member's global PE for NVSHMEM calls and signal columns.
// Indices are global (0..count of the whole tensor); one launch handles the window
// [win_lo, win_hi), whose element i sits at index i - win_lo of a slot.
struct CollArgs {
    unsigned long long in_base;  // input element i at in_base + i * size
    unsigned long long out_base; // output element i at out_base + i * size
    unsigned long long bufs[OX_MAX_PES]; // staging set 0 of every member, as seen here (set 1
                                         // follows it; members reached by puts: only bufs[me] is
                                         // used); OX_SYMM: every member's copy of the buffer
    unsigned long long ready;    // this PE's ready signals: [OX_MAX_BLOCKS][sig_stride] u64
    unsigned long long done;     // this PE's done signals, same shape
    unsigned long long counters; // this PE's launch counters, in device memory (see entry.cu)
    unsigned long long slot_bytes; // a staging set holds npes slots of this many bytes
    long long count;             // elements in the whole tensor
    long long win_lo, win_hi;    // this launch's window
    long long in_lo, in_hi;      // global indices of this PE's input (all_gather: its shard)
    int npes, me, mode, src, op, root, aligned, out;
    int pes[OX_MAX_PES];         // global PE of every member
    int sig_stride;              // columns of a signal row: the world size (one per global PE)
    int put_mask;                // bit p: member p is reached by NVSHMEM puts (another node), not
                                 // by stores through nvshmem_ptr (one-shot mode only)
    unsigned long long fault;    // an OxFault in host memory mapped here (fault.rs)
    unsigned long long timeout_ns; // how long any wait may take before the kernel gives up
    int kind;                    // the team (kernels.rs Kind): its launches pick the staging set
    int defer_out;               // two-shot: leave this window's copy-out to the next launch
    long long prev_lo, prev_hi;  // two-shot: the previous window, whose copy-out is this launch's
    int prev_blocks;             //   (empty when prev_hi <= prev_lo), and its launch's grid
    int pad;
};
static_assert(sizeof(CollArgs) == 272, "CollArgs must match the Rust side");

// This launch's epoch and staging set, read from the device counters by ox_entry (entry.cu)
// rather than passed by the host: a launch captured in a CUDA graph replays with the same
// arguments, yet must use a new epoch each time.
__shared__ unsigned long long ox_s_epoch;
// Where the low-latency kernel's counters (one per thread of the grid) start in `counters`,
// after the rows of the other kernels' (entry.cu): 5 rows of OX_MAX_BLOCKS (kernels.rs).
#define OX_LL_COUNTER_BASE (5 * OX_MAX_BLOCKS)
// Every member's staging set of this launch, as seen here: loaded where used, as the
// arguments are, so the hot loops hold no extra register for it.
__shared__ unsigned long long ox_s_bufs[OX_MAX_PES];
// Plain reads, which the compiler may keep in registers across the hot loops (volatile ones,
// reloaded at every use, cost the two-shot kernel 5% of its bandwidth with 32 blocks).
__device__ __forceinline__ unsigned long long ox_epoch() { return ox_s_epoch; }
__device__ __forceinline__ unsigned long long ox_buf(const CollArgs& a, int m) { return ox_s_bufs[m]; }

// What a kernel that gave up leaves for the host (`FaultRecord` in fault.rs).
struct OxFault {
    unsigned int code; // 0: none; 1: a wait timed out; 2: PEs passed different symmetric buffers
    unsigned int peer; // the global PE waited for
    unsigned long long epoch;
    unsigned int block, mode;
};
static_assert(sizeof(OxFault) == 24, "OxFault must match FaultRecord in fault.rs");

__device__ __forceinline__ unsigned long long ox_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// What a slow-path wait needs from the arguments, by value: the out-of-line functions below
// take no reference to the kernel's CollArgs, which would make it copied to local memory.
struct OxWaitCtx {
    unsigned long long fault, timeout_ns, epoch;
    int peer, mode;
};
__device__ __forceinline__ OxWaitCtx ox_wait_ctx(const CollArgs& a, int m) {
    OxWaitCtx c;
    c.fault = a.fault;
    c.timeout_ns = a.timeout_ns;
    c.epoch = ox_epoch();
    c.peer = a.pes[m];
    c.mode = a.mode;
    return c;
}

// Fault codes for the host (fault.rs).
#define OX_FAULT_TIMEOUT 1  // a wait timed out
#define OX_FAULT_MISMATCH 2 // the PEs passed different symmetric buffers (collectives.cu)

// Records a fault (several threads may: they write alike).
__device__ __noinline__ void ox_record_fault(OxWaitCtx c, unsigned int code) {
    volatile OxFault* f = (volatile OxFault*)c.fault;
    f->peer = c.peer;
    f->epoch = c.epoch;
    f->block = blockIdx.x;
    f->mode = c.mode;
    __threadfence_system();
    f->code = code;
    __threadfence_system();
}

// Waits until *sig >= v, a signal from member m (or this PE's own progress); false once the
// wait has taken longer than the timeout, which is recorded for the host. Every wait of the
// kernels goes through here (or ox_ll_take), so a peer that never arrives makes the call fail
// instead of hanging the GPU.
__device__ __noinline__ bool ox_wait_ge_slow(OxWaitCtx c, volatile const uint64_t* s, uint64_t v) {
    const unsigned long long t0 = ox_now();
    for (unsigned n = 1; *s < v; ++n) {
        if ((n & 1023) == 0 && ox_now() - t0 > c.timeout_ns) {
            ox_record_fault(c, OX_FAULT_TIMEOUT);
            return false;
        }
    }
    return true;
}
// The check inline, the spin out of line (it would cost the hot loops registers).
__device__ __forceinline__ bool ox_wait_ge(const CollArgs& a, const uint64_t* sig, uint64_t v, int m) {
    volatile const uint64_t* s = (volatile const uint64_t*)sig;
    return *s >= v || ox_wait_ge_slow(ox_wait_ctx(a, m), s, v);
}

// Block `block`'s signal from member `m` in the signal array at `base` (on any PE: the arrays
// are symmetric).
__device__ __forceinline__ uint64_t* ox_sig(const CollArgs& a, unsigned long long base, int block, int m) {
    return (uint64_t*)base + (size_t)block * a.sig_stride + a.pes[m];
}

__device__ __forceinline__ bool ox_by_put(const CollArgs& a, int p) { return (a.put_mask >> p) & 1; }

struct F32 {
    typedef float raw;
    static __device__ __forceinline__ float to_f(float x) { return x; }
    static __device__ __forceinline__ float from_f(float x) { return x; }
};
struct BF16 {
    typedef unsigned short raw;
    static __device__ __forceinline__ float to_f(unsigned short x) {
        return __uint_as_float(((unsigned int)x) << 16);
    }
    // Round to nearest even, NaN stays a (quiet) NaN: as half::bf16::from_f32.
    static __device__ __forceinline__ unsigned short from_f(float f) {
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
};
struct F16 {
    typedef unsigned short raw;
    static __device__ __forceinline__ float to_f(unsigned short x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
    }
    static __device__ __forceinline__ unsigned short from_f(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

// a op= v, with the CPU backends' rules: NaN wins max and min.
__device__ __forceinline__ float ox_combine(int op, float a, float v) {
    if (op == OX_MAX) return (v > a || v != v) ? v : a;
    if (op == OX_MIN) return (v < a || v != v) ? v : a;
    return a + v;
}

// The first element of `rank`'s shard_range(len, n, rank), as oxtrain_comm::shard_range.
__device__ __forceinline__ long long ox_shard_start(long long len, int n, int rank) {
    long long base = len / n, extra = len % n;
    return rank * base + (rank < extra ? rank : extra);
}

// Where part `i` of `n` packs split `parts` ways starts, in whole units of 32 packs (512 bytes,
// one warp's 16-byte accesses): block and PE boundaries then fall on cache lines, so no warp
// access straddles one (with 132 blocks, unaligned parts cost two-shot 6% of its bandwidth).
#define OX_UNIT_PACKS 32
__device__ __forceinline__ long long ox_pack_split(long long n, int parts, int i) {
    const long long units = (n + OX_UNIT_PACKS - 1) / OX_UNIT_PACKS;
    return min(ox_shard_start(units, parts, i) * OX_UNIT_PACKS, n);
}

// The PE whose shard_range(count, n, .) holds element i.
__device__ __forceinline__ int ox_owner(long long count, int n, long long i) {
    long long base = count / n, extra = count % n;
    long long split = extra * (base + 1);
    if (i < split) return (int)(i / (base + 1));
    return (int)(extra + (i - split) / base);
}

// Thread 0 of a block says whether its wait succeeded; every thread learns it (false: the
// kernel gives up, see ox_wait_ge).
__device__ __forceinline__ bool ox_block_ok(bool ok0) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = ok0;
    __syncthreads();
    const bool r = ok;
    __syncthreads();
    return r;
}

