// The lightning indexer's kernels against their CPU twins (backend/cpu/indexer_score.h):
//   - indexer_scores is bit for bit the CPU's scores (the same f32 products and sums in the same
//     order, unfused), on Flash's 64 heads of 128 for 1 to 5000 rows (around the 512 of top-k,
//     and not a whole tile of rows) and on odd shapes; random q, w and rows of both signs, so
//     that about half the dot products are negative and the relu matters, and a zero row;
//   - top_k_ascending gives exactly the CPU's indices, in order: random scores, scores from 8
//     levels (so that the k-th best ties with hundreds of others and the lower indices must
//     win; -0 and +0 are one level, +-inf two more), all equal, n == k, k = 1, and the
//     published 1M-context size (262144 rows). Scores are never NaN (the CPU's result is not
//     defined then). n < k is not a case: the runtime takes every row then;
//   - the CPU twins themselves are the arithmetic of runtime/indexer.cpp (its loop and its
//     partial_sort, written out here), which needs no device.
// Outputs are poisoned (NaN scores, index -1) before every launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cpu/indexer_score.h"
#include "backend/cuda/indexer_ops.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

float flash_wscale(uint32_t n_heads, uint32_t head_dim) {
    return static_cast<float>(1.0 / std::sqrt(double(head_dim) * n_heads));
}

// Scores drawn from a few levels by a fixed hash of the index and seed.
std::vector<float> level_scores(int64_t n, uint64_t seed, const std::vector<float> &levels) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        uint64_t z = (uint64_t(i) + 1) * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        s[size_t(i)] = levels[size_t((z ^ (z >> 31)) % levels.size())];
    }
    return s;
}

TEST(CudaIndexer, CpuTwinsAreTheRuntimeArithmetic) {
    constexpr uint32_t kH = 64, kI = 128, kRows = 700, kK = 512;
    const auto q = random_floats(kH * kI, 1, 1.0f), w = random_floats(kH, 2, 1.0f),
               rows = random_floats(int64_t(kRows) * kI, 3, 1.0f);
    const float wscale = flash_wscale(kH, kI);
    // runtime/indexer.cpp's scoring, as written there
    std::vector<float> ws(w), want(kRows);
    for (uint32_t h = 0; h < kH; ++h) ws[h] *= wscale;
    for (uint32_t c = 0; c < kRows; ++c) {
        const float *k = rows.data() + size_t(c) * kI;
        float acc = 0.0f;
        for (uint32_t h = 0; h < kH; ++h) {
            const float *qh = q.data() + size_t(h) * kI;
            float dot = 0.0f;
            for (uint32_t j = 0; j < kI; ++j) dot += qh[j] * k[j];
            acc += std::max(dot, 0.0f) * ws[h];
        }
        want[c] = acc;
    }
    std::vector<float> got(kRows);
    backend::cpu::indexer_scores(q.data(), w.data(), wscale, rows.data(), kRows, kH, kI,
                                 got.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), kRows * sizeof(float)), 0);

    // its selection: rank(c) = #{j : s_j > s_c or (s_j == s_c and j < c)} < k, ascending
    for (const auto &s : {got, level_scores(kRows, 4, {1.0f, -1.0f, 0.0f, -0.0f, 2.0f})}) {
        std::vector<uint32_t> want_idx, got_idx(kK);
        for (uint32_t c = 0; c < kRows; ++c) {
            uint32_t rank = 0;
            for (uint32_t j = 0; j < kRows; ++j)
                rank += s[j] > s[c] || (s[j] == s[c] && j < c) ? 1 : 0;
            if (rank < kK) want_idx.push_back(c);
        }
        backend::cpu::top_k_ascending(s.data(), kRows, kK, got_idx.data());
        ASSERT_EQ(got_idx, want_idx);
    }
}

struct ScoreCase {
    int heads, head_dim;
    int64_t n_rows;
};

// How gtest prints a case (the test list that CTest reads names each case by it).
void PrintTo(const ScoreCase &c, std::ostream *os) {
    *os << c.heads << "x" << c.head_dim << " rows " << c.n_rows;
}

