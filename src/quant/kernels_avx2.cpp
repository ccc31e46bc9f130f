// AVX2 (+FMA, F16C, BMI2) twins of the scalar reference kernels (kernels_ref.h): the two
// activation quantizers (bit-identical to the reference) and the weight-row . activation-row
// dot products (equal up to float reassociation). Layouts and formulas: docs/MODEL.md section 5.
//
// Every integer product is exact for every valid block, including activations of -128 and
// weights of -128: where ggml's sign trick (maddubs(|x|, sign(w, x))) would wrap -(-128) or
// saturate, these kernels widen to int16 (Q8_0) or give the sign to the operand that cannot
// overflow (MXFP4, IQ2_XXS: |x| <= 128 unsigned times a signed value <= 43).
//
// This file is compiled with -mavx2 while others are not, so it defines no inline function
// with external linkage and instantiates no std:: template: the linker could otherwise keep
// this file's copy for a caller on a CPU without AVX2. Helpers live in an unnamed namespace.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernel_scratch.h"
#include "quant/kernels_simd.h"
#include "quant/simd_x86_common.h"
#include "quant/simd_x86_q8_0.h"

namespace ds4::quant::avx2 {
namespace {

__m256i load256(const void *p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
}
__m128i load128(const void *p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
}

float hsum_f32x8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float hsum_f32x4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float hmax_f32x8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__m256 abs_f32x8(__m256 v) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

// Exact sum of w_i * x_i over 32 signed bytes each, as 8 int32 partial sums (widening to int16
// keeps -128 * -128 exact, which maddubs cannot).
__m256i dot_i8x32_exact(const int8_t *w, const int8_t *x) {
    const __m256i w_lo = _mm256_cvtepi8_epi16(load128(w));
    const __m256i w_hi = _mm256_cvtepi8_epi16(load128(w + 16));
    const __m256i x_lo = _mm256_cvtepi8_epi16(load128(x));
    const __m256i x_hi = _mm256_cvtepi8_epi16(load128(x + 16));
    return _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi));
}

// u8 x s8 products summed in pairs (maddubs), then pairs of int16 summed into int32.
__m256i dot_u8_s8_to_i32(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// roundf(v) clamped to [-128, 127] as the reference does: ties away from zero, NaN -> 0,
// +-inf -> the bound (1/d overflows when amax is tiny). Returns int32 lanes.
__m256i round_half_away_clamped_epi32(__m256 v) {
    const __m256 truncated = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(v, truncated);  // exact (NaN for inf)
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 away =
        _mm256_and_ps(_mm256_cmp_ps(abs_f32x8(frac), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                      _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
    __m256 r = _mm256_add_ps(truncated, away);
    r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));  // NaN -> 0
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
}

// Packs 4 x 8 int32 (already within int8 range) into 32 int8 in order.
__m256i pack_i32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7
    const __m256i cd = _mm256_packs_epi32(c, d);
    const __m256i abcd = _mm256_packs_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// IQ2_XXS sign words and scales are unpacked for up to this many super-blocks in a first pass:
// the parity computation is a long dependency chain, and ahead of the dot loop it no longer
// holds up the products.
constexpr int kIq2Chunk = 16;

struct Iq2Unpacked {
    alignas(32) uint32_t sign_words[kIq2Chunk][8];  // per group: bit i set = value i negative
    alignas(32) uint32_t scales[kIq2Chunk][8];      // per group: 2*ls+1 in both int16 halves
};

// Each group's second u32 a1 holds four 7-bit sign indices s_l (bits 7l..7l+6) and the scale ls
// (bits 28..31). Sign byte l is s_l completed by its parity bit (ksigns[s] = s | parity(s) << 7,
// docs/MODEL.md 5.4), so no table is needed.
void iq2_xxs_unpack(const BlockIQ2_XXS *blocks, int count, Iq2Unpacked &out) {
    const __m256i m7 = _mm256_set1_epi32(0x7F);
    for (int i = 0; i < count; ++i) {
        const auto *qs = reinterpret_cast<const uint8_t *>(blocks[i].qs);
        const __m256 groups_0_3 = _mm256_castsi256_ps(load256(qs));  // a0 a1 of groups 0..3
        const __m256 groups_4_7 = _mm256_castsi256_ps(load256(qs + 32));
        // odd u32 lanes: a1 of groups 0 1 4 5 | 2 3 6 7, then the 64-bit pairs put in order
        const __m256i a1 = _mm256_permute4x64_epi64(
            _mm256_castps_si256(_mm256_shuffle_ps(groups_0_3, groups_4_7, _MM_SHUFFLE(3, 1, 3, 1))),
            _MM_SHUFFLE(3, 1, 2, 0));
        __m256i v = _mm256_and_si256(a1, m7);
        v = _mm256_or_si256(v,
                            _mm256_and_si256(_mm256_slli_epi32(a1, 1), _mm256_slli_epi32(m7, 8)));
        v = _mm256_or_si256(v,
                            _mm256_and_si256(_mm256_slli_epi32(a1, 2), _mm256_slli_epi32(m7, 16)));
        v = _mm256_or_si256(v,
                            _mm256_and_si256(_mm256_slli_epi32(a1, 3), _mm256_slli_epi32(m7, 24)));
        // bit 0 of each byte of t becomes the xor of that byte's bits
        __m256i t = _mm256_xor_si256(v, _mm256_srli_epi32(v, 4));
        t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 2));
        t = _mm256_xor_si256(t, _mm256_srli_epi32(t, 1));
        v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(t, _mm256_set1_epi8(1)), 7));
        _mm256_store_si256(reinterpret_cast<__m256i *>(out.sign_words[i]), v);
        const __m256i sc =
            _mm256_or_si256(_mm256_srli_epi32(a1, 27), _mm256_set1_epi32(1));  // 2*ls+1
        _mm256_store_si256(reinterpret_cast<__m256i *>(out.scales[i]),
                           _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)));
    }
}

