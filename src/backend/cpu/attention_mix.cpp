#include "backend/cpu/attention_mix.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// The weighted sum runs across d in the widest registers the CPU has (one clone per
// instruction set, chosen at load time); each output value's products and sums are the same
// two roundings in row order whatever the width (no contraction into fused multiply-adds: the
// file is built with -ffp-contract=off), so every clone gives the same bits. Not under
// AddressSanitizer: a clone's resolver runs while the program is relocated, before the
// sanitizer's shadow memory exists, and its instrumented read of the CPU model would crash
// (google/sanitizers#342); that build keeps the baseline code, with the same bits.
#if defined(__SANITIZE_ADDRESS__)
#define DS4_MIX_CLONES
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DS4_MIX_CLONES
#endif
#endif
#ifndef DS4_MIX_CLONES
#define DS4_MIX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace ds4::backend::cpu {

float attention_softmax(float *sc, size_t n_rows, float scale, float sink) {
    float mx = sink;
    for (size_t j = 0; j < n_rows; ++j) {
        sc[j] *= scale;
        mx = std::max(mx, sc[j]);
    }
    float den = std::exp(sink - mx);
    for (size_t j = 0; j < n_rows; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        den += sc[j];
    }
    return den;
}

DS4_MIX_CLONES void attention_mix_range(const float *e, const RowSegment *segments,
                                        size_t n_segments, float den, uint32_t D, uint32_t d0,
                                        uint32_t d1, float *oh) {
    std::fill(oh + d0, oh + d1, 0.0f);
    size_t j = 0;
    for (size_t s = 0; s < n_segments; ++s)
        for (size_t k = 0; k < segments[s].n; ++k, ++j) {
            const float w = e[j];
            const float *v = segments[s].rows + k * D;
            for (uint32_t d = d0; d < d1; ++d) oh[d] += w * v[d];
        }
    for (uint32_t d = d0; d < d1; ++d) oh[d] /= den;
}

// 16 floats: a register at AVX-512, two at AVX2, four below (GCC's vector extension); each
// element's product and sum are attention_mix_range's, rounded the same.
using Floats16 = float __attribute__((vector_size(64)));
constexpr uint32_t kVectors = kMixValues / 16;
constexpr size_t kHeadsAtOnce = 4;  // 16 accumulators and 4 row values fit AVX-512's 32 registers

DS4_MIX_CLONES void attention_mix_heads(const float *e, size_t e_stride, const float *den,
                                        size_t n_heads, const RowSegment *segments,
                                        size_t n_segments, uint32_t D, uint32_t d0, float *o) {
    size_t h0 = 0;
    for (; h0 + kHeadsAtOnce <= n_heads; h0 += kHeadsAtOnce) {
        Floats16 acc[kHeadsAtOnce][kVectors] = {};
        size_t j = 0;
        for (size_t s = 0; s < n_segments; ++s)
            for (size_t k = 0; k < segments[s].n; ++k, ++j) {
                Floats16 v[kVectors];
                std::memcpy(v, segments[s].rows + k * D + d0, sizeof v);
                for (size_t h = 0; h < kHeadsAtOnce; ++h) {
                    const float w = e[(h0 + h) * e_stride + j];
                    for (uint32_t c = 0; c < kVectors; ++c) acc[h][c] += w * v[c];
                }
            }
        for (size_t h = 0; h < kHeadsAtOnce; ++h) {
            for (uint32_t c = 0; c < kVectors; ++c) acc[h][c] /= den[h0 + h];
            std::memcpy(o + (h0 + h) * D + d0, acc[h], sizeof acc[h]);
        }
    }
    for (; h0 < n_heads; ++h0)
        attention_mix_range(e + h0 * e_stride, segments, n_segments, den[h0], D, d0,
                            d0 + kMixValues, o + h0 * D);
}

void attention_mix_head(float *sc, const RowSegment *segments, size_t n_segments, float scale,
                        float sink, uint32_t D, float *oh) {
    size_t n_rows = 0;
    for (size_t s = 0; s < n_segments; ++s) n_rows += segments[s].n;
    const float den = attention_softmax(sc, n_rows, scale, sink);
    attention_mix_range(sc, segments, n_segments, den, D, 0, D, oh);
}

}  // namespace ds4::backend::cpu
