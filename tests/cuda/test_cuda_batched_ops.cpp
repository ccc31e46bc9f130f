// The prefill launches of the CUDA backend against the decode launches they batch, bit for bit
// (each decode kernel is checked against its CPU twin in its own test file; a batched launch must
// give every token exactly its decode bits, which is what keeps a chunked prefill equal to a
// token-by-token one, tests/cuda/test_cuda_model.cpp):
//   - group_by_expert: the offsets and the stable order of a host counting sort, with empty
//     experts, an expert of more pairs than a tile (8) and repeated ids;
//   - the grouped routed products (IQ2_XXS, Q2_K, Q4_K): each pair's row equals the decode
//     matvec of its expert on its activation row, as gate/up (the token's row) and as down (the
//     pair's own row), on the published shapes and a small odd one, with tiles in parallel and
//     looped; outputs poisoned first;
//   - matmul_float: each row equals matvec_float of that row (F32, F16, BF16; with and without
//     the split of k);
//   - route_experts, sum_slots, hc_mix_combine and hc_post over n tokens, and the attention's
//     row_finish (query heads; KV rows into a table, one token's index -1), the indexer's
//     scores and top-k (counts below, at and above k), the compressor (pushes, pools and shifts
//     of a batch in one launch, then its rows' chain in one more, against compressor_push_step,
//     the pooling row_finish and compressor_shift_if token by token), gather_rows_step,
//     attention_scores, attention_mix and rope_tail: token t's outputs equal a one-token launch
//     on token t's inputs and device words (words of 5 int64 a token, as a step's are strided).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/rope.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/float_matvec.h"
#include "backend/cuda/hyper_connections.h"
#include "backend/cuda/indexer_ops.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/q2_k_matvec.h"
#include "backend/cuda/q4_k_matvec.h"
#include "backend/cuda/row_finish.h"
#include "backend/cuda/vector_ops.h"
#include "cuda_test_util.h"
#include "quant/random_blocks.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::same_bits;
using test::to_device;
using test::to_host;

// Pairs of n_tokens tokens with n_used slots each: expert 5 takes every third pair (more than a
// tile), expert 2 none, the rest spread with repeats.
std::vector<int32_t> pair_ids(int n_tokens, int n_used, int n_expert) {
    std::vector<int32_t> ids(size_t(n_tokens) * n_used);
    for (size_t p = 0; p < ids.size(); ++p) {
        int e = p % 3 == 0 ? 5 : int((p * 7 + p / 5) % size_t(n_expert));
        if (e == 2) e = 0;
        ids[p] = e;
    }
    return ids;
}

struct Groups {
    DeviceBuffer offsets, order;
};

Groups group_on_device(const std::vector<int32_t> &ids, int n_expert) {
    const DeviceBuffer dids = to_device(ids);
    Groups g{DeviceBuffer((size_t(n_expert) + 1) * 4), DeviceBuffer(ids.size() * 4)};
    DS4_CUDA_CHECK(cudaMemset(g.offsets.get(), 0xff, g.offsets.bytes()));
    DS4_CUDA_CHECK(cudaMemset(g.order.get(), 0xff, g.order.bytes()));
    group_by_expert(dids.as<int32_t>(), int(ids.size()), n_expert, g.offsets.as<int32_t>(),
                    g.order.as<int32_t>(), nullptr);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    return g;
}

TEST(CudaExpertGroups, OffsetsAndStableOrderOfACountingSort) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_tokens, n_used, n_expert] :
         {std::tuple{256, 6, 256}, std::tuple{21, 3, 9}, std::tuple{1, 6, 256}, std::tuple{7, 2, 8},
          std::tuple{100, 8, 1000}}) {
        const auto ids = pair_ids(n_tokens, n_used, n_expert);
        const Groups g = group_on_device(ids, n_expert);
        std::vector<int32_t> want_order(ids.size());
        for (size_t p = 0; p < ids.size(); ++p) want_order[p] = int32_t(p);
        std::stable_sort(want_order.begin(), want_order.end(),
                         [&](int32_t a, int32_t b) { return ids[size_t(a)] < ids[size_t(b)]; });
        std::vector<int32_t> want_offsets(size_t(n_expert) + 1, 0);
        for (int32_t e : ids) ++want_offsets[size_t(e) + 1];
        for (int e = 0; e < n_expert; ++e) want_offsets[size_t(e) + 1] += want_offsets[size_t(e)];
        ASSERT_EQ(to_host<int32_t>(g.offsets, size_t(n_expert) + 1), want_offsets)
            << n_tokens << " tokens, " << n_expert << " experts";
        ASSERT_EQ(to_host<int32_t>(g.order, ids.size()), want_order)
            << n_tokens << " tokens, " << n_expert << " experts";
    }
}

// The activation rows of a Q8_K view from row `row` on (rows of k values).
Q8_KActivation rows_from(const Q8_KActivation &a, int64_t row, int64_t k) {
    return {a.q + row * k, a.d + row * (k / 256), a.bsums + row * (k / 16)};
}

