// Session behaviour on a synthetic tiny model: determinism across thread counts, snapshots,
// context limits, and the QAT switch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

const std::string &tiny_model() {
    return test::tiny_session_model(11);
}

std::vector<int32_t> prompt(size_t n) {
    return test::made_up_prompt(n);
}

TEST(Session, ThreadCountDoesNotChangeLogits) {
    auto m1 = Model::load(tiny_model(), {.n_threads = 1});
    auto m2 = Model::load(tiny_model(), {.n_threads = 3});
    Session s1(*m1, {.ctx = 128}), s2(*m2, {.ctx = 128});
    const auto p = prompt(40);  // crosses the window (8), ratios 4 and 16, and indexer top-k (4)
    const auto l1 = s1.eval(p);
    const auto l2 = s2.eval(p);
    ASSERT_EQ(l1.size(), 512u);
    for (size_t i = 0; i < l1.size(); ++i) ASSERT_EQ(l1[i], l2[i]) << i;
    for (float v : l1) ASSERT_TRUE(std::isfinite(v));
}

TEST(Session, SnapshotRestoreReproducesTheNextLogits) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session s(*m, {.ctx = 128});
    s.eval(prompt(23));
    const Session::Snapshot snap = s.save();
    const std::vector<int32_t> more = {3, 141, 59};
    const auto after = s.eval(more);
    s.eval(prompt(9));  // wander off
    s.restore(snap);
    EXPECT_EQ(s.tokens().size(), 23u);
    const auto again = s.eval(more);
    ASSERT_EQ(after, again);
}

TEST(Session, SplitEvaluationEqualsOneCall) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session a(*m, {.ctx = 128}), b(*m, {.ctx = 128});
    const auto p = prompt(37);
    const auto whole = a.eval(p);
    b.eval(std::span(p).first(20));
    const auto split = b.eval(std::span(p).subspan(20));
    EXPECT_EQ(whole, split);
}

// docs/MODEL.md Appendix A.6: batched prefill then decode equals token-by-token decode, for prompt
// lengths around every boundary of the tiny shape (window 8, ratios 4 and 16, the indexer
// selecting from the 5th compressed row of ratio-4 layers = position 19) and several chunk sizes.
TEST(Session, PrefillThenDecodeEqualsDecodeOnly) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    const auto p = prompt(72);
    Session one(*m, {.ctx = 128, .chunk = 1});
    std::vector<std::vector<float>> reference;  // logits after each prefix length
    for (size_t i = 0; i < p.size(); ++i) reference.push_back(one.eval(std::span(p).subspan(i, 1)));
    for (uint32_t chunk : {3u, 8u, 16u, 64u}) {
        for (size_t len : {7, 8, 9, 15, 16, 17, 19, 20, 21, 31, 32, 33, 47, 48, 49, 64}) {
            SCOPED_TRACE(testing::Message() << "chunk " << chunk << " prompt " << len);
            Session s(*m, {.ctx = 128, .chunk = chunk});
            ASSERT_EQ(s.eval(std::span(p).first(len)), reference[len - 1]);
            // then decode a few tokens one by one
            for (size_t i = len; i < len + 5; ++i)
                ASSERT_EQ(s.eval(std::span(p).subspan(i, 1)), reference[i]);
        }
    }
}

