// AVX-512 (F, BW, VL, DQ, VNNI) twins of the scalar reference kernels (kernels_ref.h): the two
// activation quantizers (bit-identical to the reference) and the weight-row . activation-row
// dot products (equal up to float reassociation). Layouts and formulas: docs/MODEL.md section 5.
//
// Every integer product is exact for every valid block, -128 activations and weights included:
//   Q8_0       one operand biased to unsigned (+128, an xor of the sign bit), the bias taken back
//              out through the accumulator's start value;
//   MXFP4      |x| (<= 128) as the unsigned VNNI operand, the sign of x moved onto w (<= 12);
//   Q2_K       the 2-bit quant times its 4-bit sub-block scale (<= 45) as the unsigned VNNI
//              operand;
//   Q4_K       unsigned quants times signed activations with maddubs (pairs never saturate for
//              quants <= 15), then vpdpwssd multiplies the int16 pairs by the sub-block scales;
//   IQ2_XXS    |qy| times the grid value carrying both signs, then vpdpwssd by the group scale.
// The K-quant and IQ2 kernels hold 64 values per zmm register.
//
// Compiled with AVX-512 flags while other files are not: no inline function with external
// linkage and no std:: template here (see simd_x86_common.h).
//
// GCC 12 warns inside the AVX-512 intrinsic headers themselves (their _mm512_undefined_*
// placeholders initialize a variable from itself); the warnings are silenced for those
// headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/kernel_scratch.h"
#include "quant/kernels_simd.h"
#include "quant/simd_x86_common.h"
#include "quant/simd_x86_q8_0.h"

namespace ds4::quant::avx512 {
namespace {

// Activation rows per pass of a multi-row dot: their accumulators live on the stack.
constexpr int64_t kMultiRows = 32;

__m512i load512(const void *p) {
    return _mm512_loadu_si512(p);
}
__m256i load256(const void *p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
}
__m128i load128(const void *p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
}

// The 32 bytes at p in both 256-bit halves.
__m512i broadcast256(const void *p) {
    return _mm512_broadcast_i64x4(load256(p));
}

float hsum_f32x4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float hsum_f32x8(__m256 v) {
    return hsum_f32x4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

float hsum_f32x16(__m512 v) {
    return hsum_f32x8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

float hmax_f32x16(__m512 v) {
    __m256 m = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

int32_t hsum_i32x16(__m512i v) {
    __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 1, 1, 1)));
    return _mm_cvtsi128_si32(s);
}

// An int32 vector whose lanes hold v in both int16 halves, so that vpdpwssd multiplies each
// int16 of the other operand by v.
__m512i repeat_in_both_i16_halves(__m512i v) {
    return _mm512_or_si512(v, _mm512_slli_epi32(v, 16));
}

// roundf(v) clamped to [-128, 127] as the reference does: ties away from zero, NaN -> 0,
// +-inf -> the bound (1/d overflows when amax is tiny).
__m512i round_half_away_clamped_epi32(__m512 v) {
    const __m512 truncated = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_sub_ps(v, truncated);  // exact (NaN for inf)
    const __mmask16 away =
        _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 unit = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    __m512 r = _mm512_mask_add_ps(truncated, away, truncated, unit);
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);  // NaN -> 0
    r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvttps_epi32(r);
}

// The 32 values of a Q8_0 block in v0, v1, and their largest magnitude (max(|x|, m) keeps m
// when x is NaN, like the reference's fmax).
float q8_0_block_load(const float *x, __m512 &v0, __m512 &v1) {
    v0 = _mm512_loadu_ps(x);
    v1 = _mm512_loadu_ps(x + 16);
    return hmax_f32x16(
        _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps())));
}

}  // namespace

// Q8_0 weight row, as gguf-py / ggml quantize_row_q8_0_ref: d = amax/127, id = 1/d (0 when
// d = 0), q = roundf(x * id), d stored as f16 (round to nearest even).
void quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        __m512 v0, v1;
        const float d = q8_0_block_load(src + b * kQK8_0, v0, v1) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = simd::f32_to_f16_rne(d);
        const __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128(
            reinterpret_cast<__m128i *>(out[b].qs),
            _mm512_cvtepi32_epi8(round_half_away_clamped_epi32(_mm512_mul_ps(v0, vid))));
        _mm_storeu_si128(
            reinterpret_cast<__m128i *>(out[b].qs + 16),
            _mm512_cvtepi32_epi8(round_half_away_clamped_epi32(_mm512_mul_ps(v1, vid))));
    }
}

// Q8_0 activation row, ds4's rule (kernels_ref.h): d = amax/127, q = cvtps2dq(x / d) (nearest,
// ties to even; NaN and overflow give INT_MIN), saturated to int8; d = 0 -> q = 0.
void quantize_row_q8_0_activation(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        __m512 v0, v1;
        const float d = q8_0_block_load(src + b * kQK8_0, v0, v1) / 127.0f;
        out[b].d = simd::f32_to_f16_rne(d);
        if (d == 0.0f) {
            std::memset(out[b].qs, 0, sizeof(out[b].qs));
            continue;
        }
        const __m512 vd = _mm512_set1_ps(d);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out[b].qs),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_div_ps(v0, vd))));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out[b].qs + 16),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_div_ps(v1, vd))));
    }
}