// grouped(groups, x, y) and decode(id, x, y) for one format's weights of kExperts experts.
template <class Grouped, class Decode>
void check_grouped(int64_t n_rows, int64_t k, int n_expert, Grouped &&grouped, Decode &&decode) {
    constexpr int kUsed = 3;
    // 21 tokens: expert 5 has 21 pairs (3 tiles); 99 tokens: 99 pairs (13 tiles, the last of 3
    // pairs).
    for (const int k_tokens : {21, 99}) {
        const auto ids = pair_ids(k_tokens, kUsed, n_expert);
        const int n_pairs = int(ids.size());
        const Groups g = group_on_device(ids, n_expert);
        // down: a row per pair; gate/up: per token. A token count of 1 sizes the grid for one tile
        // an expert: the blocks then loop over the tiles of expert 5.
        for (const auto &[per_pair, n_tokens] :
             {std::pair{false, k_tokens}, std::pair{true, k_tokens}, std::pair{false, 1}}) {
            const int n_x = per_pair ? n_pairs : k_tokens;
            const auto x = random_floats(int64_t(n_x) * k, 41 + k + n_x, 3.0f);
            const test::DeviceQ8_K a = test::quantize_q8_K_on_device(x);
            const ExpertGroups groups{g.offsets.as<int32_t>(), g.order.as<int32_t>(), n_expert,
                                      per_pair ? 1 : kUsed, n_tokens};
            const size_t n_out = size_t(n_pairs) * size_t(n_rows);
            DeviceBuffer y = to_device(test::poison_floats(n_out));
            grouped(groups, a.view(), y.as<float>());
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(y, n_out);
            DeviceBuffer yr(size_t(n_rows) * 4);
            for (int p = 0; p < n_pairs; ++p) {
                const DeviceBuffer id = to_device(std::vector<int32_t>{ids[size_t(p)]});
                DS4_CUDA_CHECK(cudaMemset(yr.get(), 0xff, yr.bytes()));
                decode(id.as<int32_t>(), rows_from(a.view(), per_pair ? p : p / kUsed, k),
                       yr.as<float>());
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                const auto want = to_host<float>(yr, size_t(n_rows));
                const std::vector<float> row(got.begin() + p * n_rows,
                                             got.begin() + (p + 1) * n_rows);
                for (float v : row) ASSERT_FALSE(std::isnan(v)) << "pair " << p << " not written";
                ASSERT_TRUE(same_bits(row, want))
                    << "pair " << p << " (expert " << ids[size_t(p)] << "), rows " << n_rows
                    << " k " << k << (per_pair ? ", a row per pair" : ", a row per token")
                    << ", grid for " << n_tokens << " tokens, " << k_tokens << " tokens' pairs";
            }
        }
    }
}

constexpr int kExperts = 9;

TEST(CudaExpertMatmul, Iq2xxsGroupedEqualsDecodeBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {37, 768}}) {
        const auto w = quant::random_blocks(GgmlType::IQ2_XXS, kExperts * n_rows * k, 17 + k);
        const Iq2xxsWeights dw(w.data(), n_rows, k, kExperts);
        check_grouped(
            n_rows, k, kExperts,
            [&](const ExpertGroups &g, const Q8_KActivation &x, float *y) {
                matmul_iq2_xxs_grouped(dw.experts(), g, x, y, nullptr);
            },
            [&](const int32_t *id, const Q8_KActivation &x, float *y) {
                matvec_iq2_xxs(dw.experts(), id, 1, x, y, nullptr);
            });
    }
}

TEST(CudaExpertMatmul, Q2KGroupedEqualsDecodeBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{4096, 2048}, {37, 768}}) {
        const auto w = quant::random_blocks(GgmlType::Q2_K, kExperts * n_rows * k, 29 + k);
        const Q2KWeights dw(w.data(), n_rows, k, kExperts);
        check_grouped(
            n_rows, k, kExperts,
            [&](const ExpertGroups &g, const Q8_KActivation &x, float *y) {
                matmul_q2_K_grouped(dw.experts(), g, x, y, nullptr);
            },
            [&](const int32_t *id, const Q8_KActivation &x, float *y) {
                matvec_q2_K(dw.experts(), id, 1, x, y, nullptr);
            });
    }
}

TEST(CudaExpertMatmul, Q4KGroupedEqualsDecodeBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    for (const auto &[n_rows, k] : {std::pair<int64_t, int64_t>{4096, 2048}, {37, 768}}) {
        const auto w = quant::random_blocks(GgmlType::Q4_K, kExperts * n_rows * k, 53 + k);
        const Q4KWeights dw(w.data(), n_rows, k, kExperts);
        check_grouped(
            n_rows, k, kExperts,
            [&](const ExpertGroups &g, const Q8_KActivation &x, float *y) {
                matmul_q4_K_grouped(dw.experts(), g, x, y, nullptr);
            },
            [&](const int32_t *id, const Q8_KActivation &x, float *y) {
                matvec_q4_K(dw.experts(), id, 1, x, y, nullptr);
            });
    }
}

