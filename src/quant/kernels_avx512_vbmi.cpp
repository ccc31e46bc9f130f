// IQ2_XXS dot products for AVX-512 CPUs with VBMI and GFNI (Ice Lake, Zen 4 and later): the
// grid lookup done by byte shuffles instead of 32 scalar table loads per super-block.
//
// The idea: a grid point is 8 magnitudes, each one of three levels (8, 25, 43). Its 8 levels
// fit 2 bits each, so two 256-byte tables hold every grid point: lo[i] the levels of values
// 0..3 of point i, hi[i] those of values 4..7. Both tables live in 8 zmm registers, and one
// masked vpermi2b pair looks up 64 grid indices at once. A gf2p8affineqb then turns the two
// level bits of value j into its magnitude (an affine map over GF(2), below), for 64 groups
// at once. So the 64 bytes of one zmm are value j of 64 groups (two super-blocks), and the
// activations are laid out to match (ActivationLayout::Iq2xxsPositionMajor, quant.h):
//
//   pair p = super-blocks 2p, 2p+1 of the row, groups g = 0..63 (g < 32: block 2p's group g),
//   q[512 p + 64 j + g] = value j of group g (the row's value 256 (2p + g / 32) + 8 (g % 32) + j);
//   a last odd super-block b: q[256 b + 32 j + g] = its value 8 g + j;
//   then the Q8_K scales d of every super-block, as floats, from byte n on;
//   then zeros up to the Q8_K row size.
//
// That is n + n / 64 bytes, less than the n / 256 * 292 of a Q8_K row, so the buffers stay
// the Q8_K size. The int8 values are exactly the Q8_K quantizer's.
//
// Products: vpdpbusd of the magnitudes (unsigned) with the activations negated where the
// weight is negative (|q| <= 127 for every finite input, so the negation is exact). Lane t
// of the int32 sum covers bytes 4t..4t+3, i.e. four groups of one sub-block of 32 values, so
// one vpmulld applies the 16 sub-block scales of a pair. Every integer is exact; the result
// equals the scalar reference up to float reassociation.
//
// Compiled with these flags only (src/quant/CMakeLists.txt): no inline function with external
// linkage and no std:: template here (see simd_x86_common.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernels_simd.h"
#include "quant/simd_x86_common.h"

