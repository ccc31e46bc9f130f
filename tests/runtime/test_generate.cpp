// The generation loop's stop reasons and its prefill in chunks: a stop request is honoured
// between prefill chunks (not only between generated tokens), a chunked prefill gives the logits
// of one call, and a prompt that does not fit is refused before anything is evaluated.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "common/error.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

const std::string &tiny_model() {
    return test::tiny_session_model(13);
}

std::vector<int32_t> prompt(size_t n) {
    return test::made_up_prompt(n, 53, 3);
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