TEST(CudaFloatMatmul, EveryRowIsItsMatvecThroughOneScratch) {
    DS4_REQUIRE_CUDA_DEVICE();
    // 24 x 16384: the hyper-connection mixer (128 spans of 4 chunks); 256 x 4096: the router
    // (32 spans); 7 x 40: one span of two chunks, the second a tail of 8 values. All through one
    // scratch in turns, with batches of two sizes (these batches take the smallest tile).
    constexpr int64_t kMaxM = 37;
    struct Case {
        GgmlType type;
        int64_t n_rows, k;
    };
    const std::vector<Case> cases = {{GgmlType::F16, 24, 16384}, {GgmlType::F32, 256, 4096},
                                     {GgmlType::BF16, 7, 40},    {GgmlType::F32, 24, 16384},
                                     {GgmlType::F16, 256, 4096}, {GgmlType::BF16, 24, 16384}};
    std::vector<DeviceBuffer> weights;
    std::vector<FloatMatrix> mats;
    size_t counter_bytes = 0, partial_bytes = 0, matvec_bytes = 16;
    for (const Case &c : cases) {
        weights.push_back(to_device(quant::random_blocks(c.type, c.n_rows * c.k, 5 + c.k)));
        mats.push_back({c.type, weights.back().get(), c.n_rows, c.k});
        counter_bytes = std::max(counter_bytes, float_matmul_counter_bytes(mats.back(), kMaxM));
        partial_bytes = std::max(partial_bytes, float_matmul_partial_bytes(mats.back(), kMaxM));
        matvec_bytes = std::max(matvec_bytes, float_matvec_scratch_bytes(mats.back()));
    }
    DeviceBuffer counters(std::max<size_t>(counter_bytes, 16)),
        partial(std::max<size_t>(partial_bytes, 16)), matvec_scratch(matvec_bytes);
    DS4_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
    DS4_CUDA_CHECK(cudaMemset(matvec_scratch.get(), 0, matvec_scratch.bytes()));
    const FloatMatmulScratch scratch{counters.get(), counter_bytes, partial.get(), partial_bytes};
    for (int round = 0; round < 2; ++round)
        for (size_t c = 0; c < cases.size(); ++c) {
            const FloatMatrix &fm = mats[c];
            const int64_t m = round == 0 ? kMaxM : 5 + int64_t(c), k = fm.k, n_rows = fm.n_rows;
            const auto X = random_floats(m * k, 6 + k + c, 2.0f);
            const DeviceBuffer dX = to_device(X);
            DeviceBuffer Y = to_device(test::poison_floats(size_t(m * n_rows)));
            matmul_float(fm, dX.as<float>(), m, Y.as<float>(), scratch, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(Y, size_t(m * n_rows));
            DeviceBuffer y(size_t(n_rows) * 4);
            for (int64_t t = 0; t < m; ++t) {
                matvec_float(fm, dX.as<float>() + t * k, y.as<float>(), matvec_scratch.get(),
                             nullptr);
                DS4_CUDA_CHECK(cudaDeviceSynchronize());
                const std::vector<float> row(got.begin() + t * n_rows,
                                             got.begin() + (t + 1) * n_rows);
                ASSERT_TRUE(same_bits(row, to_host<float>(y, size_t(n_rows))))
                    << ggml_type_name(fm.type) << " " << n_rows << " x " << k << " row " << t
                    << " of " << m << ", round " << round;
            }
        }
}

// Each tile shape of a batch (float_matvec.cu picks the largest that fills a wave of blocks):
// every token's outputs are the bits of its own matvec_float, with partial row and token tiles
// and a tail chunk (the shapes of float_mma.h's tensor-core products; the smallest tile is the
// other test's). 1040 x 4096, 520 tokens: 64 x 64 tiles; 264 x 1024, 1030 tokens: 64 x 32;
// 264 x 520, 600 tokens: 32 x 32.
TEST(CudaFloatMatmul, EveryTileShapeGivesEachTokenItsMatvecBits) {
    DS4_REQUIRE_CUDA_DEVICE();
    struct Case {
        GgmlType type;
        int64_t n_rows, k, m;
    };
    for (const Case &c :
         {Case{GgmlType::F16, 1040, 4096, 520}, Case{GgmlType::BF16, 264, 1024, 1030},
          Case{GgmlType::F32, 264, 520, 600}}) {
        const FloatMatrix host_view{c.type, nullptr, c.n_rows, c.k};
        const DeviceBuffer dw = to_device(quant::random_blocks(c.type, c.n_rows * c.k, 9 + c.k));
        const FloatMatrix fm{c.type, dw.get(), c.n_rows, c.k};
        const auto X = random_floats(c.m * c.k, 10 + c.m, 2.0f);
        const DeviceBuffer dX = to_device(X);
        DeviceBuffer Y = to_device(test::poison_floats(size_t(c.m * c.n_rows)));
        matmul_float(fm, dX.as<float>(), c.m, Y.as<float>(), FloatMatmulScratch{}, nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(Y, size_t(c.m * c.n_rows));
        DeviceBuffer y(size_t(c.n_rows) * 4),
            scratch(std::max<size_t>(16, float_matvec_scratch_bytes(host_view)));
        DS4_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.bytes()));
        for (int64_t t = 0; t < c.m; ++t) {
            matvec_float(fm, dX.as<float>() + t * c.k, y.as<float>(), scratch.get(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> row(got.begin() + t * c.n_rows,
                                         got.begin() + (t + 1) * c.n_rows);
            ASSERT_TRUE(same_bits(row, to_host<float>(y, size_t(c.n_rows))))
                << ggml_type_name(c.type) << " " << c.n_rows << " x " << c.k << " token " << t
                << " of " << c.m;
        }
    }
}

TEST(CudaBatchedGlue, RouteOverTokensIsEachTokensRoute) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kTokens = 19;
    constexpr uint32_t kExpert = 256, kUsed = 6;
    for (const bool hash : {false, true}) {
        const auto logits = random_floats(kTokens * kExpert, 77, 6.0f);
        const auto bias = random_floats(kExpert, 78, 0.5f);
        std::vector<int32_t> table(size_t(50) * kUsed), tokens(kTokens);
        for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 37 + 3) % kExpert);
        for (int t = 0; t < kTokens; ++t) tokens[size_t(t)] = (t * 13) % 50;
        const DeviceBuffer dl = to_device(logits), db = to_device(bias), dt = to_device(table),
                           dtok = to_device(tokens);
        RouteDeviceParams p{kExpert, kUsed, db.as<float>(), true, 1.5f};
        if (hash) p.hash_table = dt.as<int32_t>(), p.token = dtok.as<int32_t>(), p.hash_rows = 50;
        DeviceBuffer de(kTokens * kUsed * 4), dw = to_device(test::poison_floats(kTokens * kUsed));
        route_experts(dl.as<float>(), p, de.as<int32_t>(), dw.as<float>(), nullptr, kTokens);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto ge = to_host<int32_t>(de, kTokens * kUsed);
        const auto gw = to_host<float>(dw, kTokens * kUsed);
        DeviceBuffer e1(kUsed * 4), w1(kUsed * 4);
        for (int t = 0; t < kTokens; ++t) {
            RouteDeviceParams pt = p;
            if (hash) pt.token = dtok.as<int32_t>() + t;
            route_experts(dl.as<float>() + t * kExpert, pt, e1.as<int32_t>(), w1.as<float>(),
                          nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto we = to_host<int32_t>(e1, kUsed);
            const auto ww = to_host<float>(w1, kUsed);
            ASSERT_TRUE(std::equal(we.begin(), we.end(), ge.begin() + t * kUsed)) << "token " << t;
            ASSERT_TRUE(same_bits(
                ww, std::vector<float>(gw.begin() + t * kUsed, gw.begin() + (t + 1) * kUsed)))
                << "token " << t;
        }
    }
}

