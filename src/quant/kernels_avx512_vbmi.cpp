// IQ2_XXS dot products for AVX-512 CPUs with VBMI and GFNI (Ice Lake, Zen 4 and later): the
// grid lookup and the signs done by byte shuffles, 64 groups of 8 values at a time.
//
// A grid point is 8 magnitudes, each one of three levels (8, 25, 43); with its sign, value j of
// a group is one of 6 states, 3 bits of information: 2 level bits from the grid point, 1 sign
// bit from the group's sign byte. The kernel
//   1. looks up the levels of 64 grid indices (a pair of super-blocks) in two 256-entry tables
//      held in 8 zmm registers (masked vpermi2b pairs): lo holds values 0..3 of a point, 2 bits
//      each, hi values 4..7;
//   2. completes the 64 sign bytes (7 sign bits, the 8th their parity) with one vpmultishiftqb
//      and one gf2p8affineqb, which also moves the bits where step 3 wants them;
//   3. merges the level bits of two values and their two sign bits into the low 6 bits of one
//      byte (a vpternlogd bit select; a shift for the second pair of a level byte);
//   4. maps each such byte to the weight's value plus a bias, w + 64 (21..107, unsigned), with
//      one vpermb per value position (a 64-entry table);
//   5. multiplies by the activations with vpdpbusd. The bias adds 64 * (the activations' sum);
//      the activation row carries minus that per sub-block and the sum starts from it.
// So the 64 bytes of one zmm are value j of 64 groups (two super-blocks). Byte 4t + i is group
// i of the sub-block in int32 lane t, and lane t holds, in the order one vshufps gathers them
// (decode_pair), sub-block 2 (t / 4) + t % 2 of block (t % 4) / 2 of the pair. So one vpmulld
// applies the 16 sub-block scales of a pair. The activations are laid out to match
// (ActivationLayout::Iq2xxsPositionMajor, quant.h):
//
//   pair p = super-blocks 2p, 2p+1 of the row, lanes t = 0..15, groups i = 0..3 of a lane,
//   q[512 p + 64 j + 4 t + i] = value j of group i of lane t's sub-block;
//   a last odd super-block b alone: sub-block s in lane s, q[256 b + 32 j + 4 s + i];
//   then the Q8_K scales d of every super-block, as floats, from byte n on;
//   then, from byte n + 4 n / 256, 16 int32 per pair (8 for a lone block), lane t's
//   -64 * (sum of its sub-block's q).
//
// That is n + n / 64 + n / 8 bytes, exactly the n / 256 * 292 of a Q8_K row. The int8 values
// are exactly the Q8_K quantizer's. Every integer is exact; the result equals the scalar
// reference up to float reassociation.
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
constexpr int kWeightBias = 64;     // added to every weight value so that vpdpbusd sees u8
constexpr int kSubBlocks = kQK_K / 32;

// Level of a grid magnitude: 8 -> 0, 25 -> 1, 43 -> 2.
constexpr uint8_t level_of(uint8_t magnitude) {
    return magnitude == 8 ? 0 : (magnitude == 25 ? 1 : 2);
}
constexpr int kMagnitude[4] = {8, 25, 43, 0};  // by level; level 3 never occurs

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

// Step 3's merged bytes. From a level byte L (values a..a+3 at bits 0-1, 2-3, 4-5, 6-7) and a
// sign byte S (below):
//   first  = bits 4, 5 from S (the signs of a, a+1), the rest from L: levels of a, a+1 at 0..3;
//   second = bits 0, 1 from S (the signs of a+2, a+3), the rest from L >> 2: levels of a+2,
//            a+3 at 2..5.
// vpermb reads the low 6 bits only, so the garbage in bits 6, 7 is never seen.
struct MergedField {
    int level_bit, sign_bit;
};
constexpr MergedField kFirstA{0, 4}, kFirstB{2, 5}, kSecondA{2, 0}, kSecondB{4, 1};
constexpr uint8_t kFirstSignBits = 0x30, kSecondSignBits = 0x03;

