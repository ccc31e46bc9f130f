// The engine against transformers' DeepseekV4ForCausalLM (f32) on the tiny models of
// tiny_models.py, converted by tools/convert/ds4_convert.py. The expected logits come from
// make_tiny_models.py --oracle (fixtures/<model>/index.json + *.logits.f32); this test needs no
// Python. QAT simulation is off (transformers has none, docs/TRANSFORMERS_NOTES.md D1-D2).
//
// Bound (the issue's): max |ours - theirs| over every position and vocabulary entry, divided by
// max |theirs|, at most 1e-4; and the greedy continuation equal token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "runtime/session.h"

using namespace ds4;

namespace {

const std::string kFixtures = std::string(DS4_SOURCE_DIR) + "/tests/model/fixtures/";

std::vector<float> read_f32(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<float> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
}

struct Deviation {
    double max_abs_diff = 0, max_abs_ref = 0;
    size_t top1_same = 0, top1_total = 0;  // argmax agreement over the compared rows
    double ratio() const { return max_abs_diff / max_abs_ref; }
    double top1_rate() const { return top1_total ? double(top1_same) / top1_total : 1.0; }
};

// Runs one fixture model: every prompt token by token (logits at every position) and once with
// chunked prefill. Returns the worst deviation. `exact` asserts the greedy continuation token for
// token (the f32, no-QAT comparison); otherwise the deviation is only measured.
Deviation check_model(const std::string &name, const std::string &gguf, bool qat_sim = false,
                      bool exact = true) {
    std::ifstream in(kFixtures + name + "/index.json");
    const auto index = nlohmann::json::parse(in);
    auto model = runtime::Model::load(gguf, {.n_threads = 2});
    const uint32_t V = index.at("vocab_size").get<uint32_t>();
    EXPECT_EQ(model->hparams().n_vocab, V);
    Deviation dev;
    for (const auto &prompt : index.at("prompts")) {
        const std::string pname = prompt.at("name");
        SCOPED_TRACE(name + "/" + pname);
        const auto tokens = prompt.at("tokens").get<std::vector<int32_t>>();
        const auto generated = prompt.at("generated").get<std::vector<int32_t>>();
        const size_t n_prompt = prompt.at("n_prompt").get<size_t>();
        // Full logits at every position, or (real vocabulary) full rows at a few positions.
        const auto &files = prompt.at("files");
        const bool all_rows = files.contains("logits");
        const auto expect = read_f32(
            kFixtures + name + "/" +
            (all_rows ? files.at("logits") : files.at("full_rows")).at("file").get<std::string>());
        std::vector<size_t> row_of(tokens.size(), SIZE_MAX);
        if (all_rows) {
            for (size_t i = 0; i < tokens.size(); ++i) row_of[i] = i;
        } else {
            const auto pos = prompt.at("full_row_positions").get<std::vector<size_t>>();
            for (size_t r = 0; r < pos.size(); ++r) row_of[pos[r]] = r;
        }
        size_t n_rows = 0;
        for (size_t r : row_of) n_rows += r != SIZE_MAX;
        EXPECT_EQ(expect.size(), n_rows * V);

        runtime::SessionOptions so{.ctx = static_cast<uint32_t>(tokens.size() + 1), .chunk = 1};
        so.forward.qat_sim = qat_sim;
        runtime::Session s(*model, so);
        for (size_t i = 0; i < tokens.size(); ++i) {
            const auto &logits = s.eval(std::span(tokens).subspan(i, 1));
            if (row_of[i] != SIZE_MAX) {
                const float *ref = expect.data() + row_of[i] * V;
                for (uint32_t v = 0; v < V; ++v) {
                    dev.max_abs_diff =
                        std::max(dev.max_abs_diff, double(std::fabs(logits[v] - ref[v])));
                    dev.max_abs_ref = std::max(dev.max_abs_ref, double(std::fabs(ref[v])));
                }
                dev.top1_same += runtime::argmax(logits) ==
                                 static_cast<int32_t>(std::max_element(ref, ref + V) - ref);
                ++dev.top1_total;
            }
            // Greedy: the token after position i is the argmax of our logits there.
            if (exact && i + 1 >= n_prompt && i + 1 - n_prompt < generated.size()) {
                EXPECT_EQ(runtime::argmax(logits), generated[i + 1 - n_prompt])
                    << "greedy step " << i + 1 - n_prompt;
            }
        }
        // Chunked prefill of the prompt ends on exactly the logits of token-by-token evaluation.
        runtime::SessionOptions sc = so;
        sc.chunk = 16;
        runtime::Session c(*model, sc);
        const auto &last = c.eval(std::span(tokens).first(n_prompt));
        runtime::Session t(*model, so);
        const auto &stepwise = t.eval(std::span(tokens).first(n_prompt));
        EXPECT_EQ(last, stepwise);  // batched prefill equals token-by-token, bit for bit
    }
    return dev;
}

class TransformersParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TransformersParity, LogitsAndGreedyTokens) {
    const std::string name = GetParam();
    // CTest rebuilds every model's GGUF (numpy only, seconds) into DS4_PARITY_GGUF_DIR first;
    // run by hand, the test falls back to the committed GGUFs of the small models.
    std::string gguf = kFixtures + name + "/model-f32.gguf";
    if (const char *dir = std::getenv("DS4_PARITY_GGUF_DIR"))
        gguf = std::string(dir) + "/" + name + "-f32.gguf";
    if (!std::filesystem::exists(gguf))
        GTEST_SKIP() << gguf
                     << " not present: python3 tests/model/make_tiny_models.py --gguf-dir DIR, "
                        "then set DS4_PARITY_GGUF_DIR=DIR";
    const Deviation d = check_model(name, gguf);
    std::printf("[ parity ] %s: max |diff| %.3g, max |logit| %.3g, ratio %.3g\n", name.c_str(),
                d.max_abs_diff, d.max_abs_ref, d.ratio());
    EXPECT_LE(d.ratio(), 1e-4);
}