class CudaIndexerScores : public ::testing::TestWithParam<ScoreCase> {};

TEST_P(CudaIndexerScores, BitForBitCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto [heads, head_dim, n_rows] = GetParam();
    const int64_t n_q = int64_t(heads) * head_dim;
    const auto q = random_floats(n_q, 11 + n_rows, 1.0f), w = random_floats(heads, 12, 1.0f);
    auto rows = random_floats(n_rows * head_dim, 13 + n_rows, 2.0f);
    if (n_rows > 3) std::fill_n(rows.begin() + 3 * head_dim, head_dim, 0.0f);  // all dots +0
    const float wscale = flash_wscale(uint32_t(heads), uint32_t(head_dim));
    std::vector<float> want(static_cast<size_t>(n_rows));
    backend::cpu::indexer_scores(q.data(), w.data(), wscale, rows.data(), uint32_t(n_rows),
                                 uint32_t(heads), uint32_t(head_dim), want.data());
    // relu matters: some of row 0's dot products are negative (and some positive)
    int negative = 0;
    for (int h = 0; h < heads; ++h) {
        float dot = 0.0f;
        for (int j = 0; j < head_dim; ++j) dot += q[size_t(h * head_dim + j)] * rows[size_t(j)];
        negative += dot < 0.0f ? 1 : 0;
    }
    if (heads >= 64) {
        ASSERT_TRUE(negative > 0 && negative < heads) << negative << " of " << heads;
    }

    const DeviceBuffer dq = to_device(q), dw = to_device(w), drows = to_device(rows);
    DeviceBuffer score(size_t(n_rows) * sizeof(float));
    for (int run = 0; run < 2; ++run) {
        DS4_CUDA_CHECK(cudaMemset(score.get(), 0xff, score.bytes()));  // NaN in every output
        indexer_scores(dq.as<float>(), dw.as<float>(), wscale, drows.as<float>(), n_rows, heads,
                       head_dim, score.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(score, size_t(n_rows));
        for (int64_t c = 0; c < n_rows; ++c)
            ASSERT_EQ(std::memcmp(&got[size_t(c)], &want[size_t(c)], sizeof(float)), 0)
                << "row " << c << " of " << n_rows << ": " << got[size_t(c)] << " vs "
                << want[size_t(c)] << " (run " << run << ")";
    }
    // The stored w is unchanged (the twin scales a copy).
    const auto w_after = to_host<float>(dw, w.size());
    ASSERT_EQ(std::memcmp(w_after.data(), w.data(), w.size() * sizeof(float)), 0);
}

// Flash's indexer (64 heads of 128) around the 512 rows of its top-k, one row, a row count that
// is not a whole tile, the most rows of 16-row tiles (4 tiles a block) and more (64-row tiles,
// more tiles than blocks); then shapes whose heads do not fill the block's 256 threads evenly.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaIndexerScores,
                         ::testing::Values(ScoreCase{64, 128, 1}, ScoreCase{64, 128, 511},
                                           ScoreCase{64, 128, 512}, ScoreCase{64, 128, 513},
                                           ScoreCase{64, 128, 5000}, ScoreCase{64, 128, 37},
                                           ScoreCase{64, 128, 33792}, ScoreCase{64, 128, 40000},
                                           ScoreCase{96, 64, 301}, ScoreCase{7, 40, 100},
                                           ScoreCase{1, 8, 20}),
                         [](const auto &info) {
                             return std::to_string(info.param.heads) + "x" +
                                    std::to_string(info.param.head_dim) + "_rows" +
                                    std::to_string(info.param.n_rows);
                         });

