#pragma once
// Small helpers shared by kernels_avx2.cpp and kernels_avx512.cpp: scalar scale conversions and
// 128-bit constants, needing at most F16C/SSE4.
//
// Everything here has internal linkage (unnamed namespace) on purpose: the two files are
// compiled for different instruction sets, and an ordinary inline function would be emitted
// by both with the linker keeping one copy, possibly the AVX-512 one for the AVX2 caller.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace ds4::quant::simd {
namespace {

inline float f16_to_f32(uint16_t h) {
    return _cvtsh_ss(h);
}

// f32 -> f16 bits, round to nearest even (F16C handles subnormals, overflow to inf, NaN).
inline uint16_t f32_to_f16_rne(float f) {
    return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// E8M0 exponent e -> 2^(e-128), i.e. half the block scale 2^(e-127) (ggml's
// GGML_E8M0_TO_FP32_HALF); e = 0 and 1 give subnormal floats.
inline float e8m0_to_f32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

// The 16 E2M1 codes at twice their value: {0, .5, 1, 1.5, 2, 3, 4, 6} and negatives, times 2.
inline __m128i mxfp4_doubled_values_128() {
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// Unpacks Q4_K's 12 scale bytes into 16 bytes: the 8 six-bit scales sc_0..sc_7, then the 8
// six-bit mins m_0..m_7 (docs/MODEL.md 5.3):
//   j < 4:  sc = s[j] & 63,                      m = s[j+4] & 63
//   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4
inline __m128i q4_K_scales_mins(const uint8_t *scales12) {
    uint32_t s[3];
    std::memcpy(s, scales12, sizeof(s));
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t sc_lo = s[0] & low6;                                        // sc_0..3
    const uint32_t sc_hi = (s[2] & low4) | (((s[0] >> 6) & low2) << 4);        // sc_4..7
    const uint32_t m_lo = s[1] & low6;                                         // m_0..3
    const uint32_t m_hi = ((s[2] >> 4) & low4) | (((s[1] >> 6) & low2) << 4);  // m_4..7
    return _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), static_cast<int>(m_lo),
                          static_cast<int>(m_hi));
}


// Software prefetch of a weight stream, kAheadBytes ahead of the bytes being read: each call of
// ahead(pos) asks for every 64-byte line up to pos + kAheadBytes not yet asked for. A core's
// loads feeding a chain of dot products keep too few misses in flight to stream on their own:
// on a 16-core Xeon one thread's Q8_0 dot read 0.50 of a plain read's bandwidth without it and
// 0.86 with 2 KiB ahead (768 bytes: 0.63), 85 -> 133 GB/s on 16 threads (docs/PERFORMANCE.md).
// Lines past the row's end are asked for too: they are the next rows of a matvec chunk. A hint:
// no result changes, and a prefetch never faults.
constexpr int64_t kAheadBytes = 2048;

class StreamPrefetch {
  public:
    explicit StreamPrefetch(const void *start)
        : next_(reinterpret_cast<uintptr_t>(start) & ~uintptr_t{63}) {}
    void ahead(const void *pos) {
        const uintptr_t target = reinterpret_cast<uintptr_t>(pos) + kAheadBytes;
        for (; next_ <= target; next_ += 64)
            _mm_prefetch(reinterpret_cast<const char *>(next_), _MM_HINT_T0);
    }

  private:
    uintptr_t next_;
};

}  // namespace
}  // namespace ds4::quant::simd
