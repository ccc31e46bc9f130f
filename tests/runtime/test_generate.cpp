// The generation loop's stop reasons and its prefill in chunks: a stop request is honoured
// between prefill chunks (not only between generated tokens), a chunked prefill gives the logits
// of one call, and a prompt that does not fit is refused before anything is evaluated.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"
#include "runtime/generate.h"
#include "runtime/session.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

const std::string &tiny_model() {
    static const std::string path = [] {
        gguf::Writer w;
        std::vector<std::string> tokens;
        for (int i = 0; i < 512; ++i) tokens.push_back("tok" + std::to_string(i * 7));
        w.set("tokenizer.ggml.tokens", gguf::Value::array_of_strings(tokens));
        const auto bytes = w.to_bytes();
        auto vocab = gguf::File::from_memory(bytes.data(), bytes.size());
        const std::string p = ::testing::TempDir() + "/generate-tiny-q8_0.gguf";
        model::write_synthetic_model(model::shape_preset("tiny", 512), model::QuantMix::Q8_0, 13,
                                     *vocab, p, false);
        return p;
    }();
    return path;
}

std::vector<int32_t> prompt(size_t n) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 53 + 3) % 512));
    return t;
}

TEST(Generate, StopRequestDuringPrefillIsHonouredBetweenChunks) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session s(*m, {.ctx = 256, .chunk = 16});
    std::atomic<bool> cancel{false};
    Sampler sampler({.temperature = 0.0f});
    const auto p = prompt(100);
    size_t calls = 0;
    const GenerateStats st = generate(
        s, p, sampler, {.max_tokens = 8, .stop_ids = {}, .cancel = &cancel},
        [](int32_t) { FAIL() << "no token may be generated"; },
        [&](size_t done, size_t total) {
            EXPECT_EQ(total, p.size());
            if (++calls == 1) cancel = true;  // during the first chunk
            EXPECT_LE(done, 16u);
        });
    EXPECT_EQ(st.stop, StopReason::Interrupted);
    EXPECT_EQ(st.prompt_tokens, 16u);
    EXPECT_EQ(st.generated, 0u);
    EXPECT_EQ(s.tokens().size(), 16u);
}

TEST(Generate, ChunkedPrefillEqualsOneCall) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    const auto p = prompt(70);
    Session whole(*m, {.ctx = 256, .chunk = 256}), chunked(*m, {.ctx = 256, .chunk = 16});
    whole.eval(p);
    Sampler sampler({.temperature = 0.0f});
    std::vector<size_t> progress;
    const GenerateStats st = generate(
        chunked, p, sampler, {.max_tokens = 1, .stop_ids = {}}, [](int32_t) {},
        [&](size_t done, size_t) { progress.push_back(done); });
    EXPECT_EQ(st.prompt_tokens, p.size());
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), p.size());
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    ASSERT_EQ(whole.logits().size(), chunked.logits().size());
    EXPECT_EQ(
        std::memcmp(whole.logits().data(), chunked.logits().data(), whole.logits().size() * 4), 0);
}

TEST(Generate, PromptThatDoesNotFitIsRefusedBeforeWork) {
    auto m = Model::load(tiny_model(), {.n_threads = 2});
    Session s(*m, {.ctx = 32, .chunk = 8});
    Sampler sampler({.temperature = 0.0f});
    EXPECT_THROW(
        generate(s, prompt(40), sampler, {.max_tokens = 1, .stop_ids = {}}, [](int32_t) {}), Error);
    EXPECT_TRUE(s.tokens().empty());
}

}  // namespace
