// The attention_v2 kernels under emu.h against an f64 loop (run.sh builds and runs it).
// usage: attention_harness early|late [CASE]  (late: cp.async copies land at the wait, not at
// issue; CASE: the index of one case to run)
#include "emu.h"
#include "kernels_host.h"  // written by host_source.py

float host_bf16_to_f32(uint16_t x) { return bf16_to_f32(x); }
float host_f16_to_f32(uint16_t x) { return f16_to_f32(x); }
uint32_t pack_bf16x2(float lo, float hi) { return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16); }
uint32_t pack_f16x2(float lo, float hi) { return (uint32_t)f32_to_f16(lo) | ((uint32_t)f32_to_f16(hi) << 16); }

typedef void (*FwdFn)(const unsigned short*, Bhtd, const unsigned short*, Bhtd, const unsigned short*, Bhtd,
                      unsigned short*, float*, int, int, int, const i64*, float, int);
typedef void (*DqFn)(const unsigned short*, Bhtd, const unsigned short*, Bhtd, const unsigned short*, Bhtd,
                     const unsigned short*, Bhtd, const unsigned short*, Bhtd, const float*, float*, unsigned short*, int,
                     int, int, const i64*, float, int);
typedef void (*DkvFn)(const unsigned short*, Bhtd, const unsigned short*, Bhtd, const unsigned short*, Bhtd,
                      const unsigned short*, Bhtd, const float*, const float*, unsigned short*, unsigned short*, int, int,
                      int, const i64*, float, int);

#define PICK(KIND, F16, D)                                                                                       \
    (F16 ? (D == 32 ? attention_v2_##KIND##_f16_d32 : D == 64 ? attention_v2_##KIND##_f16_d64 : attention_v2_##KIND##_f16_d128) \
         : (D == 32 ? attention_v2_##KIND##_bf16_d32 : D == 64 ? attention_v2_##KIND##_bf16_d64 : attention_v2_##KIND##_bf16_d128))

struct Case {
    bool f16;
    int B, H, L, S, D;
    bool causal;
    std::vector<long long> lens;  // empty: no key padding
    int layout;                   // 0: q, k, v [B, H, T, D]; 1: [B, T, H, D]; 2: one [B, T, 3, H, D] (L == S)
    float scale;                  // 0: 1 / sqrt(D)
};

static uint64_t rng = 1;
static double uniform() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}

struct Mat {  // a [B, H, T, D] view of 16-bit values, and its values as doubles
    unsigned short* p;
    Bhtd s;
    int T;
};

static double val(const Case& c, unsigned short x) { return c.f16 ? f16_to_f32(x) : bf16_to_f32(x); }
static unsigned short enc(const Case& c, double x) { return c.f16 ? f32_to_f16((float)x) : f32_to_bf16((float)x); }
static double at(const Case& c, const Mat& m, int b, int h, int t, int d) {
    return val(c, m.p[b * m.s.b + h * m.s.h + t * m.s.t + d]);
}

// The largest |got - want| over the largest |want|; NaNs must sit at the same places.
static double rel_err(const std::vector<double>& got, const std::vector<double>& want, bool* nan_mismatch,
                      const char* what) {
    double scale = 1e-30, err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i]) || std::isnan(got[i])) {
            if (std::isnan(want[i]) != std::isnan(got[i])) {
                if (!*nan_mismatch) printf("  %s: element %zu is %g, the reference %g\n", what, i, got[i], want[i]);
                *nan_mismatch = true;
            }
            continue;
        }
        scale = std::max(scale, std::fabs(want[i]));
        err = std::max(err, std::fabs(got[i] - want[i]));
    }
    return err / scale;
}

