// --kv-roundtrip: a snapshot (Session::save) restored after the session went elsewhere, or into a
// fresh session, must continue exactly as the original did: the same logits at restore, and the
// same logits, bit for bit, for the next tokens. Snapshots are taken at every prompt length
// around the model's boundaries, where the window ring, the compressors' partial rows and the
// indexer rows are in their least regular states.
#include <fmt/format.h>

#include "common/error.h"
#include "logits_diff.h"
#include "model_boundaries.h"
#include "modes.h"

namespace ds4::test {

namespace {

constexpr const char *kMode = "kv-roundtrip";
constexpr size_t kNextTokens = 3;
constexpr size_t kDetourTokens = 5;  // long enough to move the window and complete a row

// The logits after each of `next` evaluated one at a time.
std::vector<std::vector<float>> continue_with(runtime::Session &s, std::span<const int32_t> next) {
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < next.size(); ++i) out.push_back(s.eval(next.subspan(i, 1)));
    return out;
}

std::string compare_steps(const std::vector<std::vector<float>> &got,
                          const std::vector<std::vector<float>> &want) {
    for (size_t i = 0; i < want.size(); ++i)
        if (auto d = tools::logits_difference(got[i], want[i]); !d.empty())
            return fmt::format("next token {}: {}", i + 1, d);
    return "";
}

}  // namespace

void run_kv_roundtrip(TestEnv &env, Report &rep) {
    try {
        runtime::Model &model = env.consistency_model();
        rep.note(kMode, env.consistency_model_description());
        const auto &hp = model.hparams();
        const tools::Boundaries b = tools::model_boundaries(hp);
        const size_t n = b.max_length() + kNextTokens + kDetourTokens;
        const auto tokens = tools::spread_tokens(n, hp.n_vocab);
        const auto detour = tools::spread_tokens(kDetourTokens, hp.n_vocab, 1);
        const uint32_t ctx = uint32_t(n + 1);
        for (size_t len : b.lengths) {
            const auto next = std::span(tokens).subspan(len, kNextTokens);
            runtime::Session s(model, {.ctx = ctx});
            s.eval(std::span(tokens).first(len));
            const runtime::Session::Snapshot snap = s.save();
            const auto want = continue_with(s, next);

            std::string problem;
            s.eval(detour);
            s.restore(snap);
            if (s.tokens().size() != len)
                problem = fmt::format("restored session holds {} tokens", s.tokens().size());
            else if (auto d = tools::logits_difference(s.logits(), snap.logits); !d.empty())
                problem = "logits at restore: " + d;
            else if (auto d2 = compare_steps(continue_with(s, next), want); !d2.empty())
                problem = "same session after a detour: " + d2;
            if (problem.empty()) {
                runtime::Session fresh(model, {.ctx = ctx});
                fresh.restore(snap);
                if (auto d = compare_steps(continue_with(fresh, next), want); !d.empty())
                    problem = "fresh session: " + d;
            }
            rep.check(problem.empty(), kMode,
                      fmt::format("snapshot at {} tokens, restored after {} other tokens and into "
                                  "a fresh session: next {} logits {}",
                                  len, kDetourTokens, kNextTokens,
                                  problem.empty() ? "bit-identical" : "differ: " + problem));
        }
    } catch (const Error &e) {
        rep.fail(kMode, e.what());
    }
}

}  // namespace ds4::test
