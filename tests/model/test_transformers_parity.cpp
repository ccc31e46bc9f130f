// The engine against transformers' DeepseekV4ForCausalLM (f32) on the tiny models of
// tiny_models.py, converted by tools/convert/ds4_convert.py. The expected logits come from
// make_tiny_models.py --oracle (fixtures/<model>/index.json + *.logits.f32); this test needs no
// Python. QAT simulation is off (transformers has none, docs/TRANSFORMERS_NOTES.md D1-D2).
//
// Bound (the issue's): max |ours - theirs| over every position and vocabulary entry, divided by
// max |theirs|, at most 1e-4; and the greedy continuation equal token for token.
#include <gtest/gtest.h>

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
    double ratio() const { return max_abs_diff / max_abs_ref; }
};

// Runs one fixture model: every prompt token by token (logits at every position) and once with
// chunked prefill. Returns the worst deviation.
Deviation check_model(const std::string &name, const std::string &gguf) {
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
        so.forward.qat_sim = false;
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
            }
            // Greedy: the token after position i is the argmax of our logits there.
            if (i + 1 >= n_prompt && i + 1 - n_prompt < generated.size()) {
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

INSTANTIATE_TEST_SUITE_P(TinyModels, TransformersParity,
                         ::testing::Values("flash_mini", "odd_shapes", "flash_ratios",
                                           "vocab_real"));

}  // namespace
