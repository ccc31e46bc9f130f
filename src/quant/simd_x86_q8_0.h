#pragma once
// Pieces of the Q8_0 dot's fixed order (q8_0.cpp, docs/MODEL.md 5.1) shared by the AVX2 and
// AVX-512 kernels, which compute each block's integer products differently (vpmaddwd, vpdpbusd)
// but must give the same bits. AVX2 only; internal linkage, as simd_x86_common.h says why.
#include <immintrin.h>

#include <cstdint>

#include "quant/blocks.h"
#include "quant/simd_x86_common.h"

namespace ds4::quant::simd {
namespace {

// v as it is, kept from being fused with a following addition: GCC contracts an intrinsic
// product and sum into one fma by default (-ffp-contract=fast), which rounds once where the
// reference rounds twice.
inline __m256 q8_unfused(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

// The exact sums of 8 blocks from their 8 int32 lanes each (p[k]: block k), block k in lane k:
// three rounds of pairwise horizontal adds leave each block's lanes 0-3 in the low 128 bits and
// lanes 4-7 in the high 128 bits; adding the two halves finishes. Integer adds: exact in any
// grouping.
inline __m256i q8_block_sums8(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(p[0], p[1]), b = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i c = _mm256_hadd_epi32(p[4], p[5]), d = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i lo = _mm256_hadd_epi32(a, b), hi = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                            _mm256_permute2x128_si256(lo, hi, 0x31));
}

// The f16 scales of 8 consecutive blocks, as f32.
inline __m256 q8_block_scales8(const BlockQ8_0 *blocks) {
    alignas(16) uint16_t d[8];
    for (int k = 0; k < 8; ++k) d[k] = blocks[k].d;
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(d)));
}

// An 8 x 8 matrix of 32-bit words transposed in place: a[i] lane j becomes a[j] lane i
// (unpacks of 32 and 64 bits, then the 128-bit halves exchanged).
inline void transpose8x8_epi32(__m256i a[8]) {
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(a[4], a[5]), t5 = _mm256_unpackhi_epi32(a[4], a[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(a[6], a[7]), t7 = _mm256_unpackhi_epi32(a[6], a[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    a[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    a[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    a[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    a[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    a[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    a[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    a[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    a[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// One block's term, float(sum_i w_i x_i) * (d_w * d_x), for the blocks after the last group of 8.
inline float q8_term(const BlockQ8_0 &w, const BlockQ8_0 &x) {
    int32_t sum = 0;
    for (int i = 0; i < kQK8_0; ++i) sum += w.qs[i] * x.qs[i];
    float term = static_cast<float>(sum) * (f16_to_f32(w.d) * f16_to_f32(x.d));
    __asm__("" : "+x"(term));  // not fused with the chain's addition (q8_unfused)
    return term;
}

// The 16 chains held as two registers of 8 (blocks 16g..16g+7, 16g+8..16g+15) plus the blocks
// after the last group of 8, summed in the reference's tree: chain l takes l + 8, l + 4, l + 2,
// l + 1.
inline float q8_finish_chains(const __m256 chains[2], const BlockQ8_0 *w, const BlockQ8_0 *x,
                              int64_t b, int64_t nb) {
    alignas(32) float lanes[kQ8_0Chains];
    _mm256_store_ps(lanes, chains[0]);
    _mm256_store_ps(lanes + 8, chains[1]);
    for (; b < nb; ++b) lanes[b % kQ8_0Chains] = lanes[b % kQ8_0Chains] + q8_term(w[b], x[b]);
    __m256 v = _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace ds4::quant::simd