// The CPU attention runs a batch with at least a token per thread as a task a token, and a
// smaller one token by token, each token's scores split across the threads by rows and its
// outputs by values (runtime/attention_core.cpp attend_token_split): 5 threads and chunks of 2, 3
// (split) and 7 (by token), across the indexer's first selection (position 19), equal
// token-by-token decode on 1 thread (by token: a batch of one on one thread).
TEST(Session, BatchesSmallerAndLargerThanThePoolEqualDecodeOnly) {
    auto m1 = Model::load(tiny_model(), {.n_threads = 1});
    auto m5 = Model::load(tiny_model(), {.n_threads = 5});
    const auto p = prompt(40);
    Session one(*m1, {.ctx = 128, .chunk = 1});
    std::vector<std::vector<float>> reference;
    for (size_t i = 0; i < p.size(); ++i) reference.push_back(one.eval(std::span(p).subspan(i, 1)));
    for (uint32_t chunk : {2u, 3u, 7u})
        for (size_t len : {18, 21, 33}) {
            SCOPED_TRACE(testing::Message() << "chunk " << chunk << " prompt " << len);
            Session s(*m5, {.ctx = 128, .chunk = chunk});
            ASSERT_EQ(s.eval(std::span(p).first(len)), reference[len - 1]);
            for (size_t i = len; i < len + 3; ++i)
                ASSERT_EQ(s.eval(std::span(p).subspan(i, 1)), reference[i]);
        }
}

TEST(Session, ContextOverflowIsAClearErrorAndChangesNothing) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session s(*m, {.ctx = 16});
    s.eval(prompt(10));
    try {
        s.eval(prompt(7));
        FAIL() << "no error";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find(
                      "17 tokens do not fit: 10 already in the context, 7 new, context size 16"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_EQ(s.tokens().size(), 10u);
    EXPECT_THROW(s.eval(std::vector<int32_t>{600}), Error);  // outside the vocabulary
}

// Every buffer of a batch is written before it is read (Ops::buffer's values are unspecified and
// the CPU backend reuses them unfilled): with every buffer filled with NaN, with a large value or
// with a small negative one when taken, a prefill in two batches (one larger than the pool, one
// smaller) and four decode steps give the logits of a session whose buffers are not filled, bit
// for bit. (NaN alone would not do: a Q8_0 quantization turns a row of NaNs into zeros.)
TEST(Session, EveryBatchBufferIsWrittenBeforeItIsRead) {
    auto m = Model::load(tiny_model(), {.n_threads = 3});
    const auto p = prompt(44);
    const std::vector<std::vector<int32_t>> batches = {{p.begin(), p.begin() + 38},
                                                       {p.begin() + 38, p.begin() + 40},
                                                       {p[40]},
                                                       {p[41]},
                                                       {p[42]},
                                                       {p[43]}};
    Session plain(*m, {.ctx = 128});
    std::vector<std::vector<float>> want;
    for (const auto &b : batches) want.push_back(plain.eval(b));
    for (const float fill : {std::numeric_limits<float>::quiet_NaN(), 12345.0f, -0.375f}) {
        Session filled(*m, {.ctx = 128, .forward = {.buffer_fill = fill}});
        for (size_t b = 0; b < batches.size(); ++b) {
            const auto got = filled.eval(batches[b]);
            ASSERT_EQ(got.size(), want[b].size());
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_TRUE(std::isfinite(got[i])) << "fill " << fill << " batch " << b;
                ASSERT_EQ(got[i], want[b][i])
                    << "fill " << fill << " batch " << b << " logit " << i;
            }
        }
    }
}

TEST(Session, QatSimulationChangesLogitsSlightly) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session on(*m, {.ctx = 128}), off(*m, {.ctx = 128, .forward = {.qat_sim = false}});
    const auto p = prompt(40);
    const auto a = on.eval(p), b = off.eval(p);
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        max_diff = std::max<double>(max_diff, std::fabs(a[i] - b[i]));
        max_abs = std::max<double>(max_abs, std::fabs(b[i]));
    }
    EXPECT_GT(max_diff, 0.0);
    EXPECT_LT(max_diff, 0.5 * max_abs);
}