// The 32 values of a Q8_0 block in v[0..3], and their largest magnitude (max(|x|, m) keeps m
// when x is NaN, like the reference's fmax).
float q8_0_block_load(const float *x, __m256 v[4]) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(abs_f32x8(v[k]), m);
    }
    return hmax_f32x8(m);
}

}  // namespace

// Q8_0 weight row, as gguf-py / ggml quantize_row_q8_0_ref: d = amax/127, id = 1/d (0 when
// d = 0), q = roundf(x * id), d stored as f16 (round to nearest even).
void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        __m256 v[4];
        const float d = q8_0_block_load(src + b * kQK8_0, v) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = simd::f32_to_f16_rne(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) q[k] = round_half_away_clamped_epi32(_mm256_mul_ps(v[k], vid));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out[b].qs),
                            pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

// Q8_0 activation row, ds4's rule (kernels_ref.h): d = amax/127, q = cvtps2dq(x / d) (nearest,
// ties to even; NaN and overflow give INT_MIN), saturated to int8; d = 0 -> q = 0.
void quantize_row_q8_0_activation(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        __m256 v[4];
        const float d = q8_0_block_load(src + b * kQK8_0, v) / 127.0f;
        out[b].d = simd::f32_to_f16_rne(d);
        if (d == 0.0f) {
            std::memset(out[b].qs, 0, sizeof(out[b].qs));
            continue;
        }
        const __m256 vd = _mm256_set1_ps(d);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_div_ps(v[k], vd));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out[b].qs),
                            pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

// Q8_K activation row (docs/MODEL.md 5.5): vmax = first element of largest |x|, iscale = -127/vmax,
// q = clamp(lrint(iscale * x), -128, 127), d = 1/iscale, bsums = sums of 16 quants.
void quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        BlockQ8_K &y = out[b];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < kQK_K; k += 8) m = _mm256_max_ps(abs_f32x8(_mm256_loadu_ps(x + k)), m);
        const float amax = hmax_f32x8(m);
        if (amax == 0.0f) {
            std::memset(&y, 0, sizeof(y));
            continue;
        }
        // The first element whose magnitude is amax (the reference keeps the first maximum).
        float vmax = 0.0f;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int k = 0; k < kQK_K; k += 8) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(abs_f32x8(_mm256_loadu_ps(x + k)), vamax, _CMP_EQ_OQ));
            if (hit != 0) {
                vmax = x[k + __builtin_ctz(static_cast<unsigned>(hit))];
                break;
            }
        }
        const float iscale = -127.0f / vmax;
        const __m256 vscale = _mm256_set1_ps(iscale);
        const __m256i lo = _mm256_set1_epi32(-128);
        const __m256i hi = _mm256_set1_epi32(127);
        for (int k = 0; k < kQK_K; k += 32) {
            __m256i q[4];
            for (int j = 0; j < 4; ++j) {
                // cvtps rounds to nearest even like lrint; out-of-range and NaN give INT_MIN.
                const __m256i r =
                    _mm256_cvtps_epi32(_mm256_mul_ps(vscale, _mm256_loadu_ps(x + k + 8 * j)));
                q[j] = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
            }
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(y.qs + k),
                                pack_i32_to_i8(q[0], q[1], q[2], q[3]));
            // bsums for values k..k+15 and k+16..k+31
            const __m256i s01 = _mm256_add_epi32(q[0], q[1]);
            const __m256i s23 = _mm256_add_epi32(q[2], q[3]);
            const __m256i h = _mm256_hadd_epi32(s01, s23);  // s01: 0+1 2+3 s23: 0+1 2+3 | ...
            const __m128i h4 =
                _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            const __m128i h2 = _mm_hadd_epi32(h4, h4);  // s01 total, s23 total, ...
            y.bsums[k / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(h2));
            y.bsums[k / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(h2, 1));
        }
        y.d = 1.0f / iscale;
    }
}

