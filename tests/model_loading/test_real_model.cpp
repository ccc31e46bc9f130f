// The published file, when one is available: DS4_TEST_MODEL=/path/to/ds4flash.gguf. Skipped, and
// says so, otherwise (the weights cannot be downloaded on the CI machines).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "model/model_summary.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocabulary.h"

using namespace ds4;

namespace {

const char *real_model() {
    return std::getenv("DS4_TEST_MODEL");
}

TEST(RealModel, LoadsStrictlyWithThePublishedByteCounts) {
    if (!real_model()) GTEST_SKIP() << "DS4_TEST_MODEL is not set: no published GGUF to check";
    auto m = runtime::Model::load(real_model(), {.strict = true});
    EXPECT_TRUE(m->hparams().is_flash());
    EXPECT_EQ(m->file().tensors().size(), 1328u);  // docs/MODEL.md 2.2
    const auto classes = model::bytes_by_class(m->hparams(), m->weights());
    const std::string mix = model::routed_quant_mix(m->hparams(), m->weights());
    if (mix == "q2") {
        EXPECT_EQ(classes.back().bytes, 86714775900ull);  // docs/MODEL.md Appendix A
    } else if (mix == "q4") {
        EXPECT_EQ(classes.back().bytes, 164628167004ull);
    }
}

TEST(RealModel, ShortGreedyContinuationIsFinite) {
    if (!real_model()) GTEST_SKIP() << "DS4_TEST_MODEL is not set: no published GGUF to run";
    auto m = runtime::Model::load(real_model());
    runtime::Session s(*m, {.ctx = 64});
    const tokenizer::Tokenizer tok(tokenizer::load_vocabulary(m->file()));
    const auto prompt = tokenizer::encode_cli_prompt(tok, "Hello", "", tokenizer::ThinkMode::kNone);
    const auto &logits = s.eval(prompt);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_GE(runtime::argmax(logits), 0);
}

}  // namespace