// Step 4's table for one field: index -> 64 + (-1)^sign * magnitude(level).
void weight_table(MergedField f, uint8_t (&table)[64]) {
    for (int i = 0; i < 64; ++i) {
        const int magnitude = kMagnitude[(i >> f.level_bit) & 3];
        table[i] =
            static_cast<uint8_t>(kWeightBias + ((i >> f.sign_bit) & 1 ? -magnitude : magnitude));
    }
}

// gf2p8affineqb computes, per byte x, bit i of the result as the parity of (x AND byte 7-i of
// the qword matrix), XOR bit i of the immediate. These are the matrices.
constexpr uint64_t affine_matrix(const uint8_t (&rows)[8]) {  // rows[i]: input bits of output i
    uint64_t m = 0;
    for (int i = 0; i < 8; ++i) m |= static_cast<uint64_t>(rows[i]) << (8 * (7 - i));
    return m;
}
// From a 7-bit sign index (input bits 0..6 = the signs of values 0..6; input bit 7 ignored) the
// sign byte that step 3 merges with the level byte of values a..a+3: the signs of a, a+1 at
// bits 4, 5 and of a+2, a+3 at bits 0, 1. The sign of value 7 is the parity of bits 0..6
// (ksigns, docs/MODEL.md 5.4).
constexpr uint8_t sign_source(int value) {
    return value == 7 ? uint8_t{0x7F} : static_cast<uint8_t>(1u << value);
}
constexpr uint64_t sign_matrix(int a) {
    const uint8_t rows[8] = {sign_source(a + 2), sign_source(a + 3), 0, 0,
                             sign_source(a),     sign_source(a + 1), 0, 0};
    return affine_matrix(rows);
}

// vpternlogd immediate for "mask ? b : a" with the operands (a, b, mask). The first operand
// is the one the instruction overwrites, so it is the level byte, not the shared constant.
constexpr int kSelect = 0xD8;

// Where a pair's values sit. A block's qs, as 16 dwords, holds the grid indices of sub-block s
// in dword 2s and its sign and scale word in 2s + 1. vshufps gathers, in each 128-bit lane L,
// the dwords of sub-blocks 2L, 2L+1 of block a, then those of block b (an in-lane shuffle, no
// index register): once the grid index dwords, once the sign and scale words. So int32 lane t
// of a pair is sub-block 2 (t / 4) + t % 2 of block (t % 4) / 2, and byte 4t + i of a
// register is group i of that sub-block.
constexpr int kIndexDwords = _MM_SHUFFLE(2, 0, 2, 0), kSignDwords = _MM_SHUFFLE(3, 1, 3, 1);
constexpr int lane_block(int t) {
    return (t % 4) / 2;
}
constexpr int lane_sub_block(int t) {
    return 2 * (t / 4) + t % 2;
}
// A last odd block alone fills the lanes of block 0; its activations are stored compactly,
// sub-block s at dword s, and spread to lane t by vpermd (lanes of block 1 zeroed).
constexpr __mmask16 kLoneLanes = 0x3333;

struct PairConstants {
    // vpmultishiftqb: byte i of a qword <- the 7 bits at 32 (i / 4) + 7 (i % 4)
    __m512i sign_shift;
    __m512i sign_lo, sign_hi;  // sign_matrix(0), sign_matrix(4)
    __m512i first_sign_bits, second_sign_bits, one;
    __m512i lo[4], hi[4];  // the level tables, 128 entries per vpermi2b pair
    __m512i first_a, first_b, second_a, second_b;  // weight_table of each merged field
    __m512i lone_spread;                           // dword t <- compact dword lane_sub_block(t)
    __m512i lane_blocks;                           // dword t <- lane_block(t)
};

__m512i load_weight_table(MergedField f) {
    alignas(64) uint8_t table[64];
    weight_table(f, table);
    return _mm512_load_si512(table);
}