TEST(CudaBatchedGlue, SumSlotsOverTokensIsEachTokensSum) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kTokens = 5, kSlots = 6;
    constexpr int64_t kN = 4096 + 3;
    const auto o = random_floats(kTokens * kSlots * kN, 9, 4.0f);
    const auto sh = random_floats(kTokens * kN, 10, 4.0f);
    const DeviceBuffer d_o = to_device(o), d_s = to_device(sh);
    DeviceBuffer y = to_device(test::poison_floats(size_t(kTokens * kN))), y1(kN * 4);
    sum_slots(d_o.as<float>(), kSlots, kN, d_s.as<float>(), y.as<float>(), nullptr, kTokens);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(y, size_t(kTokens * kN));
    for (int t = 0; t < kTokens; ++t) {
        sum_slots(d_o.as<float>() + t * kSlots * kN, kSlots, kN, d_s.as<float>() + t * kN,
                  y1.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_TRUE(same_bits(to_host<float>(y1, kN),
                              std::vector<float>(got.begin() + t * kN, got.begin() + (t + 1) * kN)))
            << "token " << t;
    }
}

TEST(CudaBatchedGlue, HyperConnectionsOverTokensAreEachTokens) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kTokens = 6;
    constexpr int64_t kE = 4096 + 3;
    for (const int n : {4, 8}) {  // the one-launch kernel, and the two kernels of n^2 > 32
        const int n_mix = 2 * n + n * n;
        const auto mixes = random_floats(kTokens * n_mix, 11 + n, 4.0f);
        const auto base = random_floats(n_mix, 12, 1.0f);
        const std::vector<float> scale = {0.7f, 1.3f, 2.1f};
        const auto X = random_floats(kTokens * n * kE, 13, 10.0f);
        const auto y = random_floats(kTokens * kE, 14, 10.0f);
        const DeviceBuffer dm = to_device(mixes), ds = to_device(scale), db = to_device(base),
                           dy = to_device(y);
        // Batched: mix + combine, then post, over all tokens.
        DeviceBuffer mix = to_device(test::poison_floats(size_t(kTokens * n_mix)));
        DeviceBuffer x = to_device(test::poison_floats(size_t(kTokens * kE)));
        DeviceBuffer dX = to_device(X);
        float *pre = mix.as<float>();
        hc_mix_combine(dm.as<float>(), ds.as<float>(), db.as<float>(), n, 20, 1e-6f, pre, pre + n,
                       pre + 2 * n, dX.as<float>(), kE, x.as<float>(), nullptr, kTokens);
        hc_post(pre + n, pre + 2 * n, dy.as<float>(), n, kE, dX.as<float>(), nullptr, kTokens);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto g_mix = to_host<float>(mix, size_t(kTokens * n_mix));
        const auto g_x = to_host<float>(x, size_t(kTokens * kE));
        const auto g_X = to_host<float>(dX, X.size());
        // One token at a time.
        DeviceBuffer dX1 = to_device(X);
        DeviceBuffer mix1(size_t(n_mix) * 4), x1(kE * 4);
        for (int t = 0; t < kTokens; ++t) {
            float *p1 = mix1.as<float>();
            float *Xt = dX1.as<float>() + t * n * kE;
            hc_mix_combine(dm.as<float>() + t * n_mix, ds.as<float>(), db.as<float>(), n, 20, 1e-6f,
                           p1, p1 + n, p1 + 2 * n, Xt, kE, x1.as<float>(), nullptr);
            hc_post(p1 + n, p1 + 2 * n, dy.as<float>() + t * kE, n, kE, Xt, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            ASSERT_TRUE(same_bits(
                to_host<float>(mix1, size_t(n_mix)),
                std::vector<float>(g_mix.begin() + t * n_mix, g_mix.begin() + (t + 1) * n_mix)))
                << "mix, n " << n << " token " << t;
            ASSERT_TRUE(
                same_bits(to_host<float>(x1, kE),
                          std::vector<float>(g_x.begin() + t * kE, g_x.begin() + (t + 1) * kE)))
                << "combination, n " << n << " token " << t;
        }
        ASSERT_TRUE(same_bits(to_host<float>(dX1, X.size()), g_X)) << "streams after post, n " << n;
    }
}

