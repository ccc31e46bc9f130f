#include "backend/cpu/attention_mix.h"

#include <algorithm>
#include <cmath>

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

DS4_MIX_CLONES void attention_mix_head(float *sc, const RowSegment *segments, size_t n_segments,
                                       float scale, float sink, uint32_t D, float *oh) {
    size_t n_rows = 0;
    for (size_t s = 0; s < n_segments; ++s) n_rows += segments[s].n;
    float mx = sink;
    for (size_t j = 0; j < n_rows; ++j) {
        sc[j] *= scale;
        mx = std::max(mx, sc[j]);
    }
    float den = std::exp(sink - mx);
    std::fill(oh, oh + D, 0.0f);
    size_t j = 0;
    for (size_t s = 0; s < n_segments; ++s)
        for (size_t k = 0; k < segments[s].n; ++k, ++j) {
            const float e = std::exp(sc[j] - mx);
            den += e;
            const float *v = segments[s].rows + k * D;
            for (uint32_t d = 0; d < D; ++d) oh[d] += e * v[d];
        }
    for (uint32_t d = 0; d < D; ++d) oh[d] /= den;
}

}  // namespace ds4::backend::cpu