// Q8_K activation row (docs/MODEL.md 5.5): vmax = first element of largest |x|, iscale = -127/vmax,
// q = clamp(lrint(iscale * x), -128, 127), d = 1/iscale, bsums = sums of 16 quants.
void quantize_row_q8_K(const float *src, void *dst, int64_t n) {
    auto *out = static_cast<BlockQ8_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        BlockQ8_K &y = out[b];
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < kQK_K; k += 16)
            m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
        const float amax = hmax_f32x16(m);
        if (amax == 0.0f) {
            std::memset(&y, 0, sizeof(y));
            continue;
        }
        // The first element whose magnitude is amax (the reference keeps the first maximum).
        float vmax = 0.0f;
        const __m512 vamax = _mm512_set1_ps(amax);
        for (int k = 0; k < kQK_K; k += 16) {
            const __mmask16 hit =
                _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + k)), vamax, _CMP_EQ_OQ);
            if (hit != 0) {
                vmax = x[k + __builtin_ctz(static_cast<unsigned>(hit))];
                break;
            }
        }
        const float iscale = -127.0f / vmax;
        const __m512 vscale = _mm512_set1_ps(iscale);
        for (int k = 0; k < kQK_K; k += 16) {
            // cvtps rounds to nearest even like lrint; out-of-range and NaN give INT_MIN.
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(vscale, _mm512_loadu_ps(x + k)));
            q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-128)),
                                 _mm512_set1_epi32(127));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(y.qs + k), _mm512_cvtepi32_epi8(q));
            y.bsums[k / 16] = static_cast<int16_t>(hsum_i32x16(q));
        }
        y.d = 1.0f / iscale;
    }
}

namespace {

// (acc0 + acc1) + (acc2 + acc3), then its 8 lanes, as a float.
float hsum_f64_acc4(__m512d acc0, __m512d acc1, __m512d acc2, __m512d acc3) {
    const __m512d acc = _mm512_add_pd(_mm512_add_pd(acc0, acc1), _mm512_add_pd(acc2, acc3));
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd(acc, 1));
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return static_cast<float>(_mm_cvtsd_f64(s));
}

// The end of dot_f32_in_f64 from value i (past its 32-value steps): the 8-value steps into acc0,
// the masked tail into acc1, then the sum.
template <class Weights>
float f64_dot_finish(int64_t n, int64_t i, const Weights &w, const float *x, __m512d acc0,
                     __m512d acc1, __m512d acc2, __m512d acc3) {
    for (; i + 8 <= n; i += 8)
        acc0 = _mm512_fmadd_pd(_mm512_cvtps_pd(w.load8(i)), _mm512_cvtps_pd(_mm256_loadu_ps(x + i)),
                               acc0);
    if (i < n) {
        const auto mask = static_cast<__mmask8>((1u << (n - i)) - 1);
        acc1 = _mm512_fmadd_pd(_mm512_cvtps_pd(w.load8_partial(i, mask)),
                               _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, x + i)), acc1);
    }
    return hsum_f64_acc4(acc0, acc1, acc2, acc3);
}

// sum_i double(w_i) * double(x_i) with double accumulators, like the reference (docs/MODEL.md 5.6:
// the F32 matvec accumulates in double). Weights gives load8(i) and load8_partial(i, mask).
template <class Weights>
float dot_f32_in_f64(int64_t n, const Weights &w, const float *x) {
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    __m512d acc2 = _mm512_setzero_pd(), acc3 = _mm512_setzero_pd();
    auto fma8 = [&](int64_t i, __m512d acc) {
        return _mm512_fmadd_pd(_mm512_cvtps_pd(w.load8(i)), _mm512_cvtps_pd(_mm256_loadu_ps(x + i)),
                               acc);
    };
    simd::StreamPrefetch prefetch(w.at(0));
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch.ahead(w.at(i));
        acc0 = fma8(i, acc0);
        acc1 = fma8(i + 8, acc1);
        acc2 = fma8(i + 16, acc2);
        acc3 = fma8(i + 24, acc3);
    }
    return f64_dot_finish(n, i, w, x, acc0, acc1, acc2, acc3);
}

struct F32Weights {
    const float *p;
    const void *at(int64_t i) const { return p + i; }
    __m256 load8(int64_t i) const { return _mm256_loadu_ps(p + i); }
    __m256 load8_partial(int64_t i, __mmask8 m) const { return _mm256_maskz_loadu_ps(m, p + i); }
};

struct F16Weights {
    const uint16_t *p;
    const void *at(int64_t i) const { return p + i; }
    __m256 load8(int64_t i) const { return _mm256_cvtph_ps(load128(p + i)); }
    __m256 load8_partial(int64_t i, __mmask8 m) const {
        return _mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p + i));
    }
};

// bf16 is the top half of an f32: widen to 32 bits and shift into place.
struct BF16Weights {
    const uint16_t *p;
    const void *at(int64_t i) const { return p + i; }
    static __m256 widen(__m128i h) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    __m256 load8(int64_t i) const { return widen(load128(p + i)); }
    __m256 load8_partial(int64_t i, __mmask8 m) const {
        return widen(_mm_maskz_loadu_epi16(m, p + i));
    }
};

// dot_f32_in_f64 for kW weight rows against m activation rows: each span of kF64Span weights of
// each row is converted to double once, into a buffer, and each activation row's 8 values are
// converted once for the kW weight rows; every (weight row, activation row) pair then runs the
// single-row operations in the same order (acc0..acc3 over the 32-value steps, then the 8-value
// steps into acc0, the masked tail into acc1), so each result equals dot_f32_in_f64's bit for
// bit. Four weight rows: 16 accumulators and the 4 converted activation registers of a step.
constexpr int64_t kF64Span = 256;  // a multiple of the 32-value step