// Device words of kTokens tokens, kWordStride apart: word 0 the position, then what a test puts.
constexpr int kTokens = 5;
constexpr int64_t kWordStride = 5;

TEST(CudaBatchedAttention, RowFinishOverTokensIsEachTokens) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kH = 8, kD = 512, kRot = 64, kTable = 12;
    const auto f =
        backend::cpu::RopeFreqs::yarn(uint32_t(kRot), 160000.0, 16.0, 65536.0, 32.0, 1.0);
    const DeviceBuffer freqs = to_device(f.f);
    // words: {position, table index}; token 2 stores nothing (index -1).
    std::vector<int64_t> words(kTokens * kWordStride, 0);
    for (int t = 0; t < kTokens; ++t) {
        words[size_t(t * kWordStride)] = 1000 + 37 * t;
        words[size_t(t * kWordStride + 1)] = t == 2 ? -1 : (7 * t) % kTable;
    }
    const DeviceBuffer dwords = to_device(words);
    const auto q = random_floats(kTokens * kH * kD, 61, 3.0f);
    const auto kv = random_floats(kTokens * kD, 62, 3.0f);
    const auto norm_w = random_floats(kD, 63, 1.0f);
    const DeviceBuffer dnorm = to_device(norm_w), dkv = to_device(kv);
    cuda::RowFinish fq;
    fq.d = kD;
    fq.eps = 1e-6f;
    fq.freqs = freqs.as<double>();
    fq.n_freq = kRot / 2;
    cuda::RowFinish fkv = fq;
    fkv.norm_w = dnorm.as<float>();
    fkv.rounding = RowRounding::Fp8;
    fkv.n_fp8 = kD - kRot;
    fkv.f16 = true;
    // Batched: all heads of all tokens; all tokens' KV rows into the table.
    DeviceBuffer qb = to_device(q), table_b = to_device(test::poison_floats(kTable * kD));
    fq.n_rows = kTokens * kH, fq.rows = fq.out = qb.as<float>(), fq.pos = dwords.as<int64_t>();
    fq.rows_per_token = kH, fq.word_stride = kWordStride;
    row_finish(fq, nullptr);
    fkv.n_rows = kTokens, fkv.rows = dkv.as<float>(), fkv.table = table_b.as<float>();
    fkv.pos = dwords.as<int64_t>(), fkv.index = dwords.as<int64_t>() + 1;
    fkv.rows_per_token = 1, fkv.word_stride = kWordStride;
    row_finish(fkv, nullptr);
    // One token at a time.
    DeviceBuffer q1 = to_device(q), table_1 = to_device(test::poison_floats(kTable * kD));
    for (int t = 0; t < kTokens; ++t) {
        cuda::RowFinish a = fq, b = fkv;
        a.n_rows = kH, a.rows = a.out = q1.as<float>() + t * kH * kD;
        a.pos = dwords.as<int64_t>() + t * kWordStride, a.rows_per_token = 0, a.word_stride = 0;
        row_finish(a, nullptr);
        b.n_rows = 1, b.rows = dkv.as<float>() + t * kD, b.table = table_1.as<float>();
        b.pos = a.pos, b.index = a.pos + 1, b.rows_per_token = 0, b.word_stride = 0;
        row_finish(b, nullptr);
    }
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_TRUE(same_bits(to_host<float>(qb, q.size()), to_host<float>(q1, q.size())));
    ASSERT_TRUE(
        same_bits(to_host<float>(table_b, kTable * kD), to_host<float>(table_1, kTable * kD)));
}

