// Session behaviour on a synthetic tiny model: determinism across thread counts, snapshots,
// context limits, and the QAT switch.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

// A tiny q8_0 model with a made-up 512-token vocabulary (~1 MB), made once per process.
const std::string &tiny_model() {
    static const std::string path = [] {
        gguf::Writer w;
        std::vector<std::string> tokens;
        for (int i = 0; i < 512; ++i) tokens.push_back("tok" + std::to_string(i * 7));
        w.set("tokenizer.ggml.tokens", gguf::Value::array_of_strings(tokens));
        const auto bytes = w.to_bytes();
        auto vocab = gguf::File::from_memory(bytes.data(), bytes.size());
        const std::string p = ::testing::TempDir() + "/session-tiny-q8_0.gguf";
        model::write_synthetic_model(model::shape_preset("tiny", 512), model::QuantMix::Q8_0, 11,
                                     *vocab, p, false);
        return p;
    }();
    return path;
}

std::vector<int32_t> prompt(size_t n) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 5) % 512));
    return t;
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

// docs/SURFACES.md 1: min-p first (relative to the top token), then top-p over the sorted survivors,
// renormalized: here min-p removes token 2 (weight 0.05 < 0.06), so the survivors are 0 and 1 with
// half the mass each and top-p 0.5 keeps token 0 alone (over all three tokens it would need
// 0.5 x 2.05 and keep 0 and 1).
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

}  // namespace
