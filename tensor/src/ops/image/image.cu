// Batches of RGB u8 images, as the loader uploads them ([N, H, W, 3], unflipped), made into
// the network's input on the GPU: ToTensor + Normalize in f32 with torchvision's order of
// operations ((v / 255 - mean) / std, no fast-math, so the values equal the CPU path's bit for
// bit), each image mirrored left to right where its flip flag says, written NCHW or channels-
// last. One thread per output element: the pass is bound by memory, not arithmetic.

struct ImageNorm {
    float mean[3];
    float std[3];
};

#define NORMALIZE_IMAGES(SN, T, STORE)                                                           \
    extern "C" __global__ void normalize_images_##SN(const u8* in, const u8* flips, T* out,      \
                                                     i64 n, i64 h, i64 w, int channels_last,     \
                                                     ImageNorm norm) {                           \
        FOR_EACH(i, n * h * w * 3) {                                                             \
            i64 c, x, y, img, r;                                                                 \
            if (channels_last) {                                                                 \
                c = i % 3; r = i / 3; x = r % w; r /= w; y = r % h; img = r / h;                  \
            } else {                                                                             \
                x = i % w; r = i / w; y = r % h; r /= h; c = r % 3; img = r / 3;                  \
            }                                                                                    \
            i64 sx = flips[img] ? w - 1 - x : x;                                                 \
            float v = (float)in[((img * h + y) * w + sx) * 3 + c] / 255.0f;                      \
            out[i] = STORE((v - norm.mean[c]) / norm.std[c]);                                    \
        }                                                                                        \
    }
NORMALIZE_IMAGES(f32, float, STORE_F32)
NORMALIZE_IMAGES(bf16, bf16_t, STORE_BF16)
NORMALIZE_IMAGES(f16, f16_t, STORE_F16)