// kH heads of kD: 16 of 512 (the mix's batch takes whole heads, eight a warp), 13 of 128 (a
// quarter head a block, an odd head count: a warp's second head missing). kRaw0 raw rows and up
// to kTopK selected ones: with 80 and 60, up to 148 rows (three tiles of the batch's scores,
// five of its mix), and 13 or 72 heads (a warp's last heads missing; two tiles of 64 heads).
void check_batched_attention(int64_t kH, int64_t kD, int64_t kRaw0 = 10, int64_t kTopK = 6) {
    const int64_t kRing = 4 * kRaw0, kComp = std::max<int64_t>(30, 2 * kTopK),
                  kMaxRows = kRaw0 + 2 * (kTokens - 1) + kTopK;
    constexpr int64_t kRot = 64;
    const auto ring = random_floats(kRing * kD, 71, 2.0f),
               comp = random_floats(kComp * kD, 72, 2.0f);
    const auto q = random_floats(kTokens * kH * kD, 73, 0.2f);
    const auto sinks = random_floats(kH, 74, 1.0f);
    std::vector<int32_t> selected(kTokens * kTopK);
    for (size_t i = 0; i < selected.size(); ++i) selected[i] = int32_t((i * 11) % kComp);
    // words: {position, first, n_raw, n_sel, use_selected}; the row counts in their own words.
    std::vector<int64_t> words(kTokens * kWordStride), counts(kTokens * kWordStride, 0);
    for (int t = 0; t < kTokens; ++t) {
        const int64_t n_raw = kRaw0 + 2 * t, n_sel = t % 2 ? kTopK : 3;
        const int64_t w[5] = {500 + t, 30 + 3 * t, n_raw, n_sel, t % 2};
        std::copy(w, w + 5, words.begin() + t * kWordStride);
        counts[size_t(t * kWordStride)] = n_raw + n_sel;
    }
    const DeviceBuffer dring = to_device(ring), dcomp = to_device(comp), dq = to_device(q),
                       dsinks = to_device(sinks), dsel = to_device(selected),
                       dwords = to_device(words), dcounts = to_device(counts);
    const auto f = backend::cpu::RopeFreqs::plain(uint32_t(kRot), 10000.0);
    const DeviceBuffer freqs = to_device(f.f);
    const float scale = 0.044f;
    auto run = [&](int t0, int n, DeviceBuffer &rows, DeviceBuffer &scores, DeviceBuffer &o) {
        const int64_t *w = dwords.as<int64_t>() + t0 * kWordStride;
        const int64_t *c = dcounts.as<int64_t>() + t0 * kWordStride;
        gather_rows_step(dring.as<float>(), kRing, dcomp.as<float>(),
                         dsel.as<int32_t>() + t0 * kTopK, w + 1, kMaxRows, kD, rows.as<float>(),
                         nullptr, n, kWordStride, kTopK);
        const AttentionTokens tokens{n, kWordStride};
        attention_scores(dq.as<float>() + t0 * kH * kD, rows.as<float>(), kMaxRows, kH, kD,
                         scores.as<float>(), nullptr, c, tokens);
        attention_mix(scores.as<float>(), rows.as<float>(), kMaxRows, dsinks.as<float>(), scale, kH,
                      kD, o.as<float>(), nullptr, c, tokens);
        rope_tail(o.as<float>(), kH, kD, freqs.as<double>(), kRot / 2, w, true, nullptr, n,
                  kWordStride);
    };
    DeviceBuffer rows_b = to_device(test::poison_floats(kTokens * kMaxRows * kD)),
                 scores_b = to_device(test::poison_floats(kTokens * kMaxRows * kH)),
                 o_b = to_device(test::poison_floats(kTokens * kH * kD));
    run(0, kTokens, rows_b, scores_b, o_b);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto g_rows = to_host<float>(rows_b, kTokens * kMaxRows * kD);
    const auto g_o = to_host<float>(o_b, kTokens * kH * kD);
    const auto g_scores = to_host<float>(scores_b, kTokens * kMaxRows * kH);
    for (int t = 0; t < kTokens; ++t) {
        DeviceBuffer rows = to_device(test::poison_floats(kMaxRows * kD)),
                     scores = to_device(test::poison_floats(kMaxRows * kH)),
                     o = to_device(test::poison_floats(kH * kD));
        run(t, 1, rows, scores, o);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const int64_t n = counts[size_t(t * kWordStride)];
        auto slice = [](const std::vector<float> &v, int64_t at, int64_t len) {
            return std::vector<float>(v.begin() + at, v.begin() + at + len);
        };
        ASSERT_TRUE(same_bits(slice(to_host<float>(rows, kMaxRows * kD), 0, n * kD),
                              slice(g_rows, t * kMaxRows * kD, n * kD)))
            << "rows of token " << t;
        ASSERT_TRUE(same_bits(slice(to_host<float>(scores, kMaxRows * kH), 0, n * kH),
                              slice(g_scores, t * kMaxRows * kH, n * kH)))
            << "scores of token " << t;
        const auto o1 = to_host<float>(o, kH * kD);
        for (float v : o1) ASSERT_FALSE(std::isnan(v)) << "token " << t;
        ASSERT_TRUE(same_bits(o1, slice(g_o, t * kH * kD, kH * kD)))
            << "output of token " << t << ", " << kH << " heads of " << kD;
    }
}