template <int kW, class Weights>
void dot_f32_in_f64_multi(int64_t n, const Weights (&w)[kW], const void *x, size_t x_stride,
                          int64_t m, float *out, int64_t out_stride) {
    alignas(64) double wd[kW][kF64Span];
    const int64_t n32 = n / 32 * 32;
    auto row = [&](int64_t j) {
        return reinterpret_cast<const float *>(static_cast<const uint8_t *>(x) + j * x_stride);
    };
    for (int64_t j0 = 0; j0 < m; j0 += kMultiRows) {
        const int64_t rows = std::min(kMultiRows, m - j0);
        __m512d acc[kMultiRows][kW][4];
        for (int64_t j = 0; j < rows; ++j)
            for (auto &per_row : acc[j])
                for (auto &a : per_row) a = _mm512_setzero_pd();
        for (int64_t s = 0; s < n32; s += kF64Span) {
            const int64_t len = std::min(kF64Span, n32 - s);
            for (int r = 0; r < kW; ++r)
                for (int64_t i = 0; i < len; i += 8)
                    _mm512_store_pd(wd[r] + i, _mm512_cvtps_pd(w[r].load8(s + i)));
            for (int64_t j = 0; j < rows; ++j) {
                const float *xj = row(j0 + j) + s;
                __m512d a[kW][4];
                for (int r = 0; r < kW; ++r)
                    for (int q = 0; q < 4; ++q) a[r][q] = acc[j][r][q];
                for (int64_t i = 0; i < len; i += 32) {
                    for (int q = 0; q < 4; ++q) {
                        const __m512d xv = _mm512_cvtps_pd(_mm256_loadu_ps(xj + i + 8 * q));
                        for (int r = 0; r < kW; ++r)
                            a[r][q] =
                                _mm512_fmadd_pd(_mm512_load_pd(wd[r] + i + 8 * q), xv, a[r][q]);
                    }
                }
                for (int r = 0; r < kW; ++r)
                    for (int q = 0; q < 4; ++q) acc[j][r][q] = a[r][q];
            }
        }
        for (int64_t j = 0; j < rows; ++j)
            for (int r = 0; r < kW; ++r)
                out[(j0 + j) * out_stride + r] =
                    f64_dot_finish(n, n32, w[r], row(j0 + j), acc[j][r][0], acc[j][r][1],
                                   acc[j][r][2], acc[j][r][3]);
    }
}

// The multi-row dot of a float format over n_w weight rows, four at a time, then one at a time;
// make(row bytes) gives a row's Weights.
template <class Make>
void f64_multi_over_rows(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                         size_t x_stride, int64_t m, float *out, int64_t out_stride, Make &&make) {
    const auto *rows = static_cast<const uint8_t *>(w);
    int64_t i = 0;
    for (; i + 4 <= n_w; i += 4) {
        const decltype(make(rows)) four[4] = {
            make(rows + i * w_stride), make(rows + (i + 1) * w_stride),
            make(rows + (i + 2) * w_stride), make(rows + (i + 3) * w_stride)};
        dot_f32_in_f64_multi<4>(n, four, x, x_stride, m, out + i, out_stride);
    }
    for (; i < n_w; ++i) {
        const decltype(make(rows)) one[1] = {make(rows + i * w_stride)};
        dot_f32_in_f64_multi<1>(n, one, x, x_stride, m, out + i, out_stride);
    }
}

// A one-weight-row multi dot over n_w weight rows: one_row(row i, out + i).
template <class OneRow>
void over_weight_rows(const void *w, size_t w_stride, int64_t n_w, float *out, OneRow &&one_row) {
    for (int64_t i = 0; i < n_w; ++i)
        one_row(static_cast<const uint8_t *>(w) + static_cast<size_t>(i) * w_stride, out + i);
}

}  // namespace

// F16C's conversion is exact, as the reference's: the same floats (a signaling NaN comes back
// quiet, the reference keeps its payload as is; no computed value is one).
void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(src);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(load256(h + i)));
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

// y = sum_b f16(d_w) * f16(d_x) * sum_i w_i x_i, in the reference's order (kernels_ref.h,
// q8_0.cpp): block b's exact integer sum, its term float(s_b) * (d_w * d_x), chain b mod 16, then
// the chains summed l + 8, l + 4, l + 2, l + 1 (hsum_f32x16's tree). Both kernels below give the
// reference's float bit for bit.
namespace {

// The terms of 8 consecutive blocks, block k in lane k. Each block's products as 8 int32 lanes
// of 4 (vpdpbusd), exact for every int8 pair: the activation is biased to unsigned (x + 128, an
// xor of the sign bit) and the bias comes back out through the accumulator's start value,
// -128 * (sum of the lane's 4 weights): sum_i (x_i + 128) w_i - 128 sum_i w_i = sum_i x_i w_i.
__m256 q8_terms8(const BlockQ8_0 *w, const BlockQ8_0 *x) {
    const __m256i bias = _mm256_set1_epi8(-128);
    __m256i p[8];
    for (int k = 0; k < 8; ++k) {
        const __m256i wv = load256(w[k].qs);
        const __m256i unbias = _mm256_sub_epi32(
            _mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, wv));
        p[k] = _mm256_dpbusd_epi32(unbias, _mm256_xor_si256(load256(x[k].qs), bias), wv);
    }
    return simd::q8_unfused(
        _mm256_mul_ps(_mm256_cvtepi32_ps(simd::q8_block_sums8(p)),
                      _mm256_mul_ps(simd::q8_block_scales8(w), simd::q8_block_scales8(x))));
}

}  // namespace

// The 16 chains in two ymm registers: blocks 16g..16g+7 in the first, 16g+8..16g+15 in the
// second.
float vec_dot_q8_0_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ8_0 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    const int64_t nb = n / kQK8_0;
    __m256 chains[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    simd::StreamPrefetch prefetch(w);
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        prefetch.ahead(wb + b);
        __m256 &chain = chains[(b / 8) % 2];
        chain = _mm256_add_ps(chain, q8_terms8(wb + b, xb + b));
    }
    return simd::q8_finish_chains(chains, wb, xb, b, nb);
}

