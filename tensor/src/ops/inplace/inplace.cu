// In-place copy: a strided source written through a strided destination view, by element
// size whatever the dtype (the source was already converted to the destination's dtype).
#define COPY_INTO(BITS, T)                                                                       \
    extern "C" __global__ void copy_into_b##BITS(Strided d, Strided s, const T* in, T* out,      \
                                                 i64 n) {                                        \
        FOR_EACH(i, n) { out[strided_offset(d, i)] = in[strided_offset(s, i)]; }                 \
    }
COPY_INTO(8, u8)
COPY_INTO(16, unsigned short)
COPY_INTO(32, u32)
COPY_INTO(64, unsigned long long)