namespace {

// sum_i double(w_i) * double(x_i) with double accumulators, like the reference (docs/MODEL.md 5.6:
// the F32 matvec accumulates in double). Weights gives load4(i) (4 weights as f32) and one(i).
template <class Weights>
float dot_f32_in_f64(int64_t n, const Weights &w, const float *x) {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
    auto fma4 = [&](int64_t i, __m256d acc) {
        return _mm256_fmadd_pd(_mm256_cvtps_pd(w.load4(i)), _mm256_cvtps_pd(_mm_loadu_ps(x + i)),
                               acc);
    };
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = fma4(i, acc0);
        acc1 = fma4(i + 4, acc1);
        acc2 = fma4(i + 8, acc2);
        acc3 = fma4(i + 12, acc3);
    }
    for (; i + 4 <= n; i += 4) acc0 = fma4(i, acc0);
    double tail = 0.0;
    for (; i < n; ++i) tail += static_cast<double>(w.one(i)) * static_cast<double>(x[i]);
    const __m256d acc = _mm256_add_pd(_mm256_add_pd(acc0, acc1), _mm256_add_pd(acc2, acc3));
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return static_cast<float>(_mm_cvtsd_f64(s) + tail);
}

struct F32Weights {
    const float *p;
    __m128 load4(int64_t i) const { return _mm_loadu_ps(p + i); }
    float one(int64_t i) const { return p[i]; }
};

struct F16Weights {
    const uint16_t *p;
    __m128 load4(int64_t i) const {
        return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + i)));
    }
    float one(int64_t i) const { return simd::f16_to_f32(p[i]); }
};

// bf16 is the top half of an f32: widen to 32 bits and shift into place.
struct BF16Weights {
    const uint16_t *p;
    __m128 load4(int64_t i) const {
        const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + i));
        return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
    }
    float one(int64_t i) const {
        const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
    }
};

// dot_f32_in_f64 for kW weight rows against m activation rows: each span of kF64Span weights of
// each row is converted to double once, into a buffer, and each activation row's 4 values are
// converted once for the kW weight rows; every (weight row, activation row) pair then runs the
// single-row operations in the same order (acc0..acc3 over the 16-value steps, the 4-value
// steps into acc0, the scalar tail in double), so each result equals dot_f32_in_f64's bit for
// bit. Two weight rows: 8 accumulators and the 4 converted activation registers of a step.
constexpr int64_t kF64Span = 256;  // a multiple of the 16-value step
constexpr int64_t kF64MultiRows = 32;

template <int kW, class Weights>
void dot_f32_in_f64_multi(int64_t n, const Weights (&w)[kW], const void *x, size_t x_stride,
                          int64_t m, float *out, int64_t out_stride) {
    alignas(32) double wd[kW][kF64Span];
    const int64_t n16 = n / 16 * 16;
    auto row = [&](int64_t j) {
        return reinterpret_cast<const float *>(static_cast<const uint8_t *>(x) + j * x_stride);
    };
    for (int64_t j0 = 0; j0 < m; j0 += kF64MultiRows) {
        const int64_t rows = m - j0 < kF64MultiRows ? m - j0 : kF64MultiRows;
        __m256d acc[kF64MultiRows][kW][4];
        for (int64_t j = 0; j < rows; ++j)
            for (auto &per_row : acc[j])
                for (auto &a : per_row) a = _mm256_setzero_pd();
        for (int64_t s = 0; s < n16; s += kF64Span) {
            const int64_t len = n16 - s < kF64Span ? n16 - s : kF64Span;
            for (int r = 0; r < kW; ++r)
                for (int64_t i = 0; i < len; i += 4)
                    _mm256_store_pd(wd[r] + i, _mm256_cvtps_pd(w[r].load4(s + i)));
            for (int64_t j = 0; j < rows; ++j) {
                const float *xj = row(j0 + j) + s;
                __m256d a[kW][4];
                for (int r = 0; r < kW; ++r)
                    for (int q = 0; q < 4; ++q) a[r][q] = acc[j][r][q];
                for (int64_t i = 0; i < len; i += 16) {
                    for (int q = 0; q < 4; ++q) {
                        const __m256d xv = _mm256_cvtps_pd(_mm_loadu_ps(xj + i + 4 * q));
                        for (int r = 0; r < kW; ++r)
                            a[r][q] =
                                _mm256_fmadd_pd(_mm256_load_pd(wd[r] + i + 4 * q), xv, a[r][q]);
                    }
                }
                for (int r = 0; r < kW; ++r)
                    for (int q = 0; q < 4; ++q) acc[j][r][q] = a[r][q];
            }
        }
        for (int64_t j = 0; j < rows; ++j) {
            const float *xj = row(j0 + j);
            for (int r = 0; r < kW; ++r) {
                __m256d a0 = acc[j][r][0];
                int64_t i = n16;
                for (; i + 4 <= n; i += 4)
                    a0 = _mm256_fmadd_pd(_mm256_cvtps_pd(w[r].load4(i)),
                                         _mm256_cvtps_pd(_mm_loadu_ps(xj + i)), a0);
                double tail = 0.0;
                for (; i < n; ++i)
                    tail += static_cast<double>(w[r].one(i)) * static_cast<double>(xj[i]);
                const __m256d sum = _mm256_add_pd(_mm256_add_pd(a0, acc[j][r][1]),
                                                  _mm256_add_pd(acc[j][r][2], acc[j][r][3]));
                __m128d h = _mm_add_pd(_mm256_castpd256_pd128(sum), _mm256_extractf128_pd(sum, 1));
                h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
                out[(j0 + j) * out_stride + r] = static_cast<float>(_mm_cvtsd_f64(h) + tail);
            }
        }
    }
}

