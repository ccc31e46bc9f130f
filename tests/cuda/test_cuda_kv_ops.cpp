// The attention KV-state kernels (kv_ops.h) against their CPU twins:
//   - store_row: bit for bit runtime::RowStore's set then get. f16 rows: quant::ref's rounding
//     (ties to even, 65520 and above to inf, NaN quieted with its payload's top bits, f16 and f32
//     subnormals, -0) over random values, random bit patterns and the edge cases; f32 rows: the
//     row itself;
//   - gather_rows: bit for bit attention_batch's visible rows, the ring wrapping around, with
//     selected ids (in any order, repeated) and without;
//   - compressor_push, compressor_pool, compressor_shift: a stream of tokens into a CPU window
//     state (runtime::CompressorState, filled as runtime/compressor.cpp fills it) and a device
//     one; the states equal bit for bit after every push and shift, and every pooled row (and
//     the pool of random states with unwritten rows) is within 4 ulps of
//     backend/cpu/compressor_pool. The 4 ulps are exp's: the device rounds a double exp to f32,
//     the CPU calls f32 libm (within an ulp of each other), and an e_i off by an ulp moves num and
//     den by an ulp of that term. Where num cancels (signed values), an ulp of a term is many
//     ulps of the result, so the bound there is 4 ulps of the terms' scale, sum e_i |v_i| / den.
//     A column whose every candidate is -inf pools +0 exactly, on both.
// Outputs are filled with NaN before each kernel, so a value never written does not pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/compressor_pool.h"
#include "backend/cuda/kv_ops.h"
#include "cuda_test_util.h"
#include "runtime/kv_cache.h"

