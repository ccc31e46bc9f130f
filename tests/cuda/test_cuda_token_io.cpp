// Embedding lookup and greedy selection on the device against the CPU: the embedding row equals
// the CPU's F16/F32 dequantization in every stream bit for bit; argmax equals runtime::argmax
// (std::max_element) on random logits over the published vocabulary, on ties (the first wins),
// and with NaNs (ignored, except a NaN at index 0, which max_element returns).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/token_io.h"
#include "cuda_test_util.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"
#include "runtime/sampler.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

TEST(CudaTokenIo, EmbedEqualsCpuRow) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kVocab = 1000, kE = 4096 + 8;
    constexpr int kHc = 4;
    for (const GgmlType type : {GgmlType::F16, GgmlType::F32}) {
        const auto table = quant::random_blocks(type, kVocab * kE, 77);
        const DeviceBuffer dt = to_device(table);
        for (const int32_t token : {0, 1, 517, 999}) {
            std::vector<float> want(kE);
            quant::dequantize_row(type, table.data() + size_t(token) * quant::row_size(type, kE),
                                  want.data(), kE);
            const DeviceBuffer dtok = to_device(std::vector<int32_t>{token});
            DeviceBuffer out(size_t(kHc * kE) * 4);
            DS4_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
            embed_token(dt.get(), type, kVocab, kE, dtok.as<int32_t>(), kHc, out.as<float>(),
                        nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(out, size_t(kHc * kE));
            for (int h = 0; h < kHc; ++h)
                ASSERT_EQ(std::memcmp(got.data() + h * kE, want.data(), kE * 4), 0)
                    << ggml_type_name(type) << " token " << token << " stream " << h;
        }
    }
}

TEST(CudaTokenIo, ArgmaxEqualsCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::vector<float>> cases;
    for (uint64_t seed = 1; seed <= 5; ++seed) cases.push_back(random_floats(129280, seed, 20.0f));
    auto ties = random_floats(129280, 9, 1.0f);
    ties[70000] = ties[90000] = ties[120000] = 5.0f;  // three equal maxima: the first wins
    cases.push_back(ties);
    auto nans = random_floats(5000, 10, 1.0f);
    nans[17] = nans[4000] = nan, nans[3000] = 9.0f;
    cases.push_back(nans);
    auto first_nan = random_floats(5000, 11, 1.0f);
    first_nan[0] = nan;
    cases.push_back(first_nan);
    cases.push_back({-INFINITY, nan});
    cases.push_back({nan, nan, nan});
    cases.push_back({3.0f});
    for (size_t c = 0; c < cases.size(); ++c) {
        const int32_t want = runtime::argmax(cases[c]);
        const DeviceBuffer dl = to_device(cases[c]);
        DeviceBuffer tok(4);
        DS4_CUDA_CHECK(cudaMemset(tok.get(), 0xff, 4));
        argmax(dl.as<float>(), int64_t(cases[c].size()), tok.as<int32_t>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_EQ(to_host<int32_t>(tok, 1)[0], want) << "case " << c;
    }
}

}  // namespace
}  // namespace ds4::cuda