// The multi-row dot of a float format over n_w weight rows, two at a time, then one; make(row
// bytes) gives a row's Weights.
template <class Make>
void f64_multi_over_rows(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                         size_t x_stride, int64_t m, float *out, int64_t out_stride, Make &&make) {
    const auto *rows = static_cast<const uint8_t *>(w);
    int64_t i = 0;
    for (; i + 2 <= n_w; i += 2) {
        const decltype(make(rows)) two[2] = {make(rows + i * w_stride),
                                             make(rows + (i + 1) * w_stride)};
        dot_f32_in_f64_multi<2>(n, two, x, x_stride, m, out + i, out_stride);
    }
    if (i < n_w) {
        const decltype(make(rows)) one[1] = {make(rows + i * w_stride)};
        dot_f32_in_f64_multi<1>(n, one, x, x_stride, m, out + i, out_stride);
    }
}

}  // namespace

void vec_dot_multi_f32_f32(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                           size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    f64_multi_over_rows(
        n, w, w_stride, n_w, x, x_stride, m, out, out_stride,
        [](const uint8_t *row) { return F32Weights{reinterpret_cast<const float *>(row)}; });
}

void vec_dot_multi_f16_f32(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                           size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    f64_multi_over_rows(
        n, w, w_stride, n_w, x, x_stride, m, out, out_stride,
        [](const uint8_t *row) { return F16Weights{reinterpret_cast<const uint16_t *>(row)}; });
}

void vec_dot_multi_bf16_f32(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                            size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    f64_multi_over_rows(
        n, w, w_stride, n_w, x, x_stride, m, out, out_stride,
        [](const uint8_t *row) { return BF16Weights{reinterpret_cast<const uint16_t *>(row)}; });
}

// F16C's conversion is exact, as the reference's: the same floats (a signaling NaN comes back
// quiet, the reference keeps its payload as is; no computed value is one).
void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(load128(h + i)));
    for (; i < n; ++i) dst[i] = simd::f16_to_f32(h[i]);
}

float vec_dot_f32_f32(int64_t n, const void *w, const void *x) {
    return dot_f32_in_f64(n, F32Weights{static_cast<const float *>(w)},
                          static_cast<const float *>(x));
}

float vec_dot_f16_f32(int64_t n, const void *w, const void *x) {
    return dot_f32_in_f64(n, F16Weights{static_cast<const uint16_t *>(w)},
                          static_cast<const float *>(x));
}

float vec_dot_bf16_f32(int64_t n, const void *w, const void *x) {
    return dot_f32_in_f64(n, BF16Weights{static_cast<const uint16_t *>(w)},
                          static_cast<const float *>(x));
}

// y = sum_b f16(d_w) * f16(d_x) * sum_i w_i x_i in the reference's order (q8_0.cpp): block b's
// exact sum (dot_i8x32_exact's 8 lanes, added up), its term float(s_b) * (d_w * d_x) on chain
// b mod 16, the chains in two registers of 8, then the reference's tree; its float bit for bit.
float vec_dot_q8_0_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ8_0 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    const int64_t nb = n / kQK8_0;
    __m256 chains[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i p[8];
        for (int k = 0; k < 8; ++k) p[k] = dot_i8x32_exact(wb[b + k].qs, xb[b + k].qs);
        const __m256 terms = simd::q8_unfused(_mm256_mul_ps(
            _mm256_cvtepi32_ps(simd::q8_block_sums8(p)),
            _mm256_mul_ps(simd::q8_block_scales8(wb + b), simd::q8_block_scales8(xb + b))));
        __m256 &chain = chains[(b / 8) % 2];
        chain = _mm256_add_ps(chain, terms);
    }
    return simd::q8_finish_chains(chains, wb, xb, b, nb);
}