namespace {

// The multi-row product over panels of 16 weight rows, one row a lane. A panel is repacked once
// per call and serves all m activation rows: for each block, 8 registers whose lane r holds 4
// consecutive weights of row r (biased to unsigned, w + 128), then the 16 rows' d_w as f32. A
// block's 16 sums are then 8 vpdpbusd with the activation's 4 bytes broadcast, started at
// -128 * (the activation block's sum), with no horizontal add; its terms are one product and
// its chains one addition per lane, as the reference: 4x less float work per product than the
// one-row kernel's 8 lanes per block. 576 bytes a block: a 4096-wide panel is 72 KiB, in L2.
constexpr int kPanelRows = 16;
constexpr int64_t kPanelBlockBytes = 8 * 64 + 64;

// Rows [0, rows) of a panel block b from 16 weight rows (w_stride bytes apart); the rows from
// `rows` on are zero weights with scale 0 (their lanes are never stored).
void q8_pack_panel_block(const uint8_t *w, size_t w_stride, int rows, int64_t b, uint8_t *dst) {
    __m256i r[kPanelRows];
    alignas(32) uint16_t d[kPanelRows] = {};
    for (int i = 0; i < kPanelRows; ++i) {
        if (i < rows) {
            const BlockQ8_0 &blk = reinterpret_cast<const BlockQ8_0 *>(w + i * w_stride)[b];
            r[i] = load256(blk.qs);
            d[i] = blk.d;
        } else {
            r[i] = _mm256_setzero_si256();
        }
    }
    simd::transpose8x8_epi32(r);      // rows 0-7
    simd::transpose8x8_epi32(r + 8);  // rows 8-15
    const __m512i bias = _mm512_set1_epi8(-128);
    for (int g = 0; g < 8; ++g)
        _mm512_store_si512(
            dst + 64 * g,
            _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(r[g]), r[8 + g], 1), bias));
    _mm512_store_ps(dst + 8 * 64,
                    _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(d))));
}

// Per activation row j and block b: d_x as f32, and -128 * (sum of the block's 32 values), the
// start of the block's sums (the weights' bias of 128 times the activations).
void q8_activation_tables(const void *x, size_t x_stride, int64_t m, int64_t nb, float *dx,
                          int32_t *unbias) {
    const __m256i bias = _mm256_set1_epi8(-128);
    for (int64_t j = 0; j < m; ++j) {
        const auto *xb =
            reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
        for (int64_t b = 0; b < nb; ++b) {
            dx[j * nb + b] = simd::f16_to_f32(xb[b].d);
            // sum of (x + 128) over the block by vpsadbw, less 32 * 128.
            const __m256i s =
                _mm256_sad_epu8(_mm256_xor_si256(load256(xb[b].qs), bias), _mm256_setzero_si256());
            const __m128i s2 =
                _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const int64_t sum = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 128 * kQK8_0;
            unbias[j * nb + b] = static_cast<int32_t>(-128 * sum);
        }
    }
}

// Block b's terms for the panel's 16 rows against activation block xq.
__m512 q8_panel_terms(const uint8_t *panel_block, const BlockQ8_0 &xq, float dx, int32_t unbias) {
    __m512i sum = _mm512_set1_epi32(unbias);
    for (int g = 0; g < 8; ++g) {
        int32_t x4;
        std::memcpy(&x4, xq.qs + 4 * g, sizeof(x4));
        sum = _mm512_dpbusd_epi32(sum, _mm512_load_si512(panel_block + 64 * g),
                                  _mm512_set1_epi32(x4));
    }
    const __m512 d = _mm512_mul_ps(_mm512_load_ps(panel_block + 8 * 64), _mm512_set1_ps(dx));
    __m512 terms = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), d);
    __asm__("" : "+v"(terms));  // not fused with the chain's addition (simd::q8_unfused)
    return terms;
}

// Activation rows below this many skip the panel, whose repacking costs about as much as a few
// rows' products, and go row by row (q8_rows_by_tables).
constexpr int64_t kPanelMinRows = 3;

// Weight rows one at a time against few activation rows (a decode matvec is m = 1), in the
// one-row kernel's layout (vec_dot_q8_0_q8_0: 8 blocks' terms in a register) but with the
// activation side from the tables: the weights are the biased operand (w + 128, an xor) and the
// activation's 32 bytes the signed one, so a block's 8 lanes need one vpdpbusd from zero, and
// -128 * (the activation block's sum) is added once per block after the lanes are summed; d_x
// comes from the table. Three operations a block fewer than the one-row kernel; the same sums
// and terms, so the same bits.
void q8_rows_by_tables(int64_t n, const uint8_t *w, size_t w_stride, int64_t n_w, const void *x,
                       size_t x_stride, int64_t m, float *out, int64_t out_stride, const float *dx,
                       const int32_t *unbias) {
    const int64_t nb = n / kQK8_0;
    const __m256i bias = _mm256_set1_epi8(-128);
    simd::StreamPrefetch prefetch(w);
    for (int64_t i = 0; i < n_w; ++i) {
        const auto *wb = reinterpret_cast<const BlockQ8_0 *>(w + i * w_stride);
        for (int64_t j = 0; j < m; ++j) {
            const auto *xb =
                reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
            const float *dx_j = dx + j * nb;
            const int32_t *unbias_j = unbias + j * nb;
            __m256 chains[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            int64_t b = 0;
            for (; b + 8 <= nb; b += 8) {
                if (j == 0) prefetch.ahead(wb + b);
                __m256i p[8];
                for (int k = 0; k < 8; ++k)
                    p[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                               _mm256_xor_si256(load256(wb[b + k].qs), bias),
                                               load256(xb[b + k].qs));
                const __m256i sums =
                    _mm256_add_epi32(simd::q8_block_sums8(p), load256(unbias_j + b));
                const __m256 d =
                    _mm256_mul_ps(simd::q8_block_scales8(wb + b), _mm256_loadu_ps(dx_j + b));
                const __m256 terms = simd::q8_unfused(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), d));
                __m256 &chain = chains[(b / 8) % 2];
                chain = _mm256_add_ps(chain, terms);
            }
            out[j * out_stride + i] = simd::q8_finish_chains(chains, wb, xb, b, nb);
        }
    }
}

}  // namespace

// The tables: d_x of every activation block (f32), then -128 * its sum (int32).
size_t q8_0_multi_tables_bytes(int64_t n, int64_t m) {
    return static_cast<size_t>(m * (n / kQK8_0)) * 8;
}

void make_q8_0_multi_tables(int64_t n, const void *x, size_t x_stride, int64_t m, void *tables) {
    const int64_t nb = n / kQK8_0;
    auto *bytes = static_cast<uint8_t *>(tables);
    q8_activation_tables(x, x_stride, m, nb, reinterpret_cast<float *>(bytes),
                         reinterpret_cast<int32_t *>(bytes + static_cast<size_t>(m * nb) * 4));
}

