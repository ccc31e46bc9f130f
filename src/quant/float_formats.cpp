// Plain float formats: F32, F16 (IEEE binary16) and BF16 (the top half of an f32).
#include <bit>
#include <cstring>

#include "quant/kernels_ref.h"

namespace ds4::quant::ref {

float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {
        // zero or subnormal: mantissa * 2^-24, exact in f32
        const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
        return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
    }
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    // rebias the exponent from 15 to 127
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)  // NaN: set the quiet bit, keep the top payload bits
        return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    // 65520 = 65504 + half an ulp is the first value that rounds (to even) past the largest
    // finite f16; it and everything above become inf.
    if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {
        // normal f16 (|f| >= 2^-14): drop 13 mantissa bits rounding to nearest even; a carry
        // out of the mantissa correctly bumps the exponent.
        const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
        return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
    }
    // subnormal f16: the result is round_even(|f| / 2^-24). |f| = m * 2^(e-150) with the
    // implicit bit in m, so |f| / 2^-24 = m >> (126 - e).
    const uint32_t e = magnitude >> 23;
    const uint32_t shift = 126 - e;
    if (e == 0 || shift > 24) return sign;  // below 2^-25 (or exactly it, a tie to 0)
    const uint32_t m = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
}

float bf16_to_f32(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

uint16_t f32_to_bf16(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 64u);
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void dequantize_row_f32(const void *src, float *dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_row_f16(const void *src, float *dst, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void dequantize_row_bf16(const void *src, float *dst, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}

void quantize_row_f32(const float *src, void *dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_row_f16(const float *src, void *dst, int64_t n) {
    auto *h = static_cast<uint16_t *>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

void quantize_row_bf16(const float *src, void *dst, int64_t n) {
    auto *h = static_cast<uint16_t *>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
}

// The products of two f32 values are exact in double (24 + 24 bits < 53), so these sums round
// only when adding; the result is rounded to f32 once.
float vec_dot_f32_f32(int64_t n, const void *w, const void *x) {
    const auto *a = static_cast<const float *>(w);
    const auto *b = static_cast<const float *>(x);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return static_cast<float>(sum);
}

float vec_dot_f16_f32(int64_t n, const void *w, const void *x) {
    const auto *a = static_cast<const uint16_t *>(w);
    const auto *b = static_cast<const float *>(x);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
        sum += static_cast<double>(f16_to_f32(a[i])) * static_cast<double>(b[i]);
    return static_cast<float>(sum);
}

float vec_dot_bf16_f32(int64_t n, const void *w, const void *x) {
    const auto *a = static_cast<const uint16_t *>(w);
    const auto *b = static_cast<const float *>(x);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
        sum += static_cast<double>(bf16_to_f32(a[i])) * static_cast<double>(b[i]);
    return static_cast<float>(sum);
}

}  // namespace ds4::quant::ref