namespace {

// The multi-row product over panels of 8 weight rows, one row a lane (the AVX-512 kernel's
// layout at half the width, without VNNI): a panel block is 16 registers whose lane r holds the
// int16 pair (w[r][2g], w[r][2g + 1]), then the 8 rows' d_w as f32, and the activations are
// widened to int16 once per call; a block's 8 sums are then 16 vpmaddwd with the activation's
// pair broadcast (exact, -128 x -128 included) and 15 additions, and its terms and chains one
// product and one addition per lane, as the reference. Two activation rows share each weight
// register. 544 bytes a block: a 4096-wide panel is 68 KiB.
constexpr int kPanelRows = 8;
constexpr int64_t kPanelPairs = kQK8_0 / 2;
constexpr int64_t kPanelBlockBytes = kPanelPairs * 32 + 32;

// Rows [0, rows) of panel block b from 8 weight rows (w_stride bytes apart); the rows from `rows`
// on are zero weights with scale 0 (their lanes are never stored).
void q8_pack_panel_block(const uint8_t *w, size_t w_stride, int rows, int64_t b, uint8_t *dst) {
    __m256i lo[kPanelRows], hi[kPanelRows];  // each row's pairs 0-7 and 8-15 as int32 words
    alignas(16) uint16_t d[kPanelRows] = {};
    for (int i = 0; i < kPanelRows; ++i) {
        if (i < rows) {
            const BlockQ8_0 &blk = reinterpret_cast<const BlockQ8_0 *>(w + i * w_stride)[b];
            lo[i] = _mm256_cvtepi8_epi16(load128(blk.qs));
            hi[i] = _mm256_cvtepi8_epi16(load128(blk.qs + 16));
            d[i] = blk.d;
        } else {
            lo[i] = hi[i] = _mm256_setzero_si256();
        }
    }
    simd::transpose8x8_epi32(lo);
    simd::transpose8x8_epi32(hi);
    for (int g = 0; g < 8; ++g) {
        _mm256_store_si256(reinterpret_cast<__m256i *>(dst + 32 * g), lo[g]);
        _mm256_store_si256(reinterpret_cast<__m256i *>(dst + 32 * (8 + g)), hi[g]);
    }
    _mm256_store_ps(reinterpret_cast<float *>(dst + kPanelPairs * 32),
                    _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(d))));
}

// Per activation row j and block b: the 32 values as int16 (x16, 64 bytes) and d_x as f32.
void q8_activation_tables(const void *x, size_t x_stride, int64_t m, int64_t nb, int16_t *x16,
                          float *dx) {
    for (int64_t j = 0; j < m; ++j) {
        const auto *xb =
            reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
        for (int64_t b = 0; b < nb; ++b) {
            int16_t *dst = x16 + (j * nb + b) * kQK8_0;
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst),
                                _mm256_cvtepi8_epi16(load128(xb[b].qs)));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + 16),
                                _mm256_cvtepi8_epi16(load128(xb[b].qs + 16)));
            dx[j * nb + b] = simd::f16_to_f32(xb[b].d);
        }
    }
}

// The panel's outputs for kCols activation rows from j (tables at x16, dx, row stride nb blocks).
template <int kCols>
void q8_panel_columns(const uint8_t *panel, int64_t nb, const int16_t *x16, const float *dx,
                      int rows_here, float *out, int64_t out_stride) {
    alignas(32) float chains[kCols][kQ8_0Chains][kPanelRows] = {};
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *block = panel + b * kPanelBlockBytes;
        __m256i sums[kCols][2];
        for (int c = 0; c < kCols; ++c) sums[c][0] = sums[c][1] = _mm256_setzero_si256();
        for (int g = 0; g < kPanelPairs; ++g) {
            const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i *>(block + 32 * g));
            for (int c = 0; c < kCols; ++c) {
                int32_t pair;
                std::memcpy(&pair, x16 + (c * nb + b) * kQK8_0 + 2 * g, sizeof(pair));
                __m256i &s = sums[c][g % 2];
                s = _mm256_add_epi32(s, _mm256_madd_epi16(wv, _mm256_set1_epi32(pair)));
            }
        }
        const __m256 dw = _mm256_load_ps(reinterpret_cast<const float *>(block + kPanelPairs * 32));
        for (int c = 0; c < kCols; ++c) {
            const __m256i sum = _mm256_add_epi32(sums[c][0], sums[c][1]);
            const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(dx[c * nb + b]));
            const __m256 terms = simd::q8_unfused(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), d));
            float *chain = chains[c][b % kQ8_0Chains];
            _mm256_store_ps(chain, _mm256_add_ps(_mm256_load_ps(chain), terms));
        }
    }
    for (int c = 0; c < kCols; ++c) {
        for (int half = kQ8_0Chains / 2; half >= 1; half /= 2)
            for (int l = 0; l < half; ++l)
                _mm256_store_ps(chains[c][l], _mm256_add_ps(_mm256_load_ps(chains[c][l]),
                                                            _mm256_load_ps(chains[c][l + half])));
        for (int r = 0; r < rows_here; ++r) out[c * out_stride + r] = chains[c][0][r];
    }
}