void vec_dot_multi_q8_0_q8_0_tables(int64_t n, const void *w, size_t w_stride, int64_t n_w,
                                    const void *x, size_t x_stride, int64_t m, const void *tables,
                                    float *out, int64_t out_stride) {
    const auto *rows = static_cast<const uint8_t *>(w);
    const int64_t nb = n / kQK8_0;
    const auto *dx = static_cast<const float *>(tables);
    const auto *unbias = reinterpret_cast<const int32_t *>(static_cast<const uint8_t *>(tables) +
                                                           static_cast<size_t>(m * nb) * 4);
    if (m < kPanelMinRows) {
        q8_rows_by_tables(n, rows, w_stride, n_w, x, x_stride, m, out, out_stride, dx, unbias);
        return;
    }
    auto *panel =
        static_cast<uint8_t *>(kernel_scratch(0, static_cast<size_t>(nb * kPanelBlockBytes)));
    for (int64_t r0 = 0; r0 < n_w; r0 += kPanelRows) {
        const int rows_here = static_cast<int>(std::min<int64_t>(kPanelRows, n_w - r0));
        for (int64_t b = 0; b < nb; ++b)
            q8_pack_panel_block(rows + r0 * w_stride, w_stride, rows_here, b,
                                panel + b * kPanelBlockBytes);
        const __mmask16 store_mask = static_cast<__mmask16>((1u << rows_here) - 1);
        for (int64_t j = 0; j < m; ++j) {
            const auto *xb =
                reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
            const float *dx_j = dx + j * nb;
            const int32_t *unbias_j = unbias + j * nb;
            __m512 chains[kQ8_0Chains];
            for (auto &c : chains) c = _mm512_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += kQ8_0Chains) {
#pragma GCC unroll 16
                for (int l = 0; l < kQ8_0Chains; ++l) {
                    const int64_t b = b0 + l;
                    if (b < nb)
                        chains[l] =
                            _mm512_add_ps(chains[l], q8_panel_terms(panel + b * kPanelBlockBytes,
                                                                    xb[b], dx_j[b], unbias_j[b]));
                }
            }
            for (int half = kQ8_0Chains / 2; half >= 1; half /= 2)
                for (int l = 0; l < half; ++l)
                    chains[l] = _mm512_add_ps(chains[l], chains[l + half]);
            _mm512_mask_storeu_ps(out + j * out_stride + r0, store_mask, chains[0]);
        }
    }
}

// Two blocks per register. E2M1 codes are looked up at twice their value (|w| <= 12, scale
// 2^(e-128)); the activation's sign moves onto w, |x| <= 128 is the unsigned VNNI operand.
float vec_dot_mxfp4_q8_0(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockMXFP4 *>(w);
    const auto *xb = static_cast<const BlockQ8_0 *>(x);
    const int64_t nb = n / kQK_MXFP4;
    const __m512i table = _mm512_broadcast_i32x4(simd::mxfp4_doubled_values_128());
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i shift_lo_hi = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    auto scale = [&](int64_t k) {
        return simd::e8m0_to_f32_half(wb[k].e) * simd::f16_to_f32(xb[k].d);
    };
    __m512 acc = _mm512_setzero_ps();
    simd::StreamPrefetch prefetch(w);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        prefetch.ahead(wb + b);
        // 128-bit lanes q_a q_a q_b q_b, shifted by 0 4 0 4: codes of values 0-15 and 16-31 of
        // block a, then of block b
        const __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(load128(wb[b].qs))),
            _mm256_broadcastsi128_si256(load128(wb[b + 1].qs)), 1);
        const __m512i codes = _mm512_and_si512(_mm512_srlv_epi64(q, shift_lo_hi), low4);
        const __m512i wv = _mm512_shuffle_epi8(table, codes);
        const __m512i xv =
            _mm512_inserti64x4(_mm512_castsi256_si512(load256(xb[b].qs)), load256(xb[b + 1].qs), 1);
        const __m512i w_signed =
            _mm512_mask_sub_epi8(wv, _mm512_movepi8_mask(xv), _mm512_setzero_si512(), wv);
        const __m512i sumi =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xv), w_signed);
        const __m512 d =
            _mm512_mask_mov_ps(_mm512_set1_ps(scale(b)), 0xFF00, _mm512_set1_ps(scale(b + 1)));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    float tail = 0.0f;
    if (b < nb) {
        const __m128i q = load128(wb[b].qs);
        const __m128i low4_128 = _mm512_castsi512_si128(low4);
        const __m256i codes = _mm256_setr_m128i(_mm_and_si128(q, low4_128),
                                                _mm_and_si128(_mm_srli_epi16(q, 4), low4_128));
        const __m256i wv = _mm256_shuffle_epi8(_mm512_castsi512_si256(table), codes);
        const __m256i xv = load256(xb[b].qs);
        const __m256i w_signed =
            _mm256_mask_sub_epi8(wv, _mm256_movepi8_mask(xv), _mm256_setzero_si256(), wv);
        const __m256i sumi =
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(xv), w_signed);
        tail = scale(b) * hsum_f32x8(_mm256_cvtepi32_ps(sumi));
    }
    return hsum_f32x16(acc) + tail;
}