static bool run(const Case& c) {
    const int B = c.B, H = c.H, L = c.L, S = c.S, D = c.D;
    const float scale = c.scale != 0 ? c.scale : 1.f / std::sqrt((float)D);
    std::vector<unsigned short> qbuf, kbuf, vbuf;
    Mat q, k, v;
    auto fill = [&](std::vector<unsigned short>& buf, size_t n) {
        buf.resize(n);
        for (auto& x : buf) x = enc(c, uniform());
    };
    if (c.layout == 2) {
        fill(qbuf, (size_t)B * L * 3 * H * D);
        Bhtd s{(i64)L * 3 * H * D, D, 3 * H * D};
        q = {qbuf.data(), s, L};
        k = {qbuf.data() + H * D, s, S};
        v = {qbuf.data() + 2 * H * D, s, S};
    } else {
        fill(qbuf, (size_t)B * H * L * D);
        fill(kbuf, (size_t)B * H * S * D);
        fill(vbuf, (size_t)B * H * S * D);
        auto strides = [&](int T) { return c.layout == 0 ? Bhtd{(i64)H * T * D, (i64)T * D, D} : Bhtd{(i64)T * H * D, D, (i64)H * D}; };
        q = {qbuf.data(), strides(L), L};
        k = {kbuf.data(), strides(S), S};
        v = {vbuf.data(), strides(S), S};
    }
    std::vector<unsigned short> dobuf;
    fill(dobuf, (size_t)B * L * H * D);
    const Mat dO = {dobuf.data(), Bhtd{(i64)L * H * D, D, (i64)H * D}, L};  // [B, L, H, D] memory
    std::vector<long long> lens = c.lens;
    auto key_len = [&](int b) { return lens.empty() ? S : (int)std::max(0LL, std::min((long long)S, lens[b])); };
    auto visible = [&](int b, int i, int j) { return j < key_len(b) && !(c.causal && j > i); };

    // Reference (f64).
    std::vector<double> ro((size_t)B * H * L * D), rlse((size_t)B * H * L), rdq(ro.size()), rdk((size_t)B * H * S * D),
        rdv(rdk.size());
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int i = 0; i < L; ++i) {
                std::vector<double> s(S);
                double m = -INFINITY;
                for (int j = 0; j < S; ++j) {
                    if (!visible(b, i, j)) continue;
                    double dot = 0;
                    for (int d = 0; d < D; ++d) dot += at(c, q, b, h, i, d) * at(c, k, b, h, j, d);
                    s[j] = scale * dot;
                    m = std::max(m, s[j]);
                }
                double sum = 0;
                std::vector<double> o(D, 0.0);
                for (int j = 0; j < S; ++j)
                    if (visible(b, i, j)) {
                        double p = std::exp(s[j] - m);
                        sum += p;
                        for (int d = 0; d < D; ++d) o[d] += p * at(c, v, b, h, j, d);
                    }
                const size_t row = ((size_t)b * H + h) * L + i;
                for (int d = 0; d < D; ++d) ro[row * D + d] = o[d] / sum;
                rlse[row] = m + std::log(sum);
                double delta = 0;
                for (int d = 0; d < D; ++d) delta += at(c, dO, b, h, i, d) * ro[row * D + d];
                for (int j = 0; j < S; ++j) {
                    if (!visible(b, i, j)) continue;
                    double p = std::exp(s[j] - rlse[row]);
                    double dp = 0;
                    for (int d = 0; d < D; ++d) dp += at(c, dO, b, h, i, d) * at(c, v, b, h, j, d);
                    double ds = p * (dp - delta);
                    const size_t kr = ((size_t)b * H + h) * S + j;
                    for (int d = 0; d < D; ++d) {
                        rdv[kr * D + d] += p * at(c, dO, b, h, i, d);
                        rdq[row * D + d] += scale * ds * at(c, k, b, h, j, d);
                        rdk[kr * D + d] += scale * ds * at(c, q, b, h, i, d);
                    }
                }
            }

    // Kernels.
    std::vector<unsigned short> out((size_t)B * L * H * D, 0xffff), dq(out.size(), 0xffff), dk((size_t)B * S * H * D, 0xffff),
        dv(dk.size(), 0xffff);
    std::vector<float> lse((size_t)B * H * L, NAN), delta(lse.size(), NAN);
    const i64* lens_p = lens.empty() ? nullptr : (const i64*)lens.data();
    const int BM = D <= 64 ? 128 : 64;
    const size_t tile_bytes = 64 * (D + 8) * 2;
    const size_t fwd_smem = (size_t)(BM + 4 * 64) * (D + 8) * 2, dq_smem = 6 * tile_bytes + 64 * 4,
                 dkv_smem = 6 * tile_bytes + 2 * 128 * 4;
    const Bhtd so{(i64)L * H * D, D, (i64)H * D};
    launch({(unsigned)((L + BM - 1) / BM), (unsigned)(B * H), 1}, 128, fwd_smem, [&] {
        PICK(forward, c.f16, D)(q.p, q.s, k.p, k.s, v.p, v.s, out.data(), lse.data(), H, L, S, lens_p, scale, c.causal);
    });
    launch({(unsigned)((L + 63) / 64), (unsigned)(B * H), 1}, 128, dq_smem, [&] {
        PICK(dq, c.f16, D)(q.p, q.s, k.p, k.s, v.p, v.s, dO.p, dO.s, out.data(), so, lse.data(), delta.data(), dq.data(), H,
                           L, S, lens_p, scale, c.causal);
    });
    launch({(unsigned)((S + 63) / 64), (unsigned)(B * H), 1}, 128, dkv_smem, [&] {
        PICK(dkv, c.f16, D)(q.p, q.s, k.p, k.s, v.p, v.s, dO.p, dO.s, lse.data(), delta.data(), dk.data(), dv.data(), H, L,
                            S, lens_p, scale, c.causal);
    });
    // Kernel outputs as [B, H, T, D] doubles.
    auto bhtd = [&](const std::vector<unsigned short>& x, int T) {
        std::vector<double> r((size_t)B * H * T * D);
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int t = 0; t < T; ++t)
                    for (int d = 0; d < D; ++d)
                        r[(((size_t)b * H + h) * T + t) * D + d] = val(c, x[(((size_t)b * T + t) * H + h) * D + d]);
        return r;
    };
    bool nan_bad = false;
    std::vector<double> glse(lse.begin(), lse.end());
    const double e_out = rel_err(bhtd(out, L), ro, &nan_bad, "out");
    double e_lse = 0;
    for (size_t i = 0; i < rlse.size(); ++i) {
        if (std::isinf(rlse[i]) || std::isinf(glse[i])) {
            if (rlse[i] != glse[i]) nan_bad = true;
            continue;
        }
        e_lse = std::max(e_lse, std::fabs(glse[i] - rlse[i]) / (1e-3 + 1e-3 * std::fabs(rlse[i])));
    }
    const double e_dq = rel_err(bhtd(dq, L), rdq, &nan_bad, "dq"), e_dk = rel_err(bhtd(dk, S), rdk, &nan_bad, "dk"),
                 e_dv = rel_err(bhtd(dv, S), rdv, &nan_bad, "dv");
    // Grads must be finite everywhere (NaN only in out, for queries that see no key).
    for (auto* g : {&dq, &dk, &dv})
        for (auto x : *g)
            if (std::isnan(val(c, x))) nan_bad = true;
    const bool ok = !nan_bad && e_out < 1e-2 && e_lse <= 1 && e_dq < 2e-2 && e_dk < 2e-2 && e_dv < 2e-2;
    printf("%s %s B%d H%d L%d S%d D%d causal %d lens %zu layout %d: out %.2e lse %.2f dq %.2e dk %.2e dv %.2e%s\n",
           ok ? "ok  " : "FAIL", c.f16 ? "f16 " : "bf16", B, H, L, S, D, c.causal, c.lens.size(), c.layout, e_out, e_lse,
           e_dq, e_dk, e_dv, nan_bad ? " NaN mismatch" : "");
    fflush(stdout);
    return ok;
}