namespace ds4::quant::avx512vbmi {
namespace {

constexpr int64_t kMultiRows = 32;  // activation rows per pass of the multi-row dot
constexpr int kPairGroups = 64;     // 8-value groups in a pair of super-blocks

// Level of a grid magnitude: 8 -> 0, 25 -> 1, 43 -> 2.
constexpr uint8_t level_of(uint8_t magnitude) {
    return magnitude == 8 ? 0 : (magnitude == 25 ? 1 : 2);
}

struct LevelTables {
    alignas(64) uint8_t lo[256];  // bits 2j, 2j+1: the level of value j of grid point i, j < 4
    alignas(64) uint8_t hi[256];  // the same for values 4..7
};

const LevelTables &level_tables() {
    static const LevelTables tables = [] {
        LevelTables t{};
        for (int i = 0; i < 256; ++i)
            for (int j = 0; j < 8; ++j) {
                const uint8_t level = level_of((kIq2xxsGrid[i] >> (8 * j)) & 0xFF);
                (j < 4 ? t.lo : t.hi)[i] |= static_cast<uint8_t>(level << (2 * (j % 4)));
            }
        return t;
    }();
    return tables;
}

// gf2p8affineqb computes, per byte x, bit i of the result as the parity of (x AND byte 7-i of
// the qword matrix), XOR bit i of the immediate. These are the matrices.
constexpr uint64_t affine_matrix(const uint8_t (&rows)[8]) {  // rows[i]: input bits of output i
    uint64_t m = 0;
    for (int i = 0; i < 8; ++i) m |= static_cast<uint64_t>(rows[i]) << (8 * (7 - i));
    return m;
}
// Magnitude of the level held in bits s, s+1 (l0, l1): 8 ^ (l0 ? 17 : 0) ^ (l1 ? 35 : 0) gives
// 8, 25, 43 for levels 0, 1, 2 (level 3 never occurs). Output bits: 0 = l0^l1, 1 = l1, 4 = l0,
// 5 = l1, and the immediate 8 sets bit 3. Every other input bit is ignored.
constexpr uint64_t magnitude_matrix(int s) {
    const uint8_t l0 = static_cast<uint8_t>(1u << s), l1 = static_cast<uint8_t>(1u << (s + 1));
    const uint8_t rows[8] = {static_cast<uint8_t>(l0 | l1), l1, 0, 0, l0, l1, 0, 0};
    return affine_matrix(rows);
}
constexpr int kMagnitudeBase = 8;
// Bits 0..6 kept, bit 7 set to their parity: a 7-bit sign index completed to its sign byte
// (ksigns, MODEL.md 5.4). Input bit 7 is ignored.
constexpr uint64_t parity_matrix() {
    const uint8_t rows[8] = {1, 2, 4, 8, 16, 32, 64, 0x7F};
    return affine_matrix(rows);
}

// Byte b of a pair gathers group b's byte from the two blocks' qs (64 bytes each, as two
// permutex2var sources): a group's 4 grid indices are bytes 8s..8s+3 of its block's qs
// (sub-block s = g / 4), its sign word bytes 8s+4..8s+7.
struct PairConstants {
    __m512i group_byte;  // group b -> byte 8 (g / 4) + g % 4 of its block (+64: second block)
    __m512i sign_shift;  // vpmultishiftqb: the four 7-bit sign fields of a qword's high word
    __m512i scale_word;  // int32 lane t -> the sign/scale word of sub-block t of the pair
    __m512i parity, one;
    __m512i lo[4], hi[4];  // the level tables, 128 entries per vpermi2b pair
    __m512i magnitude[4];  // magnitude_matrix(2j) for value j (mod 4)
};

PairConstants pair_constants() {
    PairConstants c;
    alignas(64) uint8_t group_byte[kPairGroups];
    for (int b = 0; b < kPairGroups; ++b)
        group_byte[b] = static_cast<uint8_t>((b < 32 ? 0 : 64) + 8 * ((b % 32) / 4) + b % 4);
    c.group_byte = _mm512_load_si512(group_byte);
    // bytes 0..3 of each qword: bits 32+7l .. 32+7l+7 (the top bit is the next field's, and
    // the parity matrix ignores it); bytes 4..7 the same again
    c.sign_shift = _mm512_set1_epi64(0x352E2720352E2720LL);
    c.scale_word = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    c.parity = _mm512_set1_epi64(static_cast<long long>(parity_matrix()));
    c.one = _mm512_set1_epi32(1);
    const LevelTables &t = level_tables();
    for (int k = 0; k < 4; ++k) {
        c.lo[k] = _mm512_load_si512(t.lo + 64 * k);
        c.hi[k] = _mm512_load_si512(t.hi + 64 * k);
        c.magnitude[k] = _mm512_set1_epi64(static_cast<long long>(magnitude_matrix(2 * k)));
    }
    return c;
}

// Levels of 64 grid indices from a 256-entry table in four zmm: entries 128..255 for the
// indices with bit 7 set, then 0..127 for the rest (vpermi2b reads 7 index bits; the masked
// lanes keep their index, then their looked-up value).
__m512i lookup256(const __m512i (&table)[4], __m512i index, __mmask64 high) {
    const __m512i upper = _mm512_mask2_permutex2var_epi8(table[2], index, high, table[3]);
    return _mm512_mask2_permutex2var_epi8(table[0], upper, _knot_mask64(high), table[1]);
}

// The weight side of a pair of super-blocks, decoded once for any number of activation rows.
struct PairWeights {
    __m512i magnitude[8];   // value j of the 64 groups
    __m512i signs;          // per group: bit j set = value j negative
    __mmask64 negative[8];  // value j's signs as a mask, per group (negative_masks)
    __m512i scale;          // 2 ls + 1 of the 16 sub-blocks
    float d[2];             // f16(d) of the two blocks
};

// blocks[0] and blocks[1]; kLone: blocks[0], a last odd block, alone (its groups in lanes
// 0..31; lanes 32..63 decode block zeros, which meet zero activations).
template <bool kLone>
inline void decode_pair(const PairConstants &c, const BlockIQ2_XXS *blocks, PairWeights &pw) {
    const __m512i qa = _mm512_loadu_si512(blocks[0].qs);
    const __m512i qb = kLone ? _mm512_setzero_si512() : _mm512_loadu_si512(blocks[1].qs);
    const __m512i index = _mm512_permutex2var_epi8(qa, c.group_byte, qb);
    const __mmask64 high = _mm512_movepi8_mask(index);
    const __m512i lo = lookup256(c.lo, index, high), hi = lookup256(c.hi, index, high);
    for (int k = 0; k < 4; ++k) {
        pw.magnitude[k] = _mm512_gf2p8affine_epi64_epi8(lo, c.magnitude[k], kMagnitudeBase);
        pw.magnitude[4 + k] = _mm512_gf2p8affine_epi64_epi8(hi, c.magnitude[k], kMagnitudeBase);
    }
    __m512i signs =
        _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(c.sign_shift, qa), c.group_byte,
                                 _mm512_multishift_epi64_epi8(c.sign_shift, qb));
    signs = _mm512_gf2p8affine_epi64_epi8(signs, c.parity, 0);
    pw.signs = signs;
    const __m512i words = _mm512_permutex2var_epi32(qa, c.scale_word, qb);
    pw.scale = _mm512_or_si512(_mm512_srli_epi32(words, 27), c.one);  // (word >> 28) * 2 + 1
    pw.d[0] = simd::f16_to_f32(blocks[0].d);
    pw.d[1] = kLone ? 0.0f : simd::f16_to_f32(blocks[1].d);
}

__mmask64 negative_mask(__m512i signs, int j) {
    return _mm512_test_epi8_mask(signs, _mm512_set1_epi8(static_cast<char>(1u << j)));
}

// Fills pw.negative, for a pair that meets many activation rows. (A single row tests each
// mask where it is used: eight live masks would not fit the k registers.)
void negative_masks(PairWeights &pw) {
    for (int j = 0; j < 8; ++j) pw.negative[j] = negative_mask(pw.signs, j);
}

// acc += (d_w * d_x per block) * (2 ls + 1) * sum over the sub-block of magnitude * (+-q), for
// one activation pair. `q` is the pair's position-major values: 64 bytes per value position, or
// 32 for a lone last block (kLone: its loads stop at 32 bytes).
template <bool kLone, bool kMasksReady>
inline __m512 accumulate_pair(const PairWeights &pw, const int8_t *q, const float *dx, __m512 acc) {
    constexpr int stride = kLone ? 32 : kPairGroups;
    constexpr __mmask64 lanes = kLone ? __mmask64{0xFFFFFFFF} : ~__mmask64{0};
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
        const __m512i x = _mm512_maskz_loadu_epi8(lanes, q + stride * j);
        const __m512i signed_x =
            _mm512_mask_sub_epi8(x, kMasksReady ? pw.negative[j] : negative_mask(pw.signs, j),
                                 _mm512_setzero_si512(), x);
        if (j % 2 == 0)
            even = _mm512_dpbusd_epi32(even, pw.magnitude[j], signed_x);
        else
            odd = _mm512_dpbusd_epi32(odd, pw.magnitude[j], signed_x);
    }
    const __m512i sum = _mm512_mullo_epi32(_mm512_add_epi32(even, odd), pw.scale);
    const float d0 = pw.d[0] * dx[0], d1 = kLone ? 0.0f : pw.d[1] * dx[1];
    const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d, acc);
}

