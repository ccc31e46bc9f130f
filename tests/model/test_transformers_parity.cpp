// The engine against transformers' DeepseekV4ForCausalLM (f32) on the tiny models of
// tiny_models.py, converted by tools/convert/ds4_convert.py; the check itself is
// tools/common/transformers_parity (shared with ds4-test --transformers-parity). The expected
// logits come from make_tiny_models.py --oracle; this test needs no Python.
//
// Bound: max |ours - theirs| over every position and vocabulary entry, divided by
// max |theirs|, at most 1e-4, with QAT simulation off (transformers has none); the greedy
// continuation equal token for token; chunked prefill equal to token-by-token, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "transformers_parity.h"

using namespace ds4;

namespace {

const std::string kFixtures = std::string(DS4_SOURCE_DIR) + "/tests/model/fixtures/";

// CTest rebuilds every model's GGUF (numpy only, seconds) into DS4_PARITY_GGUF_DIR first, and
// requantizes flash_ratios; run by hand, the test falls back to the committed small GGUFs.
std::string gguf_path(const std::string &name, const std::string &mix) {
    if (const char *dir = std::getenv("DS4_PARITY_GGUF_DIR"))
        return std::string(dir) + "/" + name + "-" + mix + ".gguf";
    return mix == "f32" ? kFixtures + name + "/model-f32.gguf" : "";
}

class TransformersParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TransformersParity, LogitsAndGreedyTokens) {
    const std::string name = GetParam(), gguf = gguf_path(name, "f32");
    if (!std::filesystem::exists(gguf))
        GTEST_SKIP() << gguf
                     << " not present: python3 tests/model/make_tiny_models.py --gguf-dir DIR, "
                        "then set DS4_PARITY_GGUF_DIR=DIR";
    const auto r = tools::check_transformers_fixture(kFixtures + name, gguf, 2);
    std::printf(
        "[ parity ] %s: max |diff| %.3g, max |logit| %.3g, ratio %.3g, %zu rows, %zu greedy "
        "steps\n",
        name.c_str(), r.max_abs_diff, r.max_abs_ref, r.ratio(), r.rows_compared, r.greedy_steps);
    for (const auto &p : r.problems) ADD_FAILURE() << p;
    EXPECT_LE(r.ratio(), tools::kTransformersParityBound);
    EXPECT_GT(r.greedy_steps, 0u);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TransformersParity,
                         ::testing::Values("flash_mini", "odd_shapes", "flash_ratios", "vocab_real",
                                           "trained_mini", "trained_ratios"));

// Deviation from transformers with the QAT simulation on (transformers has none): reported, and
// bounded loosely. On random tiny models FP8 KV rounding moves logits by O(1) (activations are
// O(1) and E4M3 keeps 3 mantissa bits), so greedy agreement is not expected to be exact here; the
// official vectors are the acceptance test for the simulation.
TEST(TransformersDeviation, QatSimulationOn) {
    const std::string gguf = gguf_path("flash_mini", "f32");
    if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " not present";
    const auto r = tools::check_transformers_fixture(kFixtures + "flash_mini", gguf, 2,
                                                     {.qat_sim = true, .exact = false});
    std::printf(
        "[ qat-on ] flash_mini: max |diff| %.3g (ratio %.3g), top-1 agreement %.1f%% of %zu rows\n",
        r.max_abs_diff, r.ratio(), 100 * r.top1_rate(), r.rows_compared);
    EXPECT_GT(r.max_abs_diff, 1e-3);  // the simulation is really applied
    EXPECT_LT(r.ratio(), 0.5);
}

// The requirement behind the simulation: a model that predicts with margins, as the real one does,
// keeps its greedy continuation when the FP8 KV / FP4 indexer rounding is on. trained_mini
// (flash_mini's shape trained on a synthetic language, tiny_models.py) and trained_ratios (the
// ratios 4 and 128, trained the same way) must give transformers' greedy tokens token for token
// with QAT on; the logit deviation is reported.
TEST(TransformersDeviation, QatSimulationOnKeepsATrainedModelsGreedyTokens) {
    for (const char *name : {"trained_mini", "trained_ratios"}) {
        const std::string gguf = gguf_path(name, "f32");
        if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " not present";
        const auto r = tools::check_transformers_fixture(kFixtures + name, gguf, 2,
                                                         {.qat_sim = true, .exact = true});
        std::printf(
            "[ qat-on ] %s: max |diff| %.3g (ratio %.3g), top-1 agreement %.1f%% of %zu rows, "
            "%zu greedy steps\n",
            name, r.max_abs_diff, r.ratio(), 100 * r.top1_rate(), r.rows_compared, r.greedy_steps);
        for (const auto &p : r.problems) ADD_FAILURE() << name << ": " << p;
        EXPECT_GT(r.greedy_steps, 0u) << name;
        EXPECT_GT(r.max_abs_diff, 1e-3) << name;  // the simulation is really applied
    }
}