PairConstants pair_constants() {
    PairConstants c;
    // bytes 0..3 of each qword: bits 7l .. 7l+7 of its low word (the top bit is the next
    // field's, or a scale bit, and the sign matrices ignore it); bytes 4..7 the same of its
    // high word. So byte 4t + i of the result is the sign index of group i of lane t.
    c.sign_shift = _mm512_set1_epi64(0x352E2720150E0700LL);
    c.sign_lo = _mm512_set1_epi64(static_cast<long long>(sign_matrix(0)));
    c.sign_hi = _mm512_set1_epi64(static_cast<long long>(sign_matrix(4)));
    c.first_sign_bits = _mm512_set1_epi8(static_cast<char>(kFirstSignBits));
    c.second_sign_bits = _mm512_set1_epi8(static_cast<char>(kSecondSignBits));
    c.one = _mm512_set1_epi32(1);
    const LevelTables &t = level_tables();
    for (int k = 0; k < 4; ++k) {
        c.lo[k] = _mm512_load_si512(t.lo + 64 * k);
        c.hi[k] = _mm512_load_si512(t.hi + 64 * k);
    }
    c.first_a = load_weight_table(kFirstA);
    c.first_b = load_weight_table(kFirstB);
    c.second_a = load_weight_table(kSecondA);
    c.second_b = load_weight_table(kSecondB);
    alignas(64) int32_t spread[16];
    for (int l = 0; l < 16; ++l) spread[l] = lane_sub_block(l);
    c.lone_spread = _mm512_load_si512(spread);
    for (int l = 0; l < 16; ++l) spread[l] = lane_block(l);
    c.lane_blocks = _mm512_load_si512(spread);
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
    __m512i biased[8];  // 64 + the value j of the 64 groups
    __m512i scale;      // 2 ls + 1 of the 16 sub-blocks
};

// Values a..a+3 of 64 groups from their level byte and their sign byte (steps 3 and 4).
inline void decode_quad(const PairConstants &c, __m512i levels, __m512i signs, __m512i *biased) {
    const __m512i second =
        _mm512_ternarylogic_epi32(_mm512_srli_epi16(levels, 2), signs, c.second_sign_bits, kSelect);
    const __m512i first = _mm512_ternarylogic_epi32(levels, signs, c.first_sign_bits, kSelect);
    biased[0] = _mm512_permutexvar_epi8(first, c.first_a);
    biased[1] = _mm512_permutexvar_epi8(first, c.first_b);
    biased[2] = _mm512_permutexvar_epi8(second, c.second_a);
    biased[3] = _mm512_permutexvar_epi8(second, c.second_b);
}

// blocks[0] and blocks[1]; kLone: blocks[0], a last odd block, alone (lanes of block 1 decode
// zeros, which meet zero activations).
template <bool kLone>
inline void decode_pair(const PairConstants &c, const BlockIQ2_XXS *blocks, PairWeights &pw) {
    const __m512 qa = _mm512_castsi512_ps(_mm512_loadu_si512(blocks[0].qs));
    const __m512 qb =
        kLone ? _mm512_setzero_ps() : _mm512_castsi512_ps(_mm512_loadu_si512(blocks[1].qs));
    const __m512i index = _mm512_castps_si512(_mm512_shuffle_ps(qa, qb, kIndexDwords));
    const __m512i words = _mm512_castps_si512(_mm512_shuffle_ps(qa, qb, kSignDwords));
    const __mmask64 high = _mm512_movepi8_mask(index);
    const __m512i lo = lookup256(c.lo, index, high), hi = lookup256(c.hi, index, high);
    const __m512i sign_index = _mm512_multishift_epi64_epi8(c.sign_shift, words);
    decode_quad(c, lo, _mm512_gf2p8affine_epi64_epi8(sign_index, c.sign_lo, 0), pw.biased);
    decode_quad(c, hi, _mm512_gf2p8affine_epi64_epi8(sign_index, c.sign_hi, 0), pw.biased + 4);
    pw.scale = _mm512_or_si512(_mm512_srli_epi32(words, 27), c.one);  // (word >> 28) * 2 + 1
}

// The q values, the scales and the bias corrections of an activation row of n values.
struct ActivationRow {
    const int8_t *q;
    const float *d;
    const int32_t *correction;  // -64 * sum of q, per sub-block, in lane order
};
ActivationRow activation_row(const void *x, int64_t n) {
    const auto *bytes = static_cast<const uint8_t *>(x);
    const int64_t nb = n / kQK_K;
    return {reinterpret_cast<const int8_t *>(bytes), reinterpret_cast<const float *>(bytes + n),
            reinterpret_cast<const int32_t *>(bytes + n + 4 * nb)};
}