// Weight rows one at a time against few activation rows (a decode matvec is m = 1), in the
// one-row kernel's layout (vec_dot_q8_0_q8_0) with the activations already widened to int16 in
// the tables, so a block's 8 lanes take two widenings and two vpmaddwd instead of four and two;
// d_x from the tables. The same sums and terms, so the same bits.
void q8_rows_by_tables(int64_t n, const uint8_t *w, size_t w_stride, int64_t n_w, const void *x,
                       size_t x_stride, int64_t m, const int16_t *x16, const float *dx, float *out,
                       int64_t out_stride) {
    const int64_t nb = n / kQK8_0;
    for (int64_t i = 0; i < n_w; ++i) {
        const auto *wb = reinterpret_cast<const BlockQ8_0 *>(w + i * w_stride);
        for (int64_t j = 0; j < m; ++j) {
            const auto *xb =
                reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
            const int16_t *x16_j = x16 + j * nb * kQK8_0;
            const float *dx_j = dx + j * nb;
            __m256 chains[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            int64_t b = 0;
            for (; b + 8 <= nb; b += 8) {
                __m256i p[8];
                for (int k = 0; k < 8; ++k) {
                    const int16_t *xv = x16_j + (b + k) * kQK8_0;
                    const __m256i lo = _mm256_madd_epi16(
                        _mm256_cvtepi8_epi16(load128(wb[b + k].qs)),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xv)));
                    const __m256i hi = _mm256_madd_epi16(
                        _mm256_cvtepi8_epi16(load128(wb[b + k].qs + 16)),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xv + 16)));
                    p[k] = _mm256_add_epi32(lo, hi);
                }
                const __m256 d =
                    _mm256_mul_ps(simd::q8_block_scales8(wb + b), _mm256_loadu_ps(dx_j + b));
                const __m256 terms =
                    simd::q8_unfused(_mm256_mul_ps(_mm256_cvtepi32_ps(simd::q8_block_sums8(p)), d));
                __m256 &chain = chains[(b / 8) % 2];
                chain = _mm256_add_ps(chain, terms);
            }
            out[j * out_stride + i] = simd::q8_finish_chains(chains, wb, xb, b, nb);
        }
    }
}

// Activation rows below this many take the one-row kernel: the panel's repacking and the
// activations' widening cost about as much as a few rows' products (at m = 4 the panel was 0.9x
// the one-row kernel on a Zen 4 limited to AVX2, at m = 16 1.28x).
constexpr int64_t kPanelMinRows = 8;

}  // namespace

// The tables: every activation value as int16, then d_x of every block (f32).
size_t q8_0_multi_tables_bytes(int64_t n, int64_t m) {
    return static_cast<size_t>(m * (n / kQK8_0)) * (kQK8_0 * sizeof(int16_t) + sizeof(float));
}

void make_q8_0_multi_tables(int64_t n, const void *x, size_t x_stride, int64_t m, void *tables) {
    const int64_t nb = n / kQK8_0;
    auto *bytes = static_cast<uint8_t *>(tables);
    q8_activation_tables(
        x, x_stride, m, nb, reinterpret_cast<int16_t *>(bytes),
        reinterpret_cast<float *>(bytes + static_cast<size_t>(m * nb) * kQK8_0 * sizeof(int16_t)));
}

void vec_dot_multi_q8_0_q8_0_tables(int64_t n, const void *w, size_t w_stride, int64_t n_w,
                                    const void *x, size_t x_stride, int64_t m, const void *tables,
                                    float *out, int64_t out_stride) {
    const auto *rows = static_cast<const uint8_t *>(w);
    const int64_t nb = n / kQK8_0;
    const auto *x16 = static_cast<const int16_t *>(tables);
    const auto *dx =
        reinterpret_cast<const float *>(static_cast<const uint8_t *>(tables) +
                                        static_cast<size_t>(m * nb) * kQK8_0 * sizeof(int16_t));
    if (m < kPanelMinRows) {
        q8_rows_by_tables(n, rows, w_stride, n_w, x, x_stride, m, x16, dx, out, out_stride);
        return;
    }
    auto *panel =
        static_cast<uint8_t *>(kernel_scratch(0, static_cast<size_t>(nb * kPanelBlockBytes)));
    for (int64_t r0 = 0; r0 < n_w; r0 += kPanelRows) {
        const int rows_here = static_cast<int>(n_w - r0 < kPanelRows ? n_w - r0 : kPanelRows);
        for (int64_t b = 0; b < nb; ++b)
            q8_pack_panel_block(rows + r0 * w_stride, w_stride, rows_here, b,
                                panel + b * kPanelBlockBytes);
        int64_t j = 0;
        for (; j + 2 <= m; j += 2)
            q8_panel_columns<2>(panel, nb, x16 + j * nb * kQK8_0, dx + j * nb, rows_here,
                                out + j * out_stride + r0, out_stride);
        if (j < m)
            q8_panel_columns<1>(panel, nb, x16 + j * nb * kQK8_0, dx + j * nb, rows_here,
                                out + j * out_stride + r0, out_stride);
    }
}

