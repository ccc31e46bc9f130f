// f16 / bf16 / E8M0 conversions against numpy, gguf-py and libm.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fixture_files.h"
#include "quant/kernels_ref.h"

namespace ds4::quant {
namespace {

using testing::read_fixture_as;

bool is_nan_bits16(uint16_t h, uint16_t exponent_mask) {
    return (h & exponent_mask) == exponent_mask && (h & ~exponent_mask & 0x7fff) != 0;
}

TEST(F16, AllPatternsToF32MatchNumpy) {
    const std::vector<uint32_t> expected = read_fixture_as<uint32_t>("f16_all.f32");
    ASSERT_EQ(expected.size(), 65536u);
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = ref::f16_to_f32(static_cast<uint16_t>(h));
        if (is_nan_bits16(static_cast<uint16_t>(h), 0x7c00)) {
            // NaN payloads are not part of the contract (numpy may quiet them)
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
            ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
            continue;
        }
        ASSERT_EQ(std::bit_cast<uint32_t>(got), expected[h]) << "f16 0x" << std::hex << h;
    }
}

TEST(F16, AllPatternsRoundTrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const auto h16 = static_cast<uint16_t>(h);
        const uint16_t back = ref::f32_to_f16(ref::f16_to_f32(h16));
        if (is_nan_bits16(h16, 0x7c00))
            ASSERT_TRUE(is_nan_bits16(back, 0x7c00)) << std::hex << h;
        else
            ASSERT_EQ(back, h16) << std::hex << h;
    }
}

TEST(F16, F32RoundingMatchesNumpy) {
    const std::vector<float> input = read_fixture_as<float>("f32_to_f16.in.f32");
    const std::vector<uint16_t> expected = read_fixture_as<uint16_t>("f32_to_f16.out.u16");
    ASSERT_EQ(input.size(), expected.size());
    ASSERT_GT(input.size(), 8000u);
    int mismatches = 0;
    for (size_t i = 0; i < input.size(); ++i) {
        const uint16_t got = ref::f32_to_f16(input[i]);
        if (got != expected[i] && mismatches++ < 10)
            ADD_FAILURE() << "f32 " << input[i] << " (0x" << std::hex
                          << std::bit_cast<uint32_t>(input[i]) << "): got 0x" << got << ", numpy 0x"
                          << expected[i];
    }
    EXPECT_EQ(mismatches, 0);
}

TEST(F16, NaNStaysNaN) {
    for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fa00000u}) {
        const uint16_t h = ref::f32_to_f16(std::bit_cast<float>(bits));
        EXPECT_TRUE(is_nan_bits16(h, 0x7c00)) << std::hex << bits << " -> " << h;
        EXPECT_EQ((h & 0x8000) != 0, (bits & 0x80000000u) != 0);
    }
}

TEST(BF16, F32RoundingMatchesGgufPy) {
    const std::vector<float> input = read_fixture_as<float>("f32_to_bf16.in.f32");
    const std::vector<uint16_t> expected = read_fixture_as<uint16_t>("f32_to_bf16.out.u16");
    ASSERT_EQ(input.size(), expected.size());
    int mismatches = 0;
    for (size_t i = 0; i < input.size(); ++i) {
        const uint16_t got = ref::f32_to_bf16(input[i]);
        if (got != expected[i] && mismatches++ < 10)
            ADD_FAILURE() << "f32 0x" << std::hex << std::bit_cast<uint32_t>(input[i]) << ": got 0x"
                          << got << ", gguf-py 0x" << expected[i];
    }
    EXPECT_EQ(mismatches, 0);
}

TEST(BF16, AllPatternsRoundTrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const auto h16 = static_cast<uint16_t>(h);
        const float f = ref::bf16_to_f32(h16);
        EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
        const uint16_t back = ref::f32_to_bf16(f);
        if (is_nan_bits16(h16, 0x7f80))
            ASSERT_EQ(back, h16 | 0x40) << "NaN made quiet: " << std::hex << h;
        else
            ASSERT_EQ(back, h16) << std::hex << h;
    }
}

TEST(E8M0, HalfScaleIsPowerOfTwo) {
    for (int e = 0; e < 256; ++e)
        ASSERT_EQ(ref::e8m0_to_f32_half(static_cast<uint8_t>(e)), std::ldexp(1.0f, e - 128)) << e;
}

}  // namespace
}  // namespace ds4::quant