// The float scale of each int32 lane of a pair: d_w * d_x of block lane_block(t) in lane t
// (kLone: block 1's lanes hold zero sums and get 0).
template <bool kLone>
inline __m512 pair_scale(const PairConstants &c, const BlockIQ2_XXS *blocks, const float *dx) {
    const uint32_t halves = kLone ? blocks[0].d : blocks[0].d | uint32_t{blocks[1].d} << 16;
    const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(halves)));
    // (_mm_loadl_epi64 reads 8 bytes unaligned; dx is only 4-byte aligned)
    const __m128 x = kLone
                         ? _mm_load_ss(dx)
                         : _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(dx)));
    return _mm512_permutexvar_ps(c.lane_blocks, _mm512_castps128_ps512(_mm_mul_ps(dw, x)));
}

// For each of kW weight rows' pairs pw[w]: acc[w] += d[w] * (2 ls + 1) * sum over the
// sub-block of value * q, for one activation pair starting at super-block b, d[w] = pair_scale.
// Each activation register is loaded once for the kW weight rows.
template <bool kLone, int kW>
inline void accumulate_pairs(const PairConstants &c, const PairWeights *pw,
                             const ActivationRow &row, int64_t b, const __m512 *d, __m512 *acc) {
    const int8_t *q = row.q + b * kQK_K;
    const int32_t *correction = row.correction + b * kSubBlocks;
    // 64 bytes (16 lanes) of a pair, or 32 compact bytes of a lone block spread to its lanes
    auto load = [&c](const void *p) {
        if (!kLone) return _mm512_loadu_si512(p);
        const __m256i compact = _mm256_loadu_si256(static_cast<const __m256i *>(p));
        return _mm512_maskz_permutexvar_epi32(kLoneLanes, c.lone_spread,
                                              _mm512_castsi256_si512(compact));
    };
    constexpr int stride = kLone ? 32 : 64;
    const __m512i start = load(correction);
    __m512i even[kW], odd[kW];
    for (int w = 0; w < kW; ++w) even[w] = start, odd[w] = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        const __m512i x0 = load(q + stride * j), x1 = load(q + stride * (j + 1));
        for (int w = 0; w < kW; ++w) {
            even[w] = _mm512_dpbusd_epi32(even[w], pw[w].biased[j], x0);
            odd[w] = _mm512_dpbusd_epi32(odd[w], pw[w].biased[j + 1], x1);
        }
    }
    for (int w = 0; w < kW; ++w) {
        const __m512i sum = _mm512_mullo_epi32(_mm512_add_epi32(even[w], odd[w]), pw[w].scale);
        acc[w] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d[w], acc[w]);
    }
}

float hsum(__m512 acc) {
    return 0.125f * _mm512_reduce_add_ps(acc);  // the grid's 1/8 (docs/MODEL.md 5.4)
}

}  // namespace

void quantize_row_q8_K_iq2_xxs(const float *src, void *dst, int64_t n) {
    const int64_t nb = n / kQK_K;
    auto *q = static_cast<int8_t *>(dst);
    auto *d = reinterpret_cast<float *>(q + n);
    auto *correction = reinterpret_cast<int32_t *>(q + n + 4 * nb);
    BlockQ8_K blocks[2];
    for (int64_t b = 0; b < nb; b += 2) {
        const int count = nb - b >= 2 ? 2 : 1;
        avx512::quantize_row_q8_K(src + b * kQK_K, blocks, int64_t{count} * kQK_K);
        int8_t *pair_q = q + b * kQK_K;
        const int stride = 32 * count;  // bytes per value position
        // lane t of a pair: sub-block lane_sub_block(t) of block lane_block(t); a lone block:
        // sub-block t in lane t
        for (int t = 0; t < 8 * count; ++t) {
            const int h = count == 2 ? lane_block(t) : 0;
            const int s = count == 2 ? lane_sub_block(t) : t;
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 8; ++j)
                    pair_q[stride * j + 4 * t + i] = blocks[h].qs[32 * s + 8 * i + j];
            const int32_t sum = blocks[h].bsums[2 * s] + blocks[h].bsums[2 * s + 1];
            const int32_t value = -kWeightBias * sum;
            std::memcpy(correction + b * kSubBlocks + t, &value, sizeof value);
        }
        for (int h = 0; h < count; ++h) std::memcpy(d + b + h, &blocks[h].d, sizeof(float));
    }
}