TEST(CudaBatchedAttention, GatherScoresMixRopeOverTokensAreEachTokens) {
    DS4_REQUIRE_CUDA_DEVICE();
    check_batched_attention(16, 512);
    check_batched_attention(13, 128);
    check_batched_attention(13, 512, 80, 60);
    check_batched_attention(72, 512, 80, 60);
}

TEST(CudaBatchedAttention, IndexerScoresAndTopKOverTokensAreEachTokens) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int kHeads = 8, kDim = 64;
    constexpr int64_t kRows = 300, kK = 16;
    const auto q = random_floats(kTokens * kHeads * kDim, 81, 1.0f);
    const auto w = random_floats(kTokens * kHeads, 82, 1.0f);
    const auto rows = random_floats(kRows * kDim, 83, 1.0f);
    // counts: below k (nothing selected), k, and above.
    const int64_t count[kTokens] = {9, kK, 100, 250, kRows};
    std::vector<int64_t> words(kTokens * kWordStride, 0);
    for (int t = 0; t < kTokens; ++t) words[size_t(t * kWordStride)] = count[t];
    const DeviceBuffer dq = to_device(q), dw = to_device(w), drows = to_device(rows),
                       dwords = to_device(words);
    const std::vector<int32_t> unset(kTokens * kK, -7);
    DeviceBuffer scores_b = to_device(test::poison_floats(kTokens * kRows)),
                 sel_b = to_device(unset);
    const IndexerTokens tokens{kTokens, kWordStride};
    indexer_scores(dq.as<float>(), dw.as<float>(), 0.3f, drows.as<float>(), kRows, kHeads, kDim,
                   scores_b.as<float>(), nullptr, dwords.as<int64_t>(), tokens);
    top_k_ascending(scores_b.as<float>(), kRows, kK, sel_b.as<int32_t>(), nullptr, nullptr,
                    dwords.as<int64_t>(), tokens);
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    const auto g_scores = to_host<float>(scores_b, kTokens * kRows);
    const auto g_sel = to_host<int32_t>(sel_b, kTokens * kK);
    for (int t = 0; t < kTokens; ++t) {
        DeviceBuffer scores = to_device(test::poison_floats(kRows)),
                     sel = to_device(std::vector<int32_t>(kK, -7));
        const int64_t *c = dwords.as<int64_t>() + t * kWordStride;
        indexer_scores(dq.as<float>() + t * kHeads * kDim, dw.as<float>() + t * kHeads, 0.3f,
                       drows.as<float>(), kRows, kHeads, kDim, scores.as<float>(), nullptr, c);
        top_k_ascending(scores.as<float>(), kRows, kK, sel.as<int32_t>(), nullptr, nullptr, c);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto s1 = to_host<float>(scores, size_t(count[t]));
        ASSERT_TRUE(same_bits(s1, std::vector<float>(g_scores.begin() + t * kRows,
                                                     g_scores.begin() + t * kRows + count[t])))
            << "scores of token " << t;
        const auto k1 = to_host<int32_t>(sel, kK);
        ASSERT_TRUE(std::equal(k1.begin(), k1.end(), g_sel.begin() + t * kK))
            << "selection of token " << t;
    }
}

