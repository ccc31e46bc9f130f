// matvec / matmul over every supported weight format against an f64 oracle.
//
// The oracle dequantizes the weights and the activation exactly as the kernel sees it (after
// the activation quantization of the format's vec_dot_type), then sums in double; the bound is
// 1e-5 of sum |w x| per output, so the check isolates the matrix product from the activation
// rounding. Row counts do not divide into the chunks, thread counts include odd ones, every
// output is fenced by guard values, and the results must not depend on the thread count.
// matmul must equal m matvecs bit for bit: each output is the same vec_dot call on the same
// bytes (matmul.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/activations.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "common/error.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::backend::cpu {
namespace {

constexpr GgmlType kWeightTypes[] = {GgmlType::F32,     GgmlType::F16,  GgmlType::BF16,
                                     GgmlType::Q8_0,    GgmlType::Q2_K, GgmlType::Q4_K,
                                     GgmlType::IQ2_XXS, GgmlType::MXFP4};
constexpr int kThreadCounts[] = {1, 2, 3, 5};
constexpr float kGuard = -12345.678f;
constexpr int64_t kGuardCount = 16;

ThreadPool &pool_of(int n_threads) {
    static std::map<int, std::unique_ptr<ThreadPool>> pools;
    auto &pool = pools[n_threads];
    if (!pool) pool = std::make_unique<ThreadPool>(n_threads);
    return *pool;
}

std::vector<float> random_floats(int64_t n, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    quant::fill_random_blocks(GgmlType::F32, v.data(), n, seed, 2.0f);
    return v;
}

std::vector<uint8_t> random_weights(GgmlType type, int64_t n_rows, int64_t k, uint64_t seed) {
    return quant::random_blocks(type, n_rows * k, seed);
}

// The activation row as the kernel sees it: quantized to vec_dot_type and back.
std::vector<float> activation_as_seen(GgmlType weight_type, const float *x, int64_t k) {
    const GgmlType act = quant::kernels(weight_type).vec_dot_type;
    if (act == GgmlType::F32) return {x, x + k};
    std::vector<uint8_t> q(quant::row_size(act, k));
    quant::kernels(act).quantize_activation_row(x, q.data(), k);
    std::vector<float> seen(static_cast<size_t>(k));
    quant::dequantize_row(act, q.data(), seen.data(), k);
    return seen;
}

struct Reference {
    std::vector<double> y;        // sum_k w x in f64
    std::vector<double> abs_sum;  // sum_k |w x|: the scale of the rounding error
};

Reference reference_matvec(GgmlType type, const uint8_t *w, int64_t n_rows, int64_t k,
                           size_t row_stride, const float *x) {
    const std::vector<float> xs = activation_as_seen(type, x, k);
    std::vector<float> row(static_cast<size_t>(k));
    Reference ref{std::vector<double>(n_rows), std::vector<double>(n_rows)};
    for (int64_t r = 0; r < n_rows; ++r) {
        quant::dequantize_row(type, w + r * row_stride, row.data(), k);
        double sum = 0, abs_sum = 0;
        for (int64_t i = 0; i < k; ++i) {
            const double p = static_cast<double>(row[i]) * xs[i];
            sum += p;
            abs_sum += std::fabs(p);
        }
        ref.y[r] = sum;
        ref.abs_sum[r] = abs_sum;
    }
    return ref;
}

void expect_close_to_reference(const Reference &ref, const float *y, int64_t n_rows,
                               const std::string &what) {
    int bad = 0;
    for (int64_t r = 0; r < n_rows && bad < 5; ++r) {
        const double err = std::fabs(static_cast<double>(y[r]) - ref.y[r]);
        if (!(err <= 1e-5 * ref.abs_sum[r])) {
            ADD_FAILURE() << what << " row " << r << ": got " << y[r] << ", f64 reference "
                          << ref.y[r] << ", |error| " << err << " > 1e-5 * " << ref.abs_sum[r];
            ++bad;
        }
    }
}

// An output buffer with guard values after the n used floats.
struct Fenced {
    std::vector<float> buf;
    int64_t n;
    explicit Fenced(int64_t n_) : buf(static_cast<size_t>(n_ + kGuardCount), kGuard), n(n_) {}
    float *data() { return buf.data(); }
    bool guards_intact() const {
        for (int64_t i = n; i < n + kGuardCount; ++i)
            if (std::memcmp(&buf[i], &kGuard, sizeof(float)) != 0) return false;
        return true;
    }
};

bool same_bits(const float *a, const float *b, int64_t n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

std::string name_of(GgmlType t) {
    return std::string(ggml_type_name(t));
}

class MatmulByType : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatmulByType, MatvecMatchesReferenceForAnyThreadCount) {
    const GgmlType type = GetParam();
    struct Shape {
        int64_t n_rows, k;
    };
    // 1003 rows split into several uneven chunks for every format; k = 4096 is the model's.
    for (const Shape s : {Shape{1, 768}, Shape{97, 768}, Shape{1003, 768}, Shape{97, 4096}}) {
        const auto w = random_weights(type, s.n_rows, s.k, 1000 + s.n_rows);
        const auto x = random_floats(s.k, 7 + s.k);
        const size_t stride = quant::row_size(type, s.k);
        const Reference ref = reference_matvec(type, w.data(), s.n_rows, s.k, stride, x.data());
        std::vector<float> first;
        for (int threads : kThreadCounts) {
            const std::string what = name_of(type) + " " + std::to_string(s.n_rows) + "x" +
                                     std::to_string(s.k) + ", " + std::to_string(threads) +
                                     " threads";
            ScratchBuffer scratch;
            Fenced y(s.n_rows);
            matvec(pool_of(threads), scratch, type, w.data(), s.n_rows, s.k, x.data(), y.data());
            EXPECT_TRUE(y.guards_intact()) << what;
            expect_close_to_reference(ref, y.data(), s.n_rows, what);
            if (first.empty())
                first.assign(y.buf.begin(), y.buf.begin() + s.n_rows);
            else
                EXPECT_TRUE(same_bits(first.data(), y.data(), s.n_rows))
                    << what << ": result differs from the 1-thread result";
        }
    }
}

// Also where the multi-row dots (quant.h VecDotMultiFn) take over: m above their pass of 32 rows,
// rows of 17 super-blocks (more than an IQ2_XXS unpack chunk of 16, an odd count of IQ2_XXS
// pairs), for the 32-value formats rows of 25 and 49 blocks (an odd last Q8_0 block), and for
// the float formats a row whose length leaves an 8-value step and a masked tail after the
// 32-value steps (and spans of 256 values converted once).
TEST_P(MatmulByType, MatmulEqualsMatvecsBitForBit) {
    const GgmlType type = GetParam();
    std::vector<std::pair<int64_t, int64_t>> shapes = {{97, 768}, {1003, 768}, {61, 17 * 256}};
    if (ggml_type_info(type).block_elems <= 32) {
        shapes.push_back({45, 25 * 32});
        shapes.push_back({23, 49 * 32});
    }
    if (ggml_type_info(type).block_elems == 1) shapes.push_back({19, 1003});  // 31 x 32 + 8 + 3
    for (auto [n_rows, k] : shapes) {
        const auto w = random_weights(type, n_rows, k, 2000 + n_rows);
        for (int64_t m : {2, 5, 17, 40}) {
            const auto X = random_floats(m * k, 300 + m);
            std::vector<float> expected(static_cast<size_t>(m * n_rows));
            ScratchBuffer scratch;
            for (int64_t j = 0; j < m; ++j)
                matvec(pool_of(2), scratch, type, w.data(), n_rows, k, X.data() + j * k,
                       expected.data() + j * n_rows);
            for (int threads : {1, 3, 5}) {
                const std::string what = name_of(type) + " " + std::to_string(n_rows) +
                                         " rows, m = " + std::to_string(m) + ", " +
                                         std::to_string(threads) + " threads";
                Fenced Y(m * n_rows);
                matmul(pool_of(threads), scratch, type, w.data(), n_rows, k, X.data(), m, Y.data());
                EXPECT_TRUE(Y.guards_intact()) << what;
                EXPECT_TRUE(same_bits(expected.data(), Y.data(), m * n_rows)) << what;
            }
        }
    }
}

// Q8_0's dot has one fixed order of float operations (quant/q8_0.cpp), so every path through
// matvec and matmul (the row kernel with the activation tables for 1 and 2 rows, the 16-row
// panels for more) gives the scalar reference's float bit for bit, whatever the level: rows that
// leave a partial panel, lengths with a partial group of 8 and of 16 blocks.
TEST(MatmulQ8_0, EveryPathEqualsTheReferenceDot) {
    for (auto [n_rows, k] : std::vector<std::pair<int64_t, int64_t>>{
             {37, 25 * 32}, {16, 128 * 32}, {21, 136 * 32}, {3, 32}}) {
        const auto w = random_weights(GgmlType::Q8_0, n_rows, k, 700 + n_rows);
        const size_t row_bytes = quant::row_size(GgmlType::Q8_0, k);
        for (int64_t m : {1, 2, 3, 9}) {
            const auto X = random_floats(m * k, 900 + m);
            std::vector<uint8_t> xq(row_bytes);
            std::vector<float> expected(static_cast<size_t>(m * n_rows));
            for (int64_t j = 0; j < m; ++j) {
                quant::ref::quantize_row_q8_0_activation(X.data() + j * k, xq.data(), k);
                for (int64_t r = 0; r < n_rows; ++r)
                    expected[static_cast<size_t>(j * n_rows + r)] =
                        quant::ref::vec_dot_q8_0_q8_0(k, w.data() + r * row_bytes, xq.data());
            }
            for (int threads : {1, 3}) {
                Fenced Y(m * n_rows);
                ScratchBuffer scratch;
                if (m == 1)
                    matvec(pool_of(threads), scratch, GgmlType::Q8_0, w.data(), n_rows, k, X.data(),
                           Y.data());
                else
                    matmul(pool_of(threads), scratch, GgmlType::Q8_0, w.data(), n_rows, k, X.data(),
                           m, Y.data());
                EXPECT_TRUE(Y.guards_intact());
                EXPECT_TRUE(same_bits(expected.data(), Y.data(), m * n_rows))
                    << n_rows << " rows of " << k << ", m = " << m << ", " << threads
                    << " threads, level " << quant::simd_level_name(quant::detected_simd_level());
            }
        }
    }
}

TEST_P(MatmulByType, ActivationsAreQuantizedByTheRowQuantizer) {
    const GgmlType type = GetParam();
    const GgmlType act = quant::kernels(type).vec_dot_type;
    const int64_t k = 512, m = 9;
    const auto X = random_floats(m * k, 11);
    ScratchBuffer scratch;
    const ActivationRows rows = quantize_activations(pool_of(3), scratch, type, X.data(), m, k);
    EXPECT_EQ(rows.type, act);
    EXPECT_EQ(rows.m, m);
    EXPECT_EQ(rows.k, k);
    if (act == GgmlType::F32) {
        EXPECT_EQ(rows.data, X.data());  // used in place
        return;
    }
    ASSERT_EQ(rows.row_stride, quant::row_size(act, k));
    EXPECT_EQ(rows.layout, quant::kernels(type).activation_layout);
    std::vector<uint8_t> expected(rows.row_stride);
    for (int64_t j = 0; j < m; ++j) {
        quant::kernels(type).quantize_activation_row(X.data() + j * k, expected.data(), k);
        EXPECT_EQ(std::memcmp(expected.data(),
                              static_cast<const uint8_t *>(rows.data) + j * rows.row_stride,
                              rows.row_stride),
                  0)
            << "activation row " << j;
    }
}

TEST_P(MatmulByType, SharedActivationsGiveTheSameResult) {
    const GgmlType type = GetParam();
    const int64_t k = 512, n_rows = 301, m = 4;
    const auto w = random_weights(type, n_rows, k, 5);
    const auto X = random_floats(m * k, 6);
    ScratchBuffer scratch_a, scratch_b;
    std::vector<float> direct(m * n_rows), shared(m * n_rows);
    matmul(pool_of(2), scratch_a, type, w.data(), n_rows, k, X.data(), m, direct.data());
    const ActivationRows rows = quantize_activations(pool_of(2), scratch_b, type, X.data(), m, k);
    matmul_activations(pool_of(2), dense_matrix(type, w.data(), n_rows, k), rows, shared.data());
    EXPECT_TRUE(same_bits(direct.data(), shared.data(), m * n_rows));
}

TEST_P(MatmulByType, ExpertSlabAndStridedRowsNeedNoCopy) {
    const GgmlType type = GetParam();
    const int64_t k = 512, n_rows = 129, n_expert = 3;
    const size_t row_bytes = quant::row_size(type, k);
    const auto experts = random_weights(type, n_expert * n_rows, k, 77);
    const auto x = random_floats(k, 78);
    ScratchBuffer scratch;
    for (int64_t e = 0; e < n_expert; ++e) {
        // The same expert as a separate dense copy.
        std::vector<uint8_t> copy(experts.begin() + e * n_rows * row_bytes,
                                  experts.begin() + (e + 1) * n_rows * row_bytes);
        std::vector<float> y_view(n_rows), y_copy(n_rows);
        matvec(pool_of(2), scratch, expert_matrix(type, experts.data(), n_rows, k, e), x.data(),
               y_view.data());
        matvec(pool_of(2), scratch, type, copy.data(), n_rows, k, x.data(), y_copy.data());
        EXPECT_TRUE(same_bits(y_view.data(), y_copy.data(), n_rows)) << "expert " << e;
    }
    // Rows padded with junk to a larger stride.
    const size_t stride = row_bytes + 40;
    std::vector<uint8_t> padded(n_rows * stride, 0xA5);
    for (int64_t r = 0; r < n_rows; ++r)
        std::memcpy(padded.data() + r * stride, experts.data() + r * row_bytes, row_bytes);
    std::vector<float> y_padded(n_rows), y_dense(n_rows);
    matvec(pool_of(3), scratch, WeightMatrix{type, padded.data(), n_rows, k, stride}, x.data(),
           y_padded.data());
    matvec(pool_of(3), scratch, type, experts.data(), n_rows, k, x.data(), y_dense.data());
    EXPECT_TRUE(same_bits(y_padded.data(), y_dense.data(), n_rows));
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatmulByType, ::testing::ValuesIn(kWeightTypes),
                         [](const auto &info) { return name_of(info.param); });

// Several products in one loop (a layer's routed experts): each output has the bits of its own
// matmul_activations, for products of several sizes (one chunk, many chunks, a chunk shorter
// than the others) over different runs of rows of one set of activations (one row, as in a
// decode step, and several, as in a prefill chunk), with 1, 2 and 5 threads.
TEST_P(MatmulByType, ManyProductsInOneLoopHaveEachProductsBits) {
    const GgmlType type = GetParam();
    const int64_t k = 512, m = 5;
    const int64_t rows[] = {1, 130, 700, 33, 64};
    const int64_t x_first[] = {0, 1, 2, 4, 0};
    const int64_t x_count[] = {1, 3, 1, 1, 5};
    const auto x = random_floats(m * k, 91);
    ScratchBuffer scratch;
    for (const int threads : {1, 2, 5}) {
        ThreadPool &pool = pool_of(threads);
        const ActivationRows a = quantize_activations(pool, scratch, type, x.data(), m, k);
        std::vector<std::vector<uint8_t>> weights;
        std::vector<std::vector<float>> got;
        std::vector<MatrixProduct> products;
        for (size_t p = 0; p < std::size(rows); ++p) {
            weights.push_back(random_weights(type, rows[p], k, 92 + p));
            got.emplace_back(size_t(rows[p] * x_count[p]), std::nanf(""));
        }
        for (size_t p = 0; p < std::size(rows); ++p)
            products.push_back({dense_matrix(type, weights[p].data(), rows[p], k),
                                activation_rows(a, x_first[p], x_count[p]), got[p].data()});
        matmul_many(pool, products);
        for (size_t p = 0; p < std::size(rows); ++p) {
            // The same rows alone through matmul_activations.
            ActivationRows some = a;
            some.m = x_count[p];
            some.data = static_cast<const uint8_t *>(a.data) + x_first[p] * a.row_stride;
            std::vector<float> y(size_t(rows[p] * x_count[p]));
            matmul_activations(pool, dense_matrix(type, weights[p].data(), rows[p], k), some,
                               y.data());
            EXPECT_TRUE(same_bits(y.data(), got[p].data(), rows[p] * x_count[p]))
                << "product " << p << " (" << rows[p] << " rows x " << x_count[p]
                << " activation rows), " << threads << " threads";
        }
    }
}

// Grouped products (the attention's output_a): group g reads every groups-th activation row from
// row g and writes every groups-th output row; each output equals the group's own dense matmul.
TEST_P(MatmulByType, ManyProductsReadAndWriteStridedRows) {
    const GgmlType type = GetParam();
    const int64_t k = 512, m = 3, groups = 2, rows = 40;
    const auto x = random_floats(m * groups * k, 93);
    ScratchBuffer scratch, dense_scratch;
    ThreadPool &pool = pool_of(3);
    const ActivationRows all = quantize_activations(pool, scratch, type, x.data(), m * groups, k);
    std::vector<std::vector<uint8_t>> weights;
    std::vector<float> got(size_t(m * groups * rows), std::nanf(""));
    std::vector<MatrixProduct> products;
    for (int64_t g = 0; g < groups; ++g) {
        weights.push_back(random_weights(type, rows, k, 94 + g));
        ActivationRows xg = all;
        xg.data = static_cast<const uint8_t *>(all.data) + g * all.row_stride;
        xg.m = m;
        xg.row_stride = all.row_stride * groups;
        products.push_back({dense_matrix(type, weights[size_t(g)].data(), rows, k), xg,
                            got.data() + g * rows, groups * rows});
    }
    matmul_many(pool, products);
    for (int64_t g = 0; g < groups; ++g) {
        std::vector<float> xg(size_t(m * k)), want(size_t(m * rows));
        for (int64_t t = 0; t < m; ++t)
            std::copy_n(x.data() + (t * groups + g) * k, k, xg.data() + t * k);
        matmul(pool, dense_scratch, dense_matrix(type, weights[size_t(g)].data(), rows, k),
               xg.data(), m, want.data());
        for (int64_t t = 0; t < m; ++t)
            EXPECT_TRUE(
                same_bits(want.data() + t * rows, got.data() + (t * groups + g) * rows, rows))
                << "group " << g << " token " << t;
    }
    MatrixProduct short_stride = products[0];
    short_stride.y_stride = rows - 1;
    EXPECT_THROW(matmul_many(pool, std::span<const MatrixProduct>(&short_stride, 1)), ds4::Error);
}

TEST(Matmul, ManyProductsRejectMismatchedActivations) {
    ThreadPool &pool = pool_of(2);
    ScratchBuffer scratch;
    const auto w = random_weights(GgmlType::Q2_K, 4, 512, 1);
    const auto x = random_floats(512, 2);
    std::vector<float> y(4);
    const ActivationRows q8_0 =
        quantize_activations(pool, scratch, GgmlType::Q8_0, x.data(), 1, 512);
    const MatrixProduct wrong_type[] = {
        {dense_matrix(GgmlType::Q2_K, w.data(), 4, 512), q8_0, y.data()}};
    EXPECT_THROW(matmul_many(pool, wrong_type), ds4::Error);
    const ActivationRows q8_k =
        quantize_activations(pool, scratch, GgmlType::Q2_K, x.data(), 1, 512);
    EXPECT_THROW(activation_rows(q8_k, 1, 1), ds4::Error);
    EXPECT_THROW(activation_rows(q8_k, 0, 2), ds4::Error);
    EXPECT_THROW(activation_rows(q8_k, -1, 1), ds4::Error);
    EXPECT_EQ(activation_rows(q8_k, 1, 0).m, 0);
    const MatrixProduct no_rows[] = {
        {dense_matrix(GgmlType::Q2_K, w.data(), 4, 512), activation_rows(q8_k, 0, 0), y.data()}};
    matmul_many(pool, no_rows);                           // an expert nobody chose: nothing to do
    matmul_many(pool, std::span<const MatrixProduct>{});  // nothing to do
}

TEST(Matmul, EmptyShapesDoNothing) {
    ScratchBuffer scratch;
    const auto w = random_weights(GgmlType::Q8_0, 4, 64, 1);
    const auto x = random_floats(64, 2);
    Fenced y(0);
    matvec(pool_of(2), scratch, GgmlType::Q8_0, w.data(), 0, 64, x.data(), y.data());
    matmul(pool_of(2), scratch, GgmlType::Q8_0, w.data(), 4, 64, x.data(), 0, y.data());
    EXPECT_TRUE(y.guards_intact());
}

TEST(Matmul, RejectsBadShapesAndTypes) {
    ScratchBuffer scratch;
    ThreadPool &pool = pool_of(2);
    const auto w = random_weights(GgmlType::Q2_K, 4, 512, 1);
    const auto x = random_floats(512, 2);
    std::vector<float> y(4);
    // k must be whole blocks.
    EXPECT_THROW(matvec(pool, scratch, GgmlType::Q2_K, w.data(), 2, 300, x.data(), y.data()),
                 ds4::Error);
    EXPECT_THROW(matvec(pool, scratch, GgmlType::Q8_0, w.data(), 2, 40, x.data(), y.data()),
                 ds4::Error);
    // Types without a weight dot product.
    EXPECT_THROW(matvec(pool, scratch, GgmlType::Q8_K, w.data(), 1, 256, x.data(), y.data()),
                 ds4::Error);
    EXPECT_THROW(matvec(pool, scratch, GgmlType::Q5_K, w.data(), 1, 256, x.data(), y.data()),
                 ds4::Error);
    // A stride shorter than a row.
    EXPECT_THROW(matvec(pool, scratch, WeightMatrix{GgmlType::Q2_K, w.data(), 2, 512, 100},
                        x.data(), y.data()),
                 ds4::Error);
    // Activations in the wrong format for the weight.
    const ActivationRows q8_0 =
        quantize_activations(pool, scratch, GgmlType::Q8_0, x.data(), 1, 512);
    EXPECT_THROW(
        matmul_activations(pool, dense_matrix(GgmlType::Q2_K, w.data(), 4, 512), q8_0, y.data()),
        ds4::Error);
    EXPECT_THROW(expert_matrix(GgmlType::Q2_K, w.data(), 4, 512, -1), ds4::Error);
}

TEST(Matmul, ScratchIsReusedWithoutReallocation) {
    ScratchBuffer scratch;
    void *first = scratch.reserve(1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_GE(scratch.capacity(), 1000u);
    EXPECT_EQ(scratch.reserve(1000), first);
    EXPECT_EQ(scratch.reserve(10), first);
    void *bigger = scratch.reserve(100000);
    EXPECT_GE(scratch.capacity(), 100000u);
    EXPECT_EQ(scratch.reserve(5000), bigger);
}

}  // namespace
}  // namespace ds4::backend::cpu