namespace {

// Super-block b of activation row j.
inline const BlockQ8_K &q8k_row_block(const void *x, size_t x_stride, int64_t j, int64_t b) {
    return reinterpret_cast<const BlockQ8_K *>(static_cast<const uint8_t *>(x) + j * x_stride)[b];
}

// The multi-row loop of the K-quant dots, over n_w weight rows one at a time: each weight
// super-block is decoded once (`decode` into a Decoded), then added into every activation row's
// two accumulators (`accumulate`: a 16-lane sum and a MinAcc for the sub-mins), and each row ends
// as hsum(acc) + hsum(acc_min), the single-row dot's order.
template <class WBlock, class Decoded, class MinAcc, class Decode, class Accumulate, class MinSum>
void kquant_multi_row(int64_t n, const void *w_rows, size_t w_stride, int64_t n_w, const void *x,
                      size_t x_stride, int64_t m, float *out_rows, int64_t out_stride,
                      Decode decode, Accumulate accumulate, MinSum min_sum) {
    for (int64_t i = 0; i < n_w; ++i) {
        const auto *wb = reinterpret_cast<const WBlock *>(static_cast<const uint8_t *>(w_rows) +
                                                          static_cast<size_t>(i) * w_stride);
        float *out = out_rows + i;
        Decoded bw;
        for (int64_t j0 = 0; j0 < m; j0 += kMultiRows) {
            const int64_t rows = std::min(kMultiRows, m - j0);
            __m512 acc[kMultiRows];
            MinAcc acc_min[kMultiRows];
            for (int64_t j = 0; j < rows; ++j) {
                acc[j] = _mm512_setzero_ps();
                acc_min[j] = MinAcc{};
            }
            for (int64_t b = 0; b < n / kQK_K; ++b) {
                decode(wb[b], bw);
                for (int64_t j = 0; j < rows; ++j)
                    accumulate(bw, q8k_row_block(x, x_stride, j0 + j, b), acc[j], acc_min[j]);
            }
            for (int64_t j = 0; j < rows; ++j)
                out[(j0 + j) * out_stride] = hsum_f32x16(acc[j]) + min_sum(acc_min[j]);
        }
    }
}

}  // namespace

namespace {

// The weight side of one Q2_K super-block, decoded once for any number of activation rows.
// Value 64t + i (t = 0..3) is bits 2*(2*(t%2) + i/32) of byte i%32 of half t/2, so v[t] holds
// sub-blocks 4t..4t+3, one per 128-bit lane. Each byte holds its value times its sub-block's
// scale, sc * q <= 15 * 3 = 45, so that one vpdpbusd (unsigned weight, signed activation) gives
// int32 lane l = sum over its 4 values of sc * q * x: the same integer as sc * (sum q * x).
struct Q2kBlockWeights {
    __m512i v[4];   // sc * q, one byte each
    __m256i mins;   // the 16 sub-mins as int16
    float d, dmin;  // f16(d), f16(dmin)
};

// The products sc * q are looked up by vpshufb: 128-bit lane L of a table holds in dword t the
// bytes sc_k * (0, 1, 2, 3) of sub-block k = 4t + L (the 16 scales transposed as a 4 x 4 byte
// matrix, widened to dwords, one vpmulld by 0x03020100: no byte carries, 3 * 15 < 256), so step
// t indexes it by 4t + q, where q is a value of that lane's sub-block.
struct Q2kScaleControls {
    __m128i transpose = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i multiples = _mm512_set1_epi32(0x03020100);
    __m512i step[4] = {_mm512_set1_epi8(0), _mm512_set1_epi8(4), _mm512_set1_epi8(8),
                       _mm512_set1_epi8(12)};
};

// vpternlogd immediate of (a & b) | c
constexpr int kAndOr = 0xEA;

inline void q2k_block_weights(const BlockQ2_K &wq, const Q2kScaleControls &controls,
                              Q2kBlockWeights &bw) {
    const __m512i mask2 = _mm512_set1_epi8(3);
    const __m128i mask4 = _mm_set1_epi8(0x0F);
    const __m512i shift_01 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m512i shift_23 = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
    const __m128i packed = load128(wq.scales);
    bw.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), mask4));
    const __m128i scales = _mm_shuffle_epi8(_mm_and_si128(packed, mask4), controls.transpose);
    const __m512i table = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(scales), controls.multiples);
    const __m512i bits_h0 = broadcast256(wq.qs);
    const __m512i bits_h1 = broadcast256(wq.qs + 32);
    const __m512i bits[4] = {
        _mm512_srlv_epi64(bits_h0, shift_01), _mm512_srlv_epi64(bits_h0, shift_23),
        _mm512_srlv_epi64(bits_h1, shift_01), _mm512_srlv_epi64(bits_h1, shift_23)};
    for (int t = 0; t < 4; ++t)
        bw.v[t] = _mm512_shuffle_epi8(
            table, _mm512_ternarylogic_epi32(bits[t], mask2, controls.step[t], kAndOr));
    bw.d = simd::f16_to_f32(wq.d);
    bw.dmin = simd::f16_to_f32(wq.dmin);
}

// One activation super-block into the two accumulators of a Q2_K dot.
inline void q2k_block_accumulate(const Q2kBlockWeights &bw, const BlockQ8_K &xq, __m512 &acc,
                                 __m256 &acc_min) {
    const float dall = xq.d * bw.d;
    const float dmin = -xq.d * bw.dmin;
    const __m256i min_prod = _mm256_madd_epi16(bw.mins, load256(xq.bsums));
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_prod), acc_min);
    __m512i sumi = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) sumi = _mm512_dpbusd_epi32(sumi, bw.v[t], load512(xq.qs + 64 * t));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(dall), _mm512_cvtepi32_ps(sumi), acc);
}

}  // namespace

// y = dy*d * sum_k sc_k * sum(v*qy) - dy*dmin * sum_k m_k * bsums[k], 16 sub-blocks of 16.
float vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ2_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    const Q2kScaleControls controls;
    Q2kBlockWeights bw;
    simd::StreamPrefetch prefetch(w);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        prefetch.ahead(wb + b);
        q2k_block_weights(wb[b], controls, bw);
        q2k_block_accumulate(bw, xb[b], acc, acc_min);
    }
    return hsum_f32x16(acc) + hsum_f32x8(acc_min);
}

// The same for n_w weight rows and m activation rows (VecDotMultiFn), each super-block
// decoded once.
void vec_dot_multi_q2_K_q8_K(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                             size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    const Q2kScaleControls controls;
    kquant_multi_row<BlockQ2_K, Q2kBlockWeights, __m256>(
        n, w, w_stride, n_w, x, x_stride, m, out, out_stride,
        [&](const BlockQ2_K &wq, Q2kBlockWeights &bw) { q2k_block_weights(wq, controls, bw); },
        q2k_block_accumulate, hsum_f32x8);
}