TEST(CudaBatchedAttention, CompressorOverTokensIsTokenByToken) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kD = 128, kRot = 64, kTable = 16;
    const auto f =
        backend::cpu::RopeFreqs::yarn(uint32_t(kRot), 160000.0, 16.0, 65536.0, 32.0, 1.0);
    const DeviceBuffer freqs = to_device(f.f);
    const auto norm_w = random_floats(kD, 91, 1.0f);
    const DeviceBuffer dnorm = to_device(norm_w);
    // (first position, tokens): mid-window starts, a start at phase 0 of ratio 4, a batch
    // shorter than a window (ratio 16: no completion), one that completes nothing at all, starts
    // at phase r - 1 (token 0 completes a window: ratio 4 from 3, ratio 16 from 15).
    for (const auto &[kP0, kTokens] :
         {std::pair<int64_t, int64_t>{5, 23}, {8, 23}, {5, 3}, {1, 2}, {3, 5}, {15, 18}})
        for (const auto &[ratio, overlap] : {std::pair{4, true}, std::pair{16, false}}) {
            const int64_t width = overlap ? 2 * kD : kD, rows = overlap ? 2 * ratio : ratio;
            const auto kv = random_floats(kTokens * width, 92 + ratio, 2.0f);
            const auto score = random_floats(kTokens * width, 93 + ratio, 2.0f);
            const auto ape = random_floats(ratio * width, 94 + ratio, 0.5f);
            // A window state already part-filled (the batch starts at position kP0).
            auto state_kv0 = random_floats(rows * width, 95, 2.0f);
            auto state_score0 = random_floats(rows * width, 96, 2.0f);
            for (int64_t i = 0; i < width; ++i)
                state_score0[size_t(i)] = -INFINITY;  // a row unwritten
            // words per token: {phase, completes (row index or -1), pooled row position}
            std::vector<int64_t> words(kTokens * kWordStride, 0);
            for (int64_t t = 0; t < kTokens; ++t) {
                const int64_t p = kP0 + t;
                words[size_t(t * kWordStride)] = p % ratio;
                words[size_t(t * kWordStride + 1)] =
                    (p + 1) % ratio == 0 ? ((p + 1) / ratio - 1) : -1;
                words[size_t(t * kWordStride + 2)] = p + 1 - ratio;
            }
            const DeviceBuffer dkv = to_device(kv), dscore = to_device(score),
                               dape = to_device(ape), dwords = to_device(words);
            cuda::RowFinish base;
            base.d = kD;
            base.norm_w = dnorm.as<float>();
            base.eps = 1e-6f;
            base.freqs = freqs.as<double>();
            base.n_freq = kRot / 2;
            base.rounding = RowRounding::Fp8;
            base.n_fp8 = kD - kRot;
            base.f16 = true;
            // Token by token.
            DeviceBuffer skv1 = to_device(state_kv0), ssc1 = to_device(state_score0),
                         table1 = to_device(test::poison_floats(kTable * kD));
            for (int64_t t = 0; t < kTokens; ++t) {
                const int64_t *w = dwords.as<int64_t>() + t * kWordStride;
                compressor_push_step(dkv.as<float>() + t * width, dscore.as<float>() + t * width,
                                     dape.as<float>(), width, w, overlap ? ratio : 0,
                                     skv1.as<float>(), ssc1.as<float>(), nullptr);
                cuda::RowFinish r = base;
                r.state_kv = skv1.as<float>(), r.state_score = ssc1.as<float>();
                r.ratio = ratio, r.overlap = overlap, r.width = width;
                r.pos = w + 2, r.index = w + 1, r.table = table1.as<float>();
                row_finish(r, nullptr);
                if (overlap)
                    compressor_shift_if(skv1.as<float>(), ssc1.as<float>(), ratio, width, w + 1,
                                        nullptr);
            }
            // The batch.
            DeviceBuffer skv2 = to_device(state_kv0), ssc2 = to_device(state_score0),
                         table2 = to_device(test::poison_floats(kTable * kD)),
                         pooled = to_device(test::poison_floats(kTokens * kD));
            compressor_batch(dkv.as<float>(), dscore.as<float>(), dape.as<float>(), kD, width,
                             ratio, overlap, overlap ? ratio : 0, dwords.as<int64_t>(),
                             int(kTokens), skv2.as<float>(), ssc2.as<float>(), pooled.as<float>(),
                             nullptr);
            const int64_t first = (ratio - (kP0 + 1) % ratio) % ratio;
            cuda::RowFinish r = base;
            r.rows = pooled.as<float>();
            r.n_rows = first < kTokens ? (kTokens - 1 - first) / ratio + 1 : 0;
            r.pos = dwords.as<int64_t>() + first * kWordStride + 2;
            r.index = dwords.as<int64_t>() + first * kWordStride + 1;
            r.rows_per_token = 1, r.word_stride = ratio * kWordStride, r.table = table2.as<float>();
            row_finish(r, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const size_t n_state = size_t(rows * width);
            ASSERT_TRUE(same_bits(to_host<float>(skv1, n_state), to_host<float>(skv2, n_state)))
                << "window values, ratio " << ratio << ", from " << kP0 << ", " << kTokens
                << " tokens";
            ASSERT_TRUE(same_bits(to_host<float>(ssc1, n_state), to_host<float>(ssc2, n_state)))
                << "window scores, ratio " << ratio << ", from " << kP0 << ", " << kTokens
                << " tokens";
            ASSERT_TRUE(
                same_bits(to_host<float>(table1, kTable * kD), to_host<float>(table2, kTable * kD)))
                << "pooled rows, ratio " << ratio << ", from " << kP0 << ", " << kTokens
                << " tokens";
        }
}

}  // namespace
}  // namespace ds4::cuda
