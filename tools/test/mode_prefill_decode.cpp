// --prefill-decode (docs/MODEL.md Appendix A.6): evaluating a prompt in batches and then decoding
// must give exactly the logits of decoding every token one by one. The oracle is the token-by-token
// run (chunk 1); every chunk size of model_boundaries() is compared with it, bit for bit, at
// every prompt length around the model's boundaries and for a few decode steps after each.
#include <fmt/format.h>

#include "common/error.h"
#include "logits_diff.h"
#include "model_boundaries.h"
#include "modes.h"

namespace ds4::test {

namespace {

constexpr const char *kMode = "prefill-decode";
constexpr size_t kDecodeSteps = 3;

}  // namespace

void run_prefill_decode(TestEnv &env, Report &rep) {
    try {
        runtime::Model &model = env.consistency_model();
        rep.note(kMode, env.consistency_model_description());
        const auto &hp = model.hparams();
        const tools::Boundaries b = tools::model_boundaries(hp);
        rep.note(kMode, b.description);
        const size_t n = b.max_length() + kDecodeSteps;
        const auto tokens = tools::spread_tokens(n, hp.n_vocab);
        const uint32_t ctx = uint32_t(n + 1);

        runtime::Session one(model, {.ctx = ctx, .chunk = 1});
        std::vector<std::vector<float>> reference;  // logits after each prefix length
        for (size_t i = 0; i < n; ++i)
            reference.push_back(one.eval(std::span(tokens).subspan(i, 1)));

        std::string lengths;
        for (size_t l : b.lengths) lengths += fmt::format("{}{}", lengths.empty() ? "" : ",", l);
        for (uint32_t chunk : b.chunks) {
            std::string problem;
            for (size_t len : b.lengths) {
                runtime::Session s(model, {.ctx = ctx, .chunk = chunk});
                problem = tools::logits_difference(s.eval(std::span(tokens).first(len)),
                                                   reference[len - 1]);
                if (!problem.empty()) {
                    problem = fmt::format("prefill of {} tokens: {}", len, problem);
                    break;
                }
                for (size_t i = len; i < len + kDecodeSteps && problem.empty(); ++i) {
                    problem = tools::logits_difference(s.eval(std::span(tokens).subspan(i, 1)),
                                                       reference[i]);
                    if (!problem.empty())
                        problem = fmt::format("prefill of {} tokens, decode step {}: {}", len,
                                              i - len + 1, problem);
                }
                if (!problem.empty()) break;
            }
            rep.check(
                problem.empty(), kMode,
                fmt::format("chunk {}: prompts of {} tokens, then {} decode steps each: {}", chunk,
                            lengths, kDecodeSteps,
                            problem.empty() ? "bit-identical to token-by-token decode" : problem));
        }
    } catch (const Error &e) {
        rep.fail(kMode, e.what());
    }
}

}  // namespace ds4::test