std::string tiny_gguf(const std::string &name, const char *suffix) {
    const char *dir = std::getenv("DS4_PARITY_GGUF_DIR");
    return dir ? std::string(dir) + "/" + name + suffix : "";
}

// Deviation from transformers with the QAT simulation on (transformers has none): reported, and
// bounded loosely — on random tiny models FP8 KV rounding moves logits by O(1) (activations are
// O(1) and E4M3 keeps 3 mantissa bits), so greedy agreement is not expected to be exact here; the
// official vectors are the acceptance test for the simulation.
TEST(TransformersDeviation, QatSimulationOn) {
    const std::string gguf = tiny_gguf("flash_mini", "-f32.gguf");
    if (gguf.empty() || !std::filesystem::exists(gguf))
        GTEST_SKIP() << "DS4_PARITY_GGUF_DIR not set";
    const Deviation d = check_model("flash_mini", gguf, true, false);
    std::printf(
        "[ qat-on ] flash_mini: max |diff| %.3g (ratio %.3g), top-1 agreement %.1f%% of %zu rows\n",
        d.max_abs_diff, d.ratio(), 100 * d.top1_rate(), d.top1_total);
    EXPECT_GT(d.max_abs_diff, 1e-3);  // the simulation is really applied
    EXPECT_LT(d.ratio(), 0.5);
}

// The same model requantized to the q8_0 and q4 mixes by ds4-quantize (CTest makes the files):
// weight and activation rounding, QAT off. The deviation is dominated by routing: the router
// scores of these random models are near-tied (smallest gap 6e-4), so small rounding flips an
// expert and moves logits by O(1). Bounds are the measured agreement (92.3% / 83.9% of 155 rows)
// with a margin; llama.cpp on the same files is the tight comparison (tests/llamacpp).
TEST(TransformersDeviation, QuantizedMixes) {
    for (const char *mix : {"q8_0", "q4"}) {
        const std::string gguf =
            tiny_gguf("flash_ratios", (std::string("-") + mix + ".gguf").c_str());
        if (gguf.empty() || !std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " not present";
        const Deviation d = check_model("flash_ratios", gguf, false, false);
        std::printf(
            "[ %s ] flash_ratios: max |diff| %.3g (ratio %.3g), top-1 agreement %.1f%% of %zu "
            "rows\n",
            mix, d.max_abs_diff, d.ratio(), 100 * d.top1_rate(), d.top1_total);
        EXPECT_GE(d.top1_rate(), std::string(mix) == "q8_0" ? 0.88 : 0.78) << mix;
    }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TransformersParity,
                         ::testing::Values("flash_mini", "odd_shapes", "flash_ratios",
                                           "vocab_real"));

}  // namespace
