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

// RandomResizedCrop's and Resize's resampling on the GPU: each image's region resampled to the
// output size with PIL's antialiased bilinear filter (a triangle whose support grows with the
// downscale factor, so every source pixel under an output pixel counts), as the CPU path's
// resizer does. One thread per output pixel; the weights are worked out in place (a few taps per
// axis at ImageNet's scales). The same arithmetic as `resize_crops_cpu` in resize.rs.

struct CropSource {
    const u8* pixels;   // [height, width, 3]
    int width, height;
    int x0, y0;          // first column and row the filter may read
    int bound_w, bound_h; // how many columns and rows it may read from there
    float left, top;     // the region's origin, relative to (x0, y0)
    float scale_x, scale_y; // region size / output size
};

// The source taps of output coordinate `o` along one axis: first tap, count, and the filter's
// width (the weights are 1 - |distance| / width, left unnormalised).
__device__ __forceinline__ int crop_taps(float origin, float scale, int bound, i64 o, int* first, float* width) {
    float fs = fmaxf(scale, 1.0f);
    float center = origin + ((float)o + 0.5f) * scale;
    int lo = max((int)(center - fs + 0.5f), 0);
    int hi = min((int)(center + fs + 0.5f), bound);
    *first = lo;
    *width = fs;
    return hi - lo;
}

__device__ __forceinline__ float crop_weight(int k, float center_minus_half, float fs) {
    return fmaxf(0.0f, 1.0f - fabsf(((float)k - center_minus_half) / fs));
}

extern "C" __global__ void resize_crops(const CropSource* srcs, u8* out, i64 n, i64 oh, i64 ow) {
    FOR_EACH(i, n * oh * ow) {
        i64 x = i % ow, r = i / ow, y = r % oh, img = r / oh;
        CropSource s = srcs[img];
        int fx, fy;
        float wx_fs, wy_fs;
        int nx = crop_taps(s.left, s.scale_x, s.bound_w, x, &fx, &wx_fs);
        int ny = crop_taps(s.top, s.scale_y, s.bound_h, y, &fy, &wy_fs);
        float cx = s.left + ((float)x + 0.5f) * s.scale_x - 0.5f;
        float cy = s.top + ((float)y + 0.5f) * s.scale_y - 0.5f;
        float acc[3] = {0.0f, 0.0f, 0.0f};
        float sum_x = 0.0f, sum_y = 0.0f;
        for (int kx = 0; kx < nx; kx++) sum_x += crop_weight(fx + kx, cx, wx_fs);
        for (int ky = 0; ky < ny; ky++) {
            float wy = crop_weight(fy + ky, cy, wy_fs);
            sum_y += wy;
            const u8* row = s.pixels + ((i64)(s.y0 + fy + ky) * s.width + s.x0 + fx) * 3;
            float racc[3] = {0.0f, 0.0f, 0.0f};
            for (int kx = 0; kx < nx; kx++) {
                float wx = crop_weight(fx + kx, cx, wx_fs);
                racc[0] += wx * (float)row[kx * 3 + 0];
                racc[1] += wx * (float)row[kx * 3 + 1];
                racc[2] += wx * (float)row[kx * 3 + 2];
            }
            acc[0] += wy * racc[0];
            acc[1] += wy * racc[1];
            acc[2] += wy * racc[2];
        }
        float norm = 1.0f / (sum_x * sum_y);
        u8* o = out + i * 3;
        for (int c = 0; c < 3; c++) {
            float v = floorf(acc[c] * norm + 0.5f);
            o[c] = (u8)fminf(fmaxf(v, 0.0f), 255.0f);
        }
    }
}
