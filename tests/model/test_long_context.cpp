// Long context at the real attention geometry: the long_ctx model of tests/model/tiny_models.py
// (window 128, compression ratios 128 and 4, indexer top-512, hidden width 64) on one 8192-token
// prompt.
//
// 1. Against transformers (fixtures/long_ctx, make_tiny_models.py --oracle; QAT simulation off,
//    transformers has none): the logits at 190 stored positions (every 64th, and every position
//    in 0-3, 120-135, 2040-2059, 4088-4103, 8180-8191: the window's first eviction at 128, the
//    first ratio-128 row at 127, all 512 ratio-4 rows kept up to 2050 and top-512 chosen from
//    2051 on, 1024 rows at 4095, the end), max |ours - theirs| / max |theirs| <= kLongBound.
//    Selections: the model's only top-k choices (router, indexer) are in its last layer, so a
//    near-tie reaches no other position; the fixture leaves out the positions whose gap is below
//    1e-5 of the scores (2 of 192) and records the margins of the others (index.json).
// 2. Our two paths against each other: batched prefill then token-by-token decode equals
//    token-by-token decode from position 0, bit for bit, straddling 128, 2048-2052 and 4096.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "logits_diff.h"
#include "runtime/session.h"
#include "transformers_parity.h"

using namespace ds4;