TEST(Sampler, GreedyTopKAndSeeds) {
    std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f, 1.5f};
    EXPECT_EQ(argmax(logits), 1);
    Sampler greedy({.temperature = 0.0f});
    EXPECT_EQ(greedy.sample(logits), 1);
    Sampler k1({.temperature = 1.0f, .top_k = 1, .seed = 9});
    for (int i = 0; i < 10; ++i) EXPECT_EQ(k1.sample(logits), 1);
    Sampler a({.temperature = 1.0f, .min_p = 0.0f, .seed = 42}),
        b({.temperature = 1.0f, .min_p = 0.0f, .seed = 42});
    int hist[5] = {};
    for (int i = 0; i < 2000; ++i) {
        const int x = a.sample(logits);
        EXPECT_EQ(x, b.sample(logits));
        ++hist[x];
    }
    // p = softmax(logits): token 3 has probability ~0.017, token 1 ~0.37.
    EXPECT_GT(hist[1], 600);
    EXPECT_LT(hist[3], 80);
    Sampler minp({.temperature = 1.0f, .min_p = 0.5f, .seed = 3});
    for (int i = 0; i < 200; ++i) {
        const int x = minp.sample(logits);
        EXPECT_TRUE(x == 1 || x == 2 || x == 4) << x;  // 0 and 3 are below half the top probability
    }
    const auto lp = top_logprobs(logits, 2);
    ASSERT_EQ(lp.size(), 2u);
    EXPECT_EQ(lp[0].first, 1);
    EXPECT_EQ(lp[1].first, 2);
    double z = 0;
    for (float l : logits) z += std::exp(l);
    EXPECT_NEAR(lp[0].second, 2.0 - std::log(z), 1e-6);
    EXPECT_THROW(Sampler({.top_p = 0.0f}), Error);
}

// docs/SURFACES.md 1: min-p first (relative to the top token), then top-p over the sorted
// survivors, renormalized: here min-p removes token 2 (weight 0.05 < 0.06), so the survivors are 0
// and 1 with half the mass each and top-p 0.5 keeps token 0 alone (over all three tokens it would
// need 0.5 x 2.05 and keep 0 and 1).
TEST(Sampler, TopPAppliesToTheMinPSurvivors) {
    const std::vector<float> logits = {0.0f, 0.0f, std::log(0.05f)};
    Sampler s({.temperature = 1.0f, .top_p = 0.5f, .min_p = 0.06f, .seed = 5});
    for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(logits), 0);
    Sampler all({.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.0f, .seed = 5});
    int seen[3] = {};
    for (int i = 0; i < 3000; ++i) ++seen[all.sample(logits)];
    EXPECT_GT(seen[2], 30);  // without min-p the third token is drawn (p = 0.024)
    EXPECT_GT(seen[1], 1200);
}

// Logits without a finite weight (NaN, +inf) fall back to argmax instead of drawing from nothing.
TEST(Sampler, NonFiniteLogitsDoNotEmptyTheCandidates) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    Sampler s({.temperature = 1.0f, .seed = 1});
    EXPECT_EQ(s.sample({nan, nan, nan}), 0);
    EXPECT_EQ(s.sample({0.0f, inf, 1.0f}), 1);
}