// E2M1 codes as int8 at twice their value (so the scale is 2^(e-128)); the activation carries
// the sign, |x| <= 128 is the unsigned operand, so maddubs never wraps or saturates.
float vec_dot_mxfp4_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockMXFP4 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    const int64_t nb = n / kQK_MXFP4;
    const __m256i table = _mm256_broadcastsi128_si256(simd::mxfp4_doubled_values_128());
    const __m128i low4 = _mm_set1_epi8(0x0F);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    auto block_dot = [&](int64_t k) {
        const __m128i q = load128(wb[k].qs);
        const __m256i codes =
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
        const __m256i wv = _mm256_shuffle_epi8(table, codes);
        const __m256i xv = load256(xb[k].qs);
        return dot_u8_s8_to_i32(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
    };
    for (; b + 2 <= nb; b += 2) {
        const __m256 d0 =
            _mm256_set1_ps(simd::e8m0_to_f32_half(wb[b].e) * simd::f16_to_f32(xb[b].d));
        const __m256 d1 =
            _mm256_set1_ps(simd::e8m0_to_f32_half(wb[b + 1].e) * simd::f16_to_f32(xb[b + 1].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(block_dot(b)), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(block_dot(b + 1)), acc1);
    }
    if (b < nb) {
        const __m256 d0 =
            _mm256_set1_ps(simd::e8m0_to_f32_half(wb[b].e) * simd::f16_to_f32(xb[b].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(block_dot(b)), acc0);
    }
    return hsum_f32x8(_mm256_add_ps(acc0, acc1));
}

// y = dy*d * sum_k sc_k * sum(v*qy) - dy*dmin * sum_k m_k * bsums[k], 16 sub-blocks of 16.
// The quants are 0..3 (unsigned), so maddubs(v, qy) is exact.
float vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ2_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    const int64_t nb = n / kQK_K;
    const __m256i mask2 = _mm256_set1_epi8(3);
    const __m128i mask4 = _mm_set1_epi8(0x0F);
    // For shift step k, the int16 scale of sub-block 2k in the low 128-bit lane and of 2k+1 in
    // the high lane (the eight int16 scales of a half are repeated in both lanes).
    __m256i scale_pick[4];
    for (int k = 0; k < 4; ++k) {
        scale_pick[k] = _mm256_setr_m128i(
            _mm_set1_epi16(static_cast<int16_t>(0x0100 * (4 * k + 1) + 4 * k)),
            _mm_set1_epi16(static_cast<int16_t>(0x0100 * (4 * k + 3) + 4 * k + 2)));
    }
    __m256 acc = _mm256_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const BlockQ2_K &wq = wb[b];
        const BlockQ8_K &xq = xb[b];
        const float dall = xq.d * simd::f16_to_f32(wq.d);
        const float dmin = -xq.d * simd::f16_to_f32(wq.dmin);

        const __m128i packed = load128(wq.scales);
        const __m128i scales8 = _mm_and_si128(packed, mask4);
        const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(packed, 4), mask4);
        const __m256i mins = _mm256_cvtepu8_epi16(mins8);
        const __m256i min_prod = _mm256_madd_epi16(mins, load256(xq.bsums));
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_prod), acc_min);

        const __m256i scales16 = _mm256_cvtepu8_epi16(scales8);
        const __m256i half_scales[2] = {_mm256_permute2x128_si256(scales16, scales16, 0x00),
                                        _mm256_permute2x128_si256(scales16, scales16, 0x11)};

        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i bits = load256(wq.qs + 32 * h);
            const int8_t *q8 = xq.qs + 128 * h;
            for (int k = 0; k < 4; ++k) {
                const __m256i v = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), mask2);
                const __m256i p = _mm256_maddubs_epi16(v, load256(q8 + 32 * k));
                const __m256i sc = _mm256_shuffle_epi8(half_scales[h], scale_pick[k]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(_mm256_add_ps(acc, acc_min));
}