// The q values and the scales of an activation row of n values (layout above).
struct ActivationRow {
    const int8_t *q;
    const float *d;
};
ActivationRow activation_row(const void *x, int64_t n) {
    const auto *bytes = static_cast<const uint8_t *>(x);
    return {reinterpret_cast<const int8_t *>(bytes), reinterpret_cast<const float *>(bytes + n)};
}

float hsum(__m512 acc) {
    return 0.125f * _mm512_reduce_add_ps(acc);  // the grid's 1/8 (MODEL.md 5.4)
}

}  // namespace

void quantize_row_q8_K_iq2_xxs(const float *src, void *dst, int64_t n) {
    const int64_t nb = n / kQK_K;
    auto *q = static_cast<int8_t *>(dst);
    auto *d = reinterpret_cast<float *>(q + n);
    BlockQ8_K blocks[2];
    for (int64_t b = 0; b < nb; b += 2) {
        const int count = nb - b >= 2 ? 2 : 1;
        avx512::quantize_row_q8_K(src + b * kQK_K, blocks, int64_t{count} * kQK_K);
        const int groups = 32 * count;  // also the bytes per value position
        for (int h = 0; h < count; ++h) {
            for (int g = 0; g < 32; ++g)
                for (int j = 0; j < 8; ++j)
                    q[b * kQK_K + groups * j + 32 * h + g] = blocks[h].qs[8 * g + j];
            std::memcpy(d + b + h, &blocks[h].d, sizeof(float));
        }
    }
    const size_t used = static_cast<size_t>(n) + sizeof(float) * static_cast<size_t>(nb);
    std::memset(q + used, 0, static_cast<size_t>(nb) * sizeof(BlockQ8_K) - used);
}