void expect_top_k_equals_cpu(const std::vector<float> &s, int64_t k, const std::string &what) {
    const int64_t n = int64_t(s.size());
    std::vector<uint32_t> want(static_cast<size_t>(k));
    backend::cpu::top_k_ascending(s.data(), uint32_t(n), uint32_t(k), want.data());
    const DeviceBuffer ds = to_device(s);
    DeviceBuffer out(size_t(k) * sizeof(int32_t)),
        scratch(std::max<size_t>(1, top_k_scratch_bytes(n)));
    for (int run = 0; run < 2; ++run) {
        DS4_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));  // index -1 everywhere
        top_k_ascending(ds.as<float>(), n, k, out.as<int32_t>(), scratch.get(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<int32_t>(out, size_t(k));
        for (int64_t i = 0; i < k; ++i)
            ASSERT_EQ(got[size_t(i)], int32_t(want[size_t(i)]))
                << what << ": n " << n << " k " << k << " position " << i << " (run " << run << ")";
    }
}

TEST(CudaIndexerTopK, RandomScoresEqualCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (uint64_t seed = 1; seed <= 3; ++seed)
        expect_top_k_equals_cpu(random_floats(5000, seed, 10.0f), 512, "random 5000");
    expect_top_k_equals_cpu(random_floats(512, 4, 1.0f), 512, "n == k");
    expect_top_k_equals_cpu(random_floats(513, 5, 1.0f), 512, "n == k + 1");
    expect_top_k_equals_cpu(random_floats(5000, 6, 1.0f), 1, "k = 1");
    expect_top_k_equals_cpu(random_floats(262144, 7, 3.0f), 512, "1M context");
    // tiny magnitudes: subnormal and nearby scores, both signs
    expect_top_k_equals_cpu(random_floats(5000, 8, 1e-38f), 512, "subnormal");
}

TEST(CudaIndexerTopK, TiedScoresEqualCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::vector<float> levels = {-INFINITY, -2.5f, -0.0f, 0.0f, 0.125f, 1.0f, 3.0f, INFINITY};
    for (uint64_t seed = 1; seed <= 3; ++seed)
        expect_top_k_equals_cpu(level_scores(5000, seed, levels), 512, "8 levels");
    expect_top_k_equals_cpu(level_scores(512, 4, levels), 512, "8 levels, n == k");
    expect_top_k_equals_cpu(level_scores(262144, 5, levels), 512, "8 levels, 1M context");
    expect_top_k_equals_cpu(level_scores(5000, 6, {1.0f, 2.0f}), 512, "2 levels");
    expect_top_k_equals_cpu(std::vector<float>(5000, 0.5f), 512, "all equal");
    // the k-th best is one of few equal values far down
    auto few = random_floats(5000, 7, 1.0f);
    for (int i = 0; i < 600; ++i) few[size_t(i) * 8] = 2.0f;
    expect_top_k_equals_cpu(few, 512, "600 equal maxima");
}

TEST(CudaIndexerTopK, DeviceScoresSelectAsCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kH = 64, kI = 128;
    constexpr int64_t kRows = 5000, kK = 512;
    const auto q = random_floats(kH * kI, 21, 1.0f), w = random_floats(kH, 22, 1.0f),
               rows = random_floats(kRows * kI, 23, 1.0f);
    const float wscale = flash_wscale(kH, kI);
    std::vector<float> s(kRows);
    backend::cpu::indexer_scores(q.data(), w.data(), wscale, rows.data(), kRows, kH, kI, s.data());
    std::vector<uint32_t> want(kK);
    backend::cpu::top_k_ascending(s.data(), kRows, kK, want.data());

    const DeviceBuffer dq = to_device(q), dw = to_device(w), drows = to_device(rows);
    DeviceBuffer score(kRows * sizeof(float)), out(kK * sizeof(int32_t)),
        scratch(std::max<size_t>(1, top_k_scratch_bytes(kRows)));
    DS4_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
    indexer_scores(dq.as<float>(), dw.as<float>(), wscale, drows.as<float>(), kRows, kH, kI,
                   score.as<float>(), nullptr);
    top_k_ascending(score.as<float>(), kRows, kK, out.as<int32_t>(), scratch.get(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<int32_t>(out, kK);
    for (int64_t i = 0; i < kK; ++i)
        ASSERT_EQ(got[size_t(i)], int32_t(want[size_t(i)])) << "position " << i;
}

}  // namespace
}  // namespace ds4::cuda