namespace {

// The weight side of one Q4_K super-block, decoded once for any number of activation rows. q[j]
// holds the 32 low nibbles (sub-block 2j) then the 32 high nibbles (2j+1) of qs[32j..].
struct Q4kBlockWeights {
    __m512i q[4];
    __m512i scale[4];  // int32 lanes 0-7 <- scale 2j, lanes 8-15 <- scale 2j+1 (both int16 halves)
    __m128i mins;      // the 8 sub-mins as int16
    float d, dmin;     // f16(d), f16(dmin)
};

inline void q4k_block_weights(const BlockQ4_K &wq, Q4kBlockWeights &bw) {
    const __m512i mask4 = _mm512_set1_epi8(0x0F);
    const __m512i shift_lo_hi = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i pick0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i sc_min8 = simd::q4_K_scales_mins(wq.scales);  // 8 scales, then 8 mins
    bw.mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sc_min8, sc_min8));
    const __m512i scales = repeat_in_both_i16_halves(_mm512_cvtepu8_epi32(sc_min8));
    for (int j = 0; j < 4; ++j) {
        bw.q[j] =
            _mm512_and_si512(_mm512_srlv_epi64(broadcast256(wq.qs + 32 * j), shift_lo_hi), mask4);
        bw.scale[j] =
            _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(2 * j), pick0), scales);
    }
    bw.d = simd::f16_to_f32(wq.d);
    bw.dmin = simd::f16_to_f32(wq.dmin);
}

// One activation super-block into the two accumulators of a Q4_K dot.
inline void q4k_block_accumulate(const Q4kBlockWeights &bw, const BlockQ8_K &xq, __m512 &acc,
                                 __m128 &acc_min) {
    const float dall = xq.d * bw.d;
    const float dmin = -xq.d * bw.dmin;
    const __m128i bsum_pairs = _mm_hadd_epi16(load128(xq.bsums), load128(xq.bsums + 8));
    acc_min = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(bw.mins, bsum_pairs)),
                           acc_min);
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j)
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(bw.q[j], load512(xq.qs + 64 * j)),
                                   bw.scale[j]);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(dall), _mm512_cvtepi32_ps(sumi), acc);
}

}  // namespace

// y = dy*d * sum_j sc_j * sum(nibble*qy) - dy*dmin * sum_j m_j * (bsums[2j] + bsums[2j+1]).
float vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockQ4_K *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    __m512 acc = _mm512_setzero_ps();
    __m128 acc_min = _mm_setzero_ps();
    Q4kBlockWeights bw;
    simd::StreamPrefetch prefetch(w);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        prefetch.ahead(wb + b);
        q4k_block_weights(wb[b], bw);
        q4k_block_accumulate(bw, xb[b], acc, acc_min);
    }
    return hsum_f32x16(acc) + hsum_f32x4(acc_min);
}

// The same for n_w weight rows and m activation rows (VecDotMultiFn), each super-block
// decoded once.
void vec_dot_multi_q4_K_q8_K(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                             size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    kquant_multi_row<BlockQ4_K, Q4kBlockWeights, __m128>(n, w, w_stride, n_w, x, x_stride, m, out,
                                                         out_stride, q4k_block_weights,
                                                         q4k_block_accumulate, hsum_f32x4);
}

namespace {

// IQ2_XXS sign masks and scales are unpacked for up to this many super-blocks in a first pass:
// the parity computation is a long dependency chain, and ahead of the dot loop it no longer
// holds up the products.
constexpr int kIq2Chunk = 16;

struct Iq2Unpacked {
    // per group: the 32 weight signs, bit i set = value i negative; groups 2t and 2t+1 form
    // the 64-bit mask of step t
    alignas(32) uint32_t sign_words[kIq2Chunk][8];
    // per group: 2*ls+1 in both int16 halves (the vpdpwssd multiplier)
    alignas(32) uint32_t scales[kIq2Chunk][8];
};

// Each group's second u32 a1 holds four 7-bit sign indices s_l (bits 7l..7l+6) and the scale ls
// (bits 28..31). Sign byte l is s_l completed by its parity bit (ksigns[s] = s | parity(s) << 7,
// docs/MODEL.md 5.4), so no table is needed.
void iq2_xxs_unpack(const BlockIQ2_XXS *blocks, int count, Iq2Unpacked &out) {
    const __m256i m7 = _mm256_set1_epi32(0x7F);
    for (int i = 0; i < count; ++i) {
        const __m512i words = load512(blocks[i].qs);  // u64 lane g = a0 | a1 << 32
        const __m256i a1 = _mm512_cvtepi64_epi32(_mm512_srli_epi64(words, 32));
        __m256i v = _mm256_and_si256(a1, m7);
        // v | (b & c): byte l <- bits 7l..7l+6
        v = _mm256_ternarylogic_epi32(v, _mm256_slli_epi32(a1, 1), _mm256_slli_epi32(m7, 8), 0xF8);
        v = _mm256_ternarylogic_epi32(v, _mm256_slli_epi32(a1, 2), _mm256_slli_epi32(m7, 16), 0xF8);
        v = _mm256_ternarylogic_epi32(v, _mm256_slli_epi32(a1, 3), _mm256_slli_epi32(m7, 24), 0xF8);
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

// The 8 grid points of groups 2t and 2t+1: 4 indices in each group's first u32 a0.
__m512i iq2_xxs_grid_points(uint32_t a0_even, uint32_t a0_odd) {
    const auto *grid = reinterpret_cast<const long long *>(kIq2xxsGrid);
    const __m256i even = _mm256_setr_epi64x(grid[a0_even & 0xFF], grid[(a0_even >> 8) & 0xFF],
                                            grid[(a0_even >> 16) & 0xFF], grid[a0_even >> 24]);
    const __m256i odd = _mm256_setr_epi64x(grid[a0_odd & 0xFF], grid[(a0_odd >> 8) & 0xFF],
                                           grid[(a0_odd >> 16) & 0xFF], grid[a0_odd >> 24]);
    return _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1);
}

// The weight side of one IQ2_XXS super-block, decoded once for any number of activation rows.
struct Iq2BlockWeights {
    __m512i grid[4];        // step t: the grid points (magnitudes) of groups 2t and 2t+1
    __mmask64 negative[4];  // step t: their weight signs
    __m512i scale[4];       // step t: 2*ls+1 of group 2t in int32 lanes 0-7, of 2t+1 in 8-15
    float d;                // f16(d) / 8
};

inline void iq2_block_weights(const BlockIQ2_XXS &wq, const Iq2Unpacked &unpacked, int i,
                              Iq2BlockWeights &bw) {
    uint32_t a[16];  // a0, a1 of each group
    std::memcpy(a, wq.qs, sizeof(a));
    for (int t = 0; t < 4; ++t) {
        bw.grid[t] = iq2_xxs_grid_points(a[4 * t], a[4 * t + 2]);
        std::memcpy(&bw.negative[t], &unpacked.sign_words[i][2 * t], sizeof(bw.negative[t]));
        bw.scale[t] =
            _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(unpacked.scales[i][2 * t])),
                                   0xFF00, static_cast<int>(unpacked.scales[i][2 * t + 1]));
    }
    bw.d = 0.125f * simd::f16_to_f32(wq.d);
}