int main(int argc, char** argv) {
    g_late_copies = argc > 1 && !strcmp(argv[1], "late");
    const char* only = argc > 2 ? argv[2] : "";
    std::vector<Case> cases = {
        {false, 1, 2, 200, 200, 64, true, {}, 0, 0},
        {false, 2, 1, 100, 130, 64, false, {}, 0, 0},
        {false, 2, 1, 100, 130, 64, true, {120, 51}, 1, 0},
        {true, 1, 1, 77, 50, 128, false, {}, 0, 0},
        {false, 2, 1, 77, 50, 128, true, {41, 0}, 0, 0},
        {false, 1, 2, 64, 64, 32, true, {}, 0, 0},
        {true, 1, 1, 65, 65, 32, false, {60}, 1, 0.3f},
        {false, 1, 1, 1, 1, 64, true, {}, 0, 0},
        {false, 1, 1, 63, 63, 64, true, {}, 2, 0},
        {false, 1, 1, 65, 200, 64, true, {}, 0, 0},
        {false, 1, 1, 300, 70, 64, true, {}, 0, 0},
        {true, 1, 1, 300, 70, 64, false, {}, 1, 0},
        {false, 1, 1, 129, 129, 128, true, {}, 2, 0},
        {false, 2, 2, 70, 70, 64, true, {}, 2, 0},
    };
    int failed = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        if (*only && std::to_string(i) != only) continue;
        failed += !run(cases[i]);
    }
    printf("%d failed\n", failed);
    return failed != 0;
}