// y = dy*d * sum_j sc_j * sum(nibble*qy) - dy*dmin * sum_j m_j * (bsums[2j] + bsums[2j+1]).
float vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ4_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    const int64_t nb = n / kQK_K;
    const __m256i mask4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_min = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const BlockQ4_K &wq = wb[b];
        const BlockQ8_K &xq = xb[b];
        const float dall = xq.d * simd::f16_to_f32(wq.d);
        const float dmin = -xq.d * simd::f16_to_f32(wq.dmin);

        const __m128i sc_min8 = simd::q4_K_scales_mins(wq.scales);  // 8 scales, then 8 mins
        const __m256i sc_min16 = _mm256_cvtepu8_epi16(sc_min8);
        const __m128i bsums = _mm_hadd_epi16(load128(xq.bsums), load128(xq.bsums + 8));
        const __m128i min_prod = _mm_madd_epi16(_mm256_extracti128_si256(sc_min16, 1), bsums);
        acc_min = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(min_prod), acc_min);

        const __m128i sc128 = _mm256_castsi256_si128(sc_min16);
        const __m256i scales = _mm256_setr_m128i(sc128, sc128);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            // int16 scale of sub-block 2j (bytes 4j, 4j+1) and 2j+1 (bytes 4j+2, 4j+3)
            const __m256i sc_lo = _mm256_shuffle_epi8(
                scales, _mm256_set1_epi16(static_cast<int16_t>(0x0202 * 2 * j + 0x0100)));
            const __m256i sc_hi = _mm256_shuffle_epi8(
                scales, _mm256_set1_epi16(static_cast<int16_t>(0x0202 * (2 * j + 1) + 0x0100)));
            const __m256i bits = load256(wq.qs + 32 * j);
            const __m256i lo = _mm256_and_si256(bits, mask4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), mask4);
            const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(xq.qs + 64 * j));
            const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(xq.qs + 64 * j + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc_lo, p_lo));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc_hi, p_hi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc) + hsum_f32x4(acc_min);
}

// y = d * dy / 8 * sum_g (2*ls_g + 1) * sum_{32 values} (+-grid) * qy, one group per register.
// |qy| is the unsigned maddubs operand; the grid value (<= 43) carries the product of the
// weight sign and the sign of qy.
float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    const int64_t nb = n / kQK_K;
    const auto *grid = reinterpret_cast<const long long *>(kIq2xxsGrid);
    // value i of a group takes byte i/8 of the sign word and tests bit i%8
    const __m256i byte_of_value = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit_of_value = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i ones = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    Iq2Unpacked unpacked;
    for (int64_t first = 0; first < nb; first += kIq2Chunk) {
        const int count = static_cast<int>(nb - first < kIq2Chunk ? nb - first : kIq2Chunk);
        iq2_xxs_unpack(wb + first, count, unpacked);
        for (int i = 0; i < count; ++i) {
            const BlockIQ2_XXS &wq = wb[first + i];
            const BlockQ8_K &xq = xb[first + i];
            uint32_t a[16];  // a0, a1 of each group
            std::memcpy(a, wq.qs, sizeof(a));
            __m256i sum_even = _mm256_setzero_si256(), sum_odd = _mm256_setzero_si256();
            for (int g = 0; g < 8; ++g) {
                const uint32_t a0 = a[2 * g];
                const __m256i gv = _mm256_setr_epi64x(grid[a0 & 0xFF], grid[(a0 >> 8) & 0xFF],
                                                      grid[(a0 >> 16) & 0xFF], grid[a0 >> 24]);
                const __m256i sw = _mm256_set1_epi32(static_cast<int>(unpacked.sign_words[i][g]));
                const __m256i negative = _mm256_cmpeq_epi8(
                    _mm256_and_si256(_mm256_shuffle_epi8(sw, byte_of_value), bit_of_value),
                    bit_of_value);
                const __m256i y = load256(xq.qs + 32 * g);
                // +-1 per weight sign on the grid, then the sign of y
                const __m256i signed_grid =
                    _mm256_sign_epi8(_mm256_sign_epi8(gv, _mm256_or_si256(negative, ones)), y);
                const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(y), signed_grid);
                const __m256i scale = _mm256_set1_epi32(static_cast<int>(unpacked.scales[i][g]));
                if (g % 2 == 0)
                    sum_even = _mm256_add_epi32(sum_even, _mm256_madd_epi16(p, scale));
                else
                    sum_odd = _mm256_add_epi32(sum_odd, _mm256_madd_epi16(p, scale));
            }
            const float d = 0.125f * simd::f16_to_f32(wq.d) * xq.d;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d),
                                  _mm256_cvtepi32_ps(_mm256_add_epi32(sum_even, sum_odd)), acc);
        }
    }
    return hsum_f32x8(acc);
}

}  // namespace ds4::quant::avx2