// sum_g (2*ls_g + 1) * sum_{32 values} (+-grid) * qy of one super-block, in int32 lanes (exact).
// |qy| is the unsigned maddubs operand; the grid value (<= 43) carries the product of the
// weight sign and the sign of qy.
inline __m512i iq2_block_isum(const Iq2BlockWeights &bw, const BlockQ8_K &xq) {
    __m512i sum_even = _mm512_setzero_si512(), sum_odd = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
        const __m512i y = load512(xq.qs + 64 * t);
        const __mmask64 negative = _kxor_mask64(bw.negative[t], _mm512_movepi8_mask(y));
        const __m512i signed_grid =
            _mm512_mask_sub_epi8(bw.grid[t], negative, _mm512_setzero_si512(), bw.grid[t]);
        const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(y), signed_grid);
        if (t % 2 == 0)
            sum_even = _mm512_dpwssd_epi32(sum_even, p, bw.scale[t]);
        else
            sum_odd = _mm512_dpwssd_epi32(sum_odd, p, bw.scale[t]);
    }
    return _mm512_add_epi32(sum_even, sum_odd);
}

}  // namespace

// y = d * dy / 8 * sum_g (2*ls_g + 1) * sum_{32 values} (+-grid) * qy, two groups per zmm.
// (On Zen 4 this kernel is bound by the 32 grid lookups per super-block; vpgatherqq and a
// vpermi2w lookup of packed grid codes both measured slower.)
float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const auto *xb = static_cast<const BlockQ8_K *>(x);
    const int64_t nb = n / kQK_K;
    __m512 acc = _mm512_setzero_ps();
    Iq2Unpacked unpacked;
    Iq2BlockWeights bw;
    simd::StreamPrefetch prefetch(w);
    for (int64_t first = 0; first < nb; first += kIq2Chunk) {
        const int count = static_cast<int>(std::min<int64_t>(nb - first, kIq2Chunk));
        prefetch.ahead(wb + first + count);
        iq2_xxs_unpack(wb + first, count, unpacked);
        for (int i = 0; i < count; ++i) {
            iq2_block_weights(wb[first + i], unpacked, i, bw);
            const BlockQ8_K &xq = xb[first + i];
            acc = _mm512_fmadd_ps(_mm512_set1_ps(bw.d * xq.d),
                                  _mm512_cvtepi32_ps(iq2_block_isum(bw, xq)), acc);
        }
    }
    return hsum_f32x16(acc);
}

// The same for m activation rows, each weight super-block decoded once: per row and block the
// same operations in the same order as a single dot, so each result equals vec_dot's bit for bit.
namespace {

void iq2_xxs_multi_row(int64_t n, const void *w, const void *x, size_t x_stride, int64_t m,
                       float *out, int64_t out_stride) {
    const auto *wb = static_cast<const BlockIQ2_XXS *>(w);
    const int64_t nb = n / kQK_K;
    Iq2Unpacked unpacked;
    Iq2BlockWeights bw;
    for (int64_t j0 = 0; j0 < m; j0 += kMultiRows) {
        const int64_t rows = std::min(kMultiRows, m - j0);
        __m512 acc[kMultiRows];
        for (int64_t j = 0; j < rows; ++j) acc[j] = _mm512_setzero_ps();
        for (int64_t first = 0; first < nb; first += kIq2Chunk) {
            const int count = static_cast<int>(std::min<int64_t>(nb - first, kIq2Chunk));
            iq2_xxs_unpack(wb + first, count, unpacked);
            for (int i = 0; i < count; ++i) {
                iq2_block_weights(wb[first + i], unpacked, i, bw);
                for (int64_t j = 0; j < rows; ++j) {
                    const BlockQ8_K &xq = q8k_row_block(x, x_stride, j0 + j, first + i);
                    acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(bw.d * xq.d),
                                             _mm512_cvtepi32_ps(iq2_block_isum(bw, xq)), acc[j]);
                }
            }
        }
        for (int64_t j = 0; j < rows; ++j) out[(j0 + j) * out_stride] = hsum_f32x16(acc[j]);
    }
}

}  // namespace

void vec_dot_multi_iq2_xxs_q8_K(int64_t n, const void *w, size_t w_stride, int64_t n_w,
                                const void *x, size_t x_stride, int64_t m, float *out,
                                int64_t out_stride) {
    over_weight_rows(w, w_stride, n_w, out, [&](const uint8_t *row, float *row_out) {
        iq2_xxs_multi_row(n, row, x, x_stride, m, row_out, out_stride);
    });
}

}  // namespace ds4::quant::avx512