// top-k is capped at 1024 candidates: with a flat distribution over 2000 tokens, a larger k never
// reaches past the 1024 best.
TEST(Sampler, TopKIsCappedAt1024) {
    std::vector<float> logits(2000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = -1e-4f * static_cast<float>(i);
    Sampler s({.temperature = 1.0f, .min_p = 0.0f, .top_k = 5000, .seed = 11});
    int highest = 0;
    for (int i = 0; i < 20000; ++i) highest = std::max(highest, s.sample(logits));
    EXPECT_LT(highest, 1024);
    EXPECT_GT(highest, 1000);  // and the cap is not lower
}

// The distribution a sampler must draw from, computed here from the documented contract
// (docs/SURFACES.md 1, the header of src/runtime/sampler.h), not from the sampler: top-k keeps the
// k largest logits (ties to the lower id); probabilities are softmax(logits / T); min-p keeps the
// tokens whose probability is at least min_p x the top token's; top-p keeps the smallest prefix
// of those, sorted by probability, whose mass reaches top_p x theirs; the rest is renormalized.
std::vector<long double> expected_distribution(const std::vector<float> &logits,
                                               const SamplerParams &p) {
    const size_t n = logits.size();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    if (p.top_k > 0 && size_t(p.top_k) < n) order.resize(size_t(p.top_k));
    const long double top = logits[order[0]];
    std::vector<long double> w(n, 0.0L);  // probability up to one factor, the top token's = 1
    std::vector<size_t> kept;
    for (size_t id : order) {
        const long double x =
            std::exp((static_cast<long double>(logits[id]) - top) / p.temperature);
        if (x >= p.min_p) {
            w[id] = x;
            kept.push_back(id);
        }
    }
    long double mass = 0;
    for (size_t id : kept) mass += w[id];
    long double acc = 0;
    size_t m = 0;
    while (m < kept.size() && acc < p.top_p * mass) acc += w[kept[m++]];
    for (size_t i = m; i < kept.size(); ++i) w[kept[i]] = 0;
    for (auto &x : w) x /= acc;
    return w;
}

// Upper 1e-7 quantile of the chi-square distribution with `df` degrees of freedom, by the
// Wilson-Hilferty approximation; at this level it errs high by 19 % at df 1, 12 % at 2, 3 % at 10
// and < 1.5 % from 20 (against scipy.stats.chi2.isf), so the test's false-alarm rate stays < 1e-7.
double chi_square_critical(int df) {
    const double z = 5.199;  // the standard normal's upper 1e-7 quantile
    const double a = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

std::vector<float> spread_logits(size_t n) {  // distinct values over ~6 nats, no exact ties
    std::vector<float> l(n);
    for (size_t i = 0; i < n; ++i)
        l[i] = 3.0f * std::sin(1.7f * float(i) + 0.3f) + 0.01f * float(i);
    return l;
}

struct SamplingCase {
    const char *what;
    SamplerParams params;
    size_t min_support, max_support;  // the filters must really cut (or, for T alone, keep all)
};

class SamplerDistribution : public ::testing::TestWithParam<SamplingCase> {};

// Many seeded draws against softmax(logits / T) restricted by the filters: every drawn token is in
// the expected support, a chi-square goodness-of-fit statistic stays below the 1e-7 quantile, and
// the total-variation distance below 0.01 (for 200k draws from these distributions its mean is
// 0.003-0.005 with a standard deviation of 0.0007, simulated from the expected distribution).
TEST_P(SamplerDistribution, DrawsFollowTheFilteredTemperedSoftmax) {
    const SamplingCase &c = GetParam();
    const std::vector<float> logits = spread_logits(40);
    const auto want = expected_distribution(logits, c.params);
    const size_t support =
        size_t(std::count_if(want.begin(), want.end(), [](long double x) { return x > 0; }));
    ASSERT_GE(support, c.min_support) << c.what;
    ASSERT_LE(support, c.max_support) << c.what;

    constexpr int kDraws = 200000;
    Sampler s(c.params);
    std::vector<long> count(logits.size(), 0);
    for (int i = 0; i < kDraws; ++i) {
        const int32_t t = s.sample(logits);
        ASSERT_TRUE(t >= 0 && size_t(t) < logits.size());
        ++count[size_t(t)];
    }
    // chi-square over bins of expected count >= 5: the tokens expected fewer times are pooled
    // into one bin, itself merged into the smallest other bin if it is still below 5
    double tv = 0;
    std::vector<std::pair<double, double>> bins;  // (observed, expected)
    std::pair<double, double> pooled{0, 0};
    for (size_t i = 0; i < logits.size(); ++i) {
        if (want[i] == 0) {
            EXPECT_EQ(count[i], 0) << c.what << ": token " << i << " is outside the filters";
            continue;
        }
        const double e = double(want[i]) * kDraws;
        tv += 0.5 * std::fabs(double(count[i]) / kDraws - double(want[i]));
        if (e >= 5) {
            bins.push_back({double(count[i]), e});
        } else {
            pooled.first += double(count[i]);
            pooled.second += e;
        }
    }
    ASSERT_FALSE(bins.empty());
    if (pooled.second >= 5) {
        bins.push_back(pooled);
    } else if (pooled.second > 0) {
        auto smallest = std::min_element(bins.begin(), bins.end(),
                                         [](auto &a, auto &b) { return a.second < b.second; });
        smallest->first += pooled.first;
        smallest->second += pooled.second;
    }
    double chi2 = 0;
    for (const auto &[o, e] : bins) chi2 += (o - e) * (o - e) / e;
    const int df = int(bins.size()) - 1;
    std::printf("[ sampler ] %s: support %zu, chi2 %.1f (df %d, bound %.1f), TV %.4f\n", c.what,
                support, chi2, df, df > 0 ? chi_square_critical(df) : 0.0, tv);
    if (df > 0) {
        EXPECT_LT(chi2, chi_square_critical(df)) << c.what;
    }
    EXPECT_LT(tv, 0.01) << c.what;
}

INSTANTIATE_TEST_SUITE_P(
    Filters, SamplerDistribution,
    ::testing::Values(
        SamplingCase{"T=0.5", {.temperature = 0.5f, .min_p = 0.0f, .seed = 101}, 40, 40},
        SamplingCase{"T=1.8", {.temperature = 1.8f, .min_p = 0.0f, .seed = 102}, 40, 40},
        SamplingCase{
            "T=1.3 top-k 6", {.temperature = 1.3f, .min_p = 0.0f, .top_k = 6, .seed = 103}, 6, 6},
        SamplingCase{"T=0.8 min-p 0.1", {.temperature = 0.8f, .min_p = 0.1f, .seed = 104}, 4, 30},
        SamplingCase{"T=1.5 top-p 0.6",
                     {.temperature = 1.5f, .top_p = 0.6f, .min_p = 0.0f, .seed = 105},
                     4,
                     30},
        SamplingCase{"T=0.7 top-k 12 min-p 0.02 top-p 0.9",
                     {.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.02f, .top_k = 12, .seed = 106},
                     3,
                     11}),
    [](const ::testing::TestParamInfo<SamplingCase> &i) {
        return "case" + std::to_string(i.index);
    });

// The filters of the combined case each cut something (else that case would not test them):
// top-k 12 alone, min-p 0.02 alone and top-p 0.9 alone each leave fewer than 40 tokens, and
// together fewer than any one of them.
TEST(SamplerDistribution, EachFilterOfTheCombinedCaseCuts) {
    const auto logits = spread_logits(40);
    auto support = [&](SamplerParams p) {
        const auto w = expected_distribution(logits, p);
        return size_t(std::count_if(w.begin(), w.end(), [](long double x) { return x > 0; }));
    };
    const size_t k = support({.temperature = 0.7f, .min_p = 0.0f, .top_k = 12});
    const size_t mp = support({.temperature = 0.7f, .min_p = 0.02f});
    const size_t tp = support({.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.0f});
    const size_t all = support({.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.02f, .top_k = 12});
    EXPECT_LT(k, 40u);
    EXPECT_LT(mp, 40u);
    EXPECT_LT(tp, 40u);
    EXPECT_LT(all, std::min({k, mp, tp}));
}

// The same seed gives the same sequence at T != 1 with every filter on; another seed another one.
TEST(SamplerDistribution, SameSeedSameSequence) {
    const auto logits = spread_logits(40);
    const SamplerParams p{
        .temperature = 0.7f, .top_p = 0.9f, .min_p = 0.02f, .top_k = 12, .seed = 77};
    SamplerParams q = p;
    q.seed = 78;
    Sampler a(p), b(p), other(q);
    std::vector<int32_t> sa, sb, so;
    for (int i = 0; i < 2000; ++i) {
        sa.push_back(a.sample(logits));
        sb.push_back(b.sample(logits));
        so.push_back(other.sample(logits));
    }
    EXPECT_EQ(sa, sb);
    EXPECT_NE(sa, so);
}

}  // namespace