float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const int64_t nb = n / kQK_K;
    static const PairConstants c = pair_constants();
    const ActivationRow row = activation_row(x, n);
    PairWeights pw;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        decode_pair<false>(c, wb + b, pw);
        acc = accumulate_pair<false, false>(pw, row.q + b * kQK_K, row.d + b, acc);
    }
    if (b < nb) {
        decode_pair<true>(c, wb + b, pw);
        acc = accumulate_pair<true, false>(pw, row.q + b * kQK_K, row.d + b, acc);
    }
    return hsum(acc);
}

// Each pair decoded once for up to kMultiRows rows; per row the same operations in the same
// order as vec_dot, so each result equals vec_dot's bit for bit.
void vec_dot_multi_iq2_xxs_q8_K(int64_t n, const void *w, const void *x, size_t x_stride, int64_t m,
                                float *out, int64_t out_stride) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const int64_t nb = n / kQK_K;
    static const PairConstants c = pair_constants();
    PairWeights pw;
    const auto *x_bytes = static_cast<const uint8_t *>(x);
    for (int64_t j0 = 0; j0 < m; j0 += kMultiRows) {
        const int64_t rows = m - j0 < kMultiRows ? m - j0 : kMultiRows;
        __m512 acc[kMultiRows];
        for (int64_t j = 0; j < rows; ++j) acc[j] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 2) {
            const bool lone = b + 1 == nb;
            if (lone)
                decode_pair<true>(c, wb + b, pw);
            else
                decode_pair<false>(c, wb + b, pw);
            negative_masks(pw);
            for (int64_t j = 0; j < rows; ++j) {
                const ActivationRow row = activation_row(x_bytes + (j0 + j) * x_stride, n);
                const int8_t *q = row.q + b * kQK_K;
                acc[j] = lone ? accumulate_pair<true, true>(pw, q, row.d + b, acc[j])
                              : accumulate_pair<false, true>(pw, q, row.d + b, acc[j]);
            }
        }
        for (int64_t j = 0; j < rows; ++j) out[(j0 + j) * out_stride] = hsum(acc[j]);
    }
}

}  // namespace ds4::quant::avx512vbmi