namespace ds4::cuda {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;
using test::ulps;

constexpr uint32_t kPoison = 0xffffffffu;  // the NaN that cudaMemset(0xff) writes

void poison(float *dst, int64_t n) {
    DS4_CUDA_CHECK(cudaMemset(dst, 0xff, size_t(n) * sizeof(float)));
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first index where the bits differ, for the failure message.
size_t first_difference(const std::vector<float> &a, const std::vector<float> &b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return i;
    return std::min(a.size(), b.size());
}

// Values for store_row: random over and past the f16 range, near its subnormals, random bit
// patterns (every class of f32, NaN payloads included), and the edge cases by name.
std::vector<float> store_row_values() {
    std::vector<float> v;
    for (const auto &part : {random_floats(4096, 5, 70000.0f), random_floats(2048, 6, 1e-4f),
                             random_floats(2048, 7, 1e-7f), random_floats(2048, 8, 2.0f)})
        v.insert(v.end(), part.begin(), part.end());
    std::mt19937 rng(11);
    for (int i = 0; i < 8192; ++i) v.push_back(std::bit_cast<float>(uint32_t(rng())));
    const uint32_t nan_bits[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                 0x7fbfffffu, 0x7fffe000u, 0x7f802000u, 0x7f801fffu,
                                 0x7fd55555u, 0xffaaaaaau, 0x7fffffffu};
    for (const uint32_t b : nan_bits) v.push_back(std::bit_cast<float>(b));
    const float inf = std::numeric_limits<float>::infinity();
    const float below_65520 = std::nextafter(65520.0f, 0.0f),
                below_normal = std::nextafter(0x1p-14f, 0.0f),
                above_half_sub = std::nextafter(0x1p-25f, 1.0f),
                below_half_sub = std::nextafter(0x1p-25f, 0.0f);
    // Each with its negative (-0 with 0). Overflow: 65504 the largest f16, 65520 (half an ulp
    // past it) the first value to round to inf. Underflow: 2^-14 the smallest normal f16, 2^-24
    // the smallest subnormal, 2^-25 a tie to 0, 1.5 and 2.5 times 2^-24 (0x1.8p-24, 0x1.4p-23) ties
    // to even, below 2^-25 (f32 subnormals too) 0. Normal ties: 1 + 2^-11 (0x1.002p0) rounds down
    // to even, 1 + 3 2^-11 (0x1.006p0) up.
    const std::vector<float> named = {
        inf,        65504.0f,   65520.0f,       below_65520,
        65536.0f,   65505.0f,   65519.0f,       1e30f,
        FLT_MAX,    0x1p-14f,   below_normal,   0x1.ffcp-15f /* 2^-14 - 2^-25 */,
        0x1p-24f,   0x1p-25f,   above_half_sub, below_half_sub,
        0x1.8p-24f, 0x1.4p-23f, 0x1p-26f,       FLT_MIN,
        1e-40f,     0x1p-149f,  0.0f,           1.0f,
        0x1.002p0f, 0x1.006p0f, 2047.5f,        2049.0f,
        0.1f,       3.14159265f};
    for (const float x : named) v.push_back(x), v.push_back(-x);
    for (float &x : v)  // keep the poison out of the inputs, so that it always fails
        if (std::bit_cast<uint32_t>(x) == kPoison) x = 0.0f;
    return v;
}

TEST(CudaKvOps, StoreRowEqualsRowStoreBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    const std::vector<float> x = store_row_values();
    const int64_t n = int64_t(x.size());
    const DeviceBuffer dx = to_device(x);
    DeviceBuffer dst(size_t(n) * sizeof(float));
    for (const bool f16 : {true, false}) {
        runtime::RowStore store(uint32_t(n), f16, 1);
        store.set(0, x.data());
        std::vector<float> want(x.size());
        store.get(0, want.data());
        poison(dst.as<float>(), n);
        store_row(dx.as<float>(), n, f16, dst.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dst, x.size());
        const size_t i = first_difference(got, want);
        ASSERT_TRUE(same_bits(got, want))
            << (f16 ? "f16" : "f32") << " rows: value " << i << " (bits " << std::hex
            << std::bit_cast<uint32_t>(x[i]) << "): got " << std::bit_cast<uint32_t>(got[i])
            << ", RowStore " << std::bit_cast<uint32_t>(want[i]);
    }
}

TEST(CudaKvOps, GatherRowsBitForBit) {
    DS4_REQUIRE_CUDA_DEVICE();
    constexpr int64_t kWindow = 128, kComp = 40;
    struct Case {
        int64_t first, n_raw;
        bool use_selected;
        int64_t n_comp;  // comp rows visible (all of them without ids)
    };
    const Case cases[] = {{0, 1, false, 0},         {0, 1, true, 25}, {0, 128, false, kComp},
                          {300, 128, true, 25},  // wraps: slots 44..127, then 0..43
                          {200, 100, false, kComp}, {5, 60, true, 0}, {130, 128, false, 0},
                          {127, 2, true, 1}};
    std::mt19937 rng(3);
    std::vector<int32_t> ids(25);
    for (int32_t &id : ids) id = int32_t(rng() % kComp);
    ids[1] = ids[2];  // a repeat
    ids[3] = kComp - 1;
    const DeviceBuffer dids = to_device(ids);
    for (const int64_t d : {int64_t(512), int64_t(96), int64_t(7)}) {
        const auto ring = random_floats(kWindow * d, 13 + d, 3.0f),
                   comp = random_floats(kComp * d, 17 + d, 3.0f);
        const DeviceBuffer dring = to_device(ring), dcomp = to_device(comp);
        for (const Case &c : cases) {
            const int64_t n_sel = c.use_selected ? std::min<int64_t>(c.n_comp, 25) : c.n_comp;
            const int64_t n_rows = c.n_raw + n_sel;
            // attention_batch's visible rows: the window oldest first, then the compressed rows.
            std::vector<float> want(size_t(n_rows * d));
            for (int64_t i = 0; i < c.n_raw; ++i)
                std::copy_n(ring.begin() + ((c.first + i) % kWindow) * d, d, want.begin() + i * d);
            for (int64_t j = 0; j < n_sel; ++j)
                std::copy_n(comp.begin() + (c.use_selected ? ids[size_t(j)] : j) * d, d,
                            want.begin() + (c.n_raw + j) * d);
            DeviceBuffer out(size_t(n_rows * d) * sizeof(float));
            poison(out.as<float>(), n_rows * d);
            gather_rows(dring.as<float>(), kWindow, c.first, c.n_raw, dcomp.as<float>(),
                        c.use_selected ? dids.as<int32_t>() : nullptr, n_sel, d, out.as<float>(),
                        nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = to_host<float>(out, want.size());
            ASSERT_TRUE(same_bits(got, want))
                << "d " << d << " first " << c.first << " n_raw " << c.n_raw << " n_sel " << n_sel
                << (c.use_selected ? " (ids)" : "") << ": value " << first_difference(got, want);
        }
    }
}

struct PoolCase {
    int ratio;
    bool overlap;
    int64_t d;
};

// How gtest prints a case (the test list that CTest reads names each case by it).
void PrintTo(const PoolCase &c, std::ostream *os) {
    *os << "ratio " << c.ratio << (c.overlap ? " overlapped" : "") << ", " << c.d << " columns";
}

// Pooled values against the CPU's: +0 exactly where every candidate is -inf, else within 4 ulps
// (or, where num cancels, 4 ulps of sum e_i |v_i| / den), NaN never. Counts the dead columns.
void expect_pooled_close(const std::vector<float> &kv, const std::vector<float> &score,
                         const PoolCase &c, int64_t width, const std::vector<float> &want,
                         const std::vector<float> &got, int *dead, const std::string &what) {
    const int r = c.ratio, n = c.overlap ? 2 * r : r;
    for (int64_t j = 0; j < c.d; ++j) {
        const auto at = [&](int i) {
            return size_t(int64_t(i) * width + (c.overlap && i >= r ? c.d + j : j));
        };
        float mx = -INFINITY;
        for (int i = 0; i < n; ++i) mx = std::max(mx, score[at(i)]);
        const float g = got[size_t(j)], w = want[size_t(j)];
        if (mx == -INFINITY) {
            ++*dead;
            ASSERT_EQ(std::bit_cast<uint32_t>(w), 0u) << what << ": CPU column " << j;
            ASSERT_EQ(std::bit_cast<uint32_t>(g), 0u) << what << ": column " << j << " got " << g;
            continue;
        }
        ASSERT_FALSE(std::isnan(g)) << what << ": column " << j << " not written";
        double den = 0, terms = 0;
        for (int i = 0; i < n; ++i) {
            const double e = std::exp(double(score[at(i)]) - double(mx));
            den += e;
            terms += e * std::fabs(double(kv[at(i)]));
        }
        const double scale = terms / den;
        const double bound = 4 * std::max(std::fabs(double(std::nextafter(w, INFINITY)) - w),
                                          double(FLT_EPSILON) * scale);
        ASSERT_LE(std::fabs(double(g) - double(w)), bound)
            << what << ": column " << j << " got " << g << ", CPU " << w << " (" << ulps(g, w)
            << " ulps; terms' scale " << scale << ")";
    }
}

class CudaCompressor : public ::testing::TestWithParam<PoolCase> {};

// The device state downloaded and compared with the CPU's bit for bit.
void expect_state_equal(const runtime::CompressorState &st, const DeviceBuffer &dkv,
                        const DeviceBuffer &dsc, const std::string &what) {
    const auto kv = to_host<float>(dkv, st.kv.size()), sc = to_host<float>(dsc, st.score.size());
    ASSERT_TRUE(same_bits(kv, st.kv)) << what << ": kv value " << first_difference(kv, st.kv);
    ASSERT_TRUE(same_bits(sc, st.score))
        << what << ": score value " << first_difference(sc, st.score);
}

TEST_P(CudaCompressor, PushPoolShiftEqualCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const PoolCase c = GetParam();
    const int r = c.ratio;
    const int64_t d = c.d, coff = c.overlap ? 2 : 1, W = coff * d;
    runtime::CompressorState st;  // kv 0, score -inf: every row unwritten
    st.init(uint32_t(coff * r), uint32_t(W));
    DeviceBuffer dkv = to_device(st.kv), dsc = to_device(st.score);
    const auto ape = random_floats(r * W, 401 + r + d, 1.0f);  // [ratio][W]
    const DeviceBuffer dape = to_device(ape);
    DeviceBuffer dpooled(size_t(d) * sizeof(float));
    // One column dead for a whole window: the first (its previous half still unwritten) when
    // overlapped, else the second.
    const int64_t dead_window = c.overlap ? 0 : 1, dead_col = 7;
    int dead = 0;
    constexpr int64_t kWindows = 3;
    for (int64_t p = 0; p < kWindows * r; ++p) {
        const std::string at = "p " + std::to_string(p);
        const auto kv = random_floats(W, 1000 + p, 2.0f);
        auto sc = random_floats(W, 5000 + p, 4.0f);
        for (int64_t j = p % 13; j < W; j += 13) sc[size_t(j)] = -INFINITY;  // scattered
        if (p / r == dead_window) sc[size_t((c.overlap ? d : 0) + dead_col)] = -INFINITY;
        const int64_t phase = p % r, slot = c.overlap ? r + phase : phase;
        // runtime/compressor.cpp compressor_push's store.
        std::copy(kv.begin(), kv.end(), st.kv.begin() + slot * W);
        for (int64_t j = 0; j < W; ++j)
            st.score[size_t(slot * W + j)] = sc[size_t(j)] + ape[size_t(phase * W + j)];

        const DeviceBuffer dkin = to_device(kv), dsin = to_device(sc);
        poison(dkv.as<float>() + slot * W, W);
        poison(dsc.as<float>() + slot * W, W);
        compressor_push(dkin.as<float>(), dsin.as<float>(), dape.as<float>() + phase * W, W, slot,
                        dkv.as<float>(), dsc.as<float>(), nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        ASSERT_NO_FATAL_FAILURE(expect_state_equal(st, dkv, dsc, "push " + at));
        if ((p + 1) % r != 0) continue;

        std::vector<float> want(static_cast<size_t>(d));
        backend::cpu::compressor_pool(st.kv.data(), st.score.data(), uint32_t(r), c.overlap,
                                      uint32_t(d), uint32_t(W), want.data());
        poison(dpooled.as<float>(), d);
        compressor_pool(dkv.as<float>(), dsc.as<float>(), r, c.overlap, d, W, dpooled.as<float>(),
                        nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dpooled, size_t(d));
        ASSERT_NO_FATAL_FAILURE(
            expect_pooled_close(st.kv, st.score, c, W, want, got, &dead, "pool " + at));

        if (c.overlap) {  // runtime/compressor.cpp's roll of the window
            std::copy(st.kv.begin() + r * W, st.kv.begin() + 2 * r * W, st.kv.begin());
            std::copy(st.score.begin() + r * W, st.score.begin() + 2 * r * W, st.score.begin());
            poison(dkv.as<float>(), r * W);
            poison(dsc.as<float>(), r * W);
            compressor_shift(dkv.as<float>(), dsc.as<float>(), r, W, nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            ASSERT_NO_FATAL_FAILURE(expect_state_equal(st, dkv, dsc, "shift " + at));
        }
    }
    EXPECT_EQ(dead, 1) << "the dead column's window was not pooled as dead";
}

TEST_P(CudaCompressor, PoolOfRandomStatesEqualsCpu) {
    DS4_REQUIRE_CUDA_DEVICE();
    const PoolCase c = GetParam();
    const int r = c.ratio;
    const int64_t d = c.d, coff = c.overlap ? 2 : 1, W = coff * d, rows = coff * r;
    DeviceBuffer dpooled(size_t(d) * sizeof(float));
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        auto kv = random_floats(rows * W, 700 + seed, 3.0f);
        auto score = random_floats(rows * W, 800 + seed, 6.0f);
        // Two unwritten rows (as CompressorState::init leaves them), one dead column, and one
        // column with a single finite candidate.
        for (const int64_t row : {int64_t(seed % rows), int64_t((3 * seed + 1) % rows)})
            for (int64_t j = 0; j < W; ++j)
                kv[size_t(row * W + j)] = 0.0f, score[size_t(row * W + j)] = -INFINITY;
        for (int64_t i = 0; i < rows; ++i) {
            score[size_t(i * W + (c.overlap && i >= r ? d : 0) + 3)] = -INFINITY;
            if (i != int64_t(seed + 2) % rows)
                score[size_t(i * W + (c.overlap && i >= r ? d : 0) + 4)] = -INFINITY;
        }
        std::vector<float> want(static_cast<size_t>(d));
        backend::cpu::compressor_pool(kv.data(), score.data(), uint32_t(r), c.overlap, uint32_t(d),
                                      uint32_t(W), want.data());
        const DeviceBuffer dkv = to_device(kv), dsc = to_device(score);
        poison(dpooled.as<float>(), d);
        compressor_pool(dkv.as<float>(), dsc.as<float>(), r, c.overlap, d, W, dpooled.as<float>(),
                        nullptr);
        DS4_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dpooled, size_t(d));
        int dead = 0;
        ASSERT_NO_FATAL_FAILURE(
            expect_pooled_close(kv, score, c, W, want, got, &dead, "seed " + std::to_string(seed)));
        EXPECT_GE(dead, 1) << "seed " << seed;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCompressor,
                         ::testing::Values(PoolCase{4, true, 512}, PoolCase{4, true, 128},
                                           PoolCase{128, false, 512}),
                         [](const auto &info) {
                             return "ratio" + std::to_string(info.param.ratio) +
                                    (info.param.overlap ? "_overlap_" : "_") + "d" +
                                    std::to_string(info.param.d);
                         });

}  // namespace
}  // namespace ds4::cuda