float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const int64_t nb = n / kQK_K;
    static const PairConstants c = pair_constants();
    const ActivationRow row = activation_row(x, n);
    PairWeights pw;
    __m512 acc = _mm512_setzero_ps();
    simd::StreamPrefetch prefetch(w);
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        prefetch.ahead(wb + b);
        decode_pair<false>(c, wb + b, pw);
        const __m512 d = pair_scale<false>(c, wb + b, row.d + b);
        accumulate_pairs<false, 1>(c, &pw, row, b, &d, &acc);
    }
    if (b < nb) {
        decode_pair<true>(c, wb + b, pw);
        const __m512 d = pair_scale<true>(c, wb + b, row.d + b);
        accumulate_pairs<true, 1>(c, &pw, row, b, &d, &acc);
    }
    return hsum(acc);
}

namespace {

// kW weight rows (stride w_stride bytes) against m activation rows: each pair of each weight row
// decoded once for up to kMultiRows activation rows, each activation register loaded once for
// the kW weight rows. Per weight row and activation row the operations of vec_dot, in its
// order, so each result equals vec_dot's bit for bit.
template <int kW>
void multi_rows(const PairConstants &c, int64_t n, const uint8_t *w, size_t w_stride, const void *x,
                size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    const int64_t nb = n / kQK_K;
    PairWeights pw[kW];
    const BlockIQ2_XXS *wb[kW];
    for (int i = 0; i < kW; ++i) wb[i] = reinterpret_cast<const BlockIQ2_XXS *>(w + i * w_stride);
    const auto *x_bytes = static_cast<const uint8_t *>(x);
    for (int64_t j0 = 0; j0 < m; j0 += kMultiRows) {
        const int64_t rows = m - j0 < kMultiRows ? m - j0 : kMultiRows;
        __m512 acc[kMultiRows][kW];
        for (int64_t j = 0; j < rows; ++j)
            for (int i = 0; i < kW; ++i) acc[j][i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 2) {
            const bool lone = b + 1 == nb;
            for (int i = 0; i < kW; ++i) {
                if (lone)
                    decode_pair<true>(c, wb[i] + b, pw[i]);
                else
                    decode_pair<false>(c, wb[i] + b, pw[i]);
            }
            for (int64_t j = 0; j < rows; ++j) {
                const ActivationRow row = activation_row(x_bytes + (j0 + j) * x_stride, n);
                __m512 d[kW];
                for (int i = 0; i < kW; ++i)
                    d[i] = lone ? pair_scale<true>(c, wb[i] + b, row.d + b)
                                : pair_scale<false>(c, wb[i] + b, row.d + b);
                if (lone)
                    accumulate_pairs<true, kW>(c, pw, row, b, d, acc[j]);
                else
                    accumulate_pairs<false, kW>(c, pw, row, b, d, acc[j]);
            }
        }
        for (int64_t j = 0; j < rows; ++j)
            for (int i = 0; i < kW; ++i) out[(j0 + j) * out_stride + i] = hsum(acc[j][i]);
    }
}

}  // namespace

// Two weight rows per pass (a third would spill the decoded pairs of every row).
void vec_dot_multi_iq2_xxs_q8_K(int64_t n, const void *w, size_t w_stride, int64_t n_w,
                                const void *x, size_t x_stride, int64_t m, float *out,
                                int64_t out_stride) {
    static const PairConstants c = pair_constants();
    const auto *rows = static_cast<const uint8_t *>(w);
    int64_t i = 0;
    for (; i + 2 <= n_w; i += 2)
        multi_rows<2>(c, n, rows + i * w_stride, w_stride, x, x_stride, m, out + i, out_stride);
    if (i < n_w)
        multi_rows<1>(c, n, rows + i * w_stride, w_stride, x, x_stride, m, out + i, out_stride);
}

}  // namespace ds4::quant::avx512vbmi