namespace {

const std::string kFixture = std::string(DS4_SOURCE_DIR) + "/tests/model/fixtures/long_ctx";

// The bound. Measured: 2.4e-5, at position 7679, growing with the position (4.3e-7 below 128,
// 1.0e-5 at 128-2050, 1.1e-5 at 2051-4095): transformers computes the RoPE angle p * f_k in f32
// (modeling_deepseek_v4.py L150, docs/TRANSFORMERS_NOTES.md "RoPE"), so its angles are off by up
// to ~p * 6e-8 rad, while our rope_tail computes it in f64. The same transformers forward with
// f64 angles differs from ours by at most 7.4e-7 at every position, and the f32 angles alone move
// transformers' own logits by 2.4e-5 (both measured when this fixture was made). With the angle
// in f32 (docs/MODEL.md 10, "RoPE trigonometry"), transformers differs from its standard forward
// by 3.6e-6. So 3e-5: the angle-precision deviation plus a margin; it can drop to ~5e-6 once
// the engine computes the angle in f32. The oracle's own cached paths differ from its uncached
// forward by <= 5.6e-7 of the largest logit (index.json), and a boundary error is far above the
// bound: the window one row shorter moves the stored logits by 0.27 of the largest, top-511
// instead of top-512 by 0.012 (index.json, boundary_sensitivity).
constexpr double kLongBound = 3e-5;

std::string gguf_path() {
    if (const char *dir = std::getenv("DS4_PARITY_GGUF_DIR"))
        return std::string(dir) + "/long_ctx-f32.gguf";
    return kFixture + "/model-f32.gguf";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json fixture_prompt() {
    std::ifstream in(kFixture + "/index.json");
    if (!in) return {};
    return nlohmann::json::parse(in).at("prompts").at(0);
}

std::vector<int32_t> fixture_tokens() {
    const auto p = fixture_prompt();
    return p.is_null() ? std::vector<int32_t>{} : p.at("tokens").get<std::vector<int32_t>>();
}

TEST(LongContext, TransformersLogitsUpTo8K) {
    const std::string gguf = gguf_path();
    ASSERT_TRUE(std::filesystem::exists(gguf))
        << gguf << ": python3 tests/model/make_tiny_models.py --gguf-dir DIR --models long_ctx";
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = tools::check_transformers_fixture(kFixture, gguf, 2, {.chunk = 256});
    for (const auto &p : r.problems) ADD_FAILURE() << p;
    // The deviation per region, for the record.
    std::map<std::string, std::pair<double, size_t>> region;  // name -> (max |diff|, position)
    for (const auto &[pos, d] : r.row_diffs) {
        const char *name = pos < 128 ? "0-127" : pos < 2051 ? "128-2050" : pos < 4096 ? "2051-4095"
                                                                                        : "4096-8191";
        auto &e = region[name];
        if (d >= e.first) e = {d, pos};
    }
    for (const auto &[name, e] : region)
        std::printf("[ long   ] positions %s: max |diff| / max |logit| %.3g at %zu\n", name.c_str(),
                    e.first / r.max_abs_ref, e.second);
    std::printf(
        "[ long   ] long_ctx: %zu rows, max |diff| %.3g at position %zu, max |logit| %.3g, ratio "
        "%.3g (bound %g), top-1 equal %zu, %.1f s\n",
        r.rows_compared, r.max_abs_diff, r.worst_position, r.max_abs_ref, r.ratio(), kLongBound,
        r.top1_same, seconds_since(t0));
    EXPECT_EQ(r.rows_compared, fixture_prompt().at("rows").get<size_t>());
    EXPECT_GE(r.rows_compared, 180u);  // 192 positions, less the near-ties (2 when it was made)
    EXPECT_EQ(r.top1_same, r.rows_compared);
    EXPECT_LE(r.ratio(), kLongBound);
}

// Token-by-token decode of the first 4104 tokens is the reference; each straddle [lo, hi) is then
// reached by a batched prefill of lo tokens (chunks of 64, which end on every boundary, and of
// 1000, which end on none) and
// decoded token by token to hi, and one prefill also ends inside each straddle, past its
// boundary. Every logit vector must be bit-identical to the reference's.
TEST(LongContext, PrefillThenDecodeEqualsDecodeAcrossBoundaries) {
    const std::string gguf = gguf_path();
    ASSERT_TRUE(std::filesystem::exists(gguf)) << gguf;
    const auto tokens = fixture_tokens();
    ASSERT_EQ(tokens.size(), 8192u);
    const auto t0 = std::chrono::steady_clock::now();
    auto model = runtime::Model::load(gguf, {.n_threads = 2});
    struct Straddle {
        size_t lo, hi;
    };
    // The window drops its first row at 128 (and the first ratio-128 row appears at 127); the
    // indexer keeps all 512 ratio-4 rows up to 2050 and chooses from 2051; 4096 = 1024 rows.
    const std::vector<Straddle> straddles = {{120, 136}, {2040, 2060}, {4088, 4104}};
    const size_t n = straddles.back().hi;
    const uint32_t ctx = uint32_t(n + 1);
    runtime::SessionOptions so{.ctx = ctx, .chunk = 1};
    so.forward.qat_sim = false;

    std::map<size_t, std::vector<float>> reference;  // position -> logits there
    {
        runtime::Session one(*model, so);
        for (size_t i = 0; i < n; ++i) {
            const auto &l = one.eval(std::span(tokens).subspan(i, 1));
            for (const auto &s : straddles)
                if (i + 1 >= s.lo && i < s.hi) reference[i] = l;
        }
    }
    const double t_ref = seconds_since(t0);
    size_t compared = 0;
    for (uint32_t chunk : {64u, 1000u}) {
        for (const auto &s : straddles) {
            SCOPED_TRACE(testing::Message() << "chunk " << chunk << ", prefill " << s.lo);
            runtime::SessionOptions sc = so;
            sc.chunk = chunk;
            runtime::Session b(*model, sc);
            EXPECT_EQ(tools::logits_difference(b.eval(std::span(tokens).first(s.lo)),
                                               reference.at(s.lo - 1)),
                      "");
            for (size_t i = s.lo; i < s.hi; ++i, ++compared)
                EXPECT_EQ(tools::logits_difference(b.eval(std::span(tokens).subspan(i, 1)),
                                                   reference.at(i)),
                          "")
                    << "decode at position " << i;
        }
    }
    // One prefill that ends past each boundary, inside its straddle, in chunks of 100.
    for (const auto &s : straddles) {
        runtime::SessionOptions sc = so;
        sc.chunk = 100;
        runtime::Session b(*model, sc);
        const size_t len = s.hi - 2;
        EXPECT_EQ(tools::logits_difference(b.eval(std::span(tokens).first(len)),
                                           reference.at(len - 1)),
                  "")
            << "prefill of " << len << " in chunks of 100";
        ++compared;
    }
    std::printf(
        "[ long   ] prefill then decode: %zu logit vectors bit-identical to token-by-token "
        "(reference %.1f s, total %.1f s)\n",
        compared, t_ref, seconds_since(t0));
}

}  // namespace