// The same checkpoint requantized to the q8_0 and q4 mixes by ds4-quantize (CTest makes the
// files): weight and activation rounding, QAT off. The deviation is dominated by routing: the
// router scores of these random models are near-tied (smallest gap 6e-4), so small rounding flips
// an expert and moves logits by O(1), and the top-1 agreement with transformers' f32 model is a
// property of the quantized file as much as of the engine. The reference for it is llama.cpp, an
// independent engine, on the same files (fixtures/flash_ratios_llamacpp, written by
// make_llamacpp_quantized_fixture.py; f32 KV cache, once as one prefill batch and once token by
// token): at the positions where transformers' top-1 leads its second choice by at least
// kClearMargin, our top-1 must equal transformers' at no fewer positions than llama.cpp's lower
// run does (65 of the 155 in each mix; both engines agree at all of them). At all 155 the counts
// are printed (q8_0: llama.cpp 144, ours 146 when this was first written and 143 on a later
// machine with the same code: the positions that move are those of margins of 0.01-0.97 logits,
// within the quantized files' noise; q4: 124 and 128-132). The fixture names the files by their
// SHA-256: a quantizer change fails here until the fixture is remade. Our top-1 agreement with
// llama.cpp itself is printed (about 145-149 of 155, against llama.cpp's own 149 and 148 between
// its two runs).
constexpr float kClearMargin = 1.0f;  // logits between transformers' first and second choice

TEST(TransformersDeviation, QuantizedMixes) {
    std::ifstream in(kFixtures + "flash_ratios_llamacpp/top1.json");
    ASSERT_TRUE(in) << "fixtures/flash_ratios_llamacpp/top1.json missing";
    const auto llama = nlohmann::json::parse(in);
    for (const char *mix : {"q8_0", "q4"}) {
        const std::string gguf = gguf_path("flash_ratios", mix);
        if (gguf.empty() || !std::filesystem::exists(gguf))
            GTEST_SKIP() << "flash_ratios-" << mix << ".gguf not present";
        const auto &entry = llama.at("mixes").at(mix);
        ASSERT_EQ(tools::file_sha256(gguf), entry.at("gguf_sha256").get<std::string>())
            << gguf << " is not the file llama.cpp's top-1 tokens were computed on: rerun "
            << "python3 tests/model/make_llamacpp_quantized_fixture.py";
        const auto r = tools::check_transformers_fixture(kFixtures + "flash_ratios", gguf, 2,
                                                         {.exact = false});
        ASSERT_EQ(r.top1.size(), llama.at("tokens").size()) << mix;
        ASSERT_EQ(r.top1_ref, llama.at("transformers_top1").get<std::vector<int32_t>>()) << mix;
        size_t reference = SIZE_MAX;
        std::string with_llama;
        for (const auto &[run, v] : entry.at("llamacpp").items()) {
            reference = std::min(reference, v.at("top1_equal_to_transformers").get<size_t>());
            const auto top1 = v.at("top1").get<std::vector<int32_t>>();
            size_t same = 0;
            for (size_t i = 0; i < top1.size(); ++i) same += top1[i] == r.top1[i];
            with_llama += fmt::format(" {} ({})", same, run);
        }
        std::printf(
            "[ %s ] flash_ratios: max |diff| %.3g (ratio %.3g), top-1 equal to transformers' at "
            "%zu "
            "of %zu positions (llama.cpp on the same file: %zu at least); equal to llama.cpp's "
            "at%s\n",
            mix, r.max_abs_diff, r.ratio(), r.top1_same, r.rows_compared, reference,
            with_llama.c_str());
        // The assertion counts the positions whose transformers top-1 leads its second choice by
        // at least kClearMargin: below it the quantized files' noise (max |diff| 2.75-3.07
        // logits) decides, for llama.cpp as for us, which token wins (one such position moved
        // between two x86 machines with the same code and files).
        size_t clear = 0, ours_clear = 0, llama_clear = SIZE_MAX;
        for (size_t i = 0; i < r.top1.size(); ++i)
            if (r.ref_margin[i] >= kClearMargin) {
                ++clear;
                ours_clear += r.top1[i] == r.top1_ref[i];
            }
        for (const auto &[run, v] : entry.at("llamacpp").items()) {
            const auto top1 = v.at("top1").get<std::vector<int32_t>>();
            size_t same = 0;
            for (size_t i = 0; i < top1.size(); ++i)
                same += r.ref_margin[i] >= kClearMargin && top1[i] == r.top1_ref[i];
            llama_clear = std::min(llama_clear, same);
        }
        std::printf(
            "[ %s ] at the %zu positions of a clear margin (>= %.1f): ours %zu, llama.cpp's "
            "lower run %zu\n",
            mix, clear, double(kClearMargin), ours_clear, llama_clear);
        ASSERT_GT(clear, r.top1.size() / 4) << mix << ": too few clear positions to judge";
        EXPECT_GE(ours_clear, llama_clear) << mix;
    }
}

}  // namespace
