#pragma once
// The generation loop every front end shares: prefill the prompt (in chunks, with progress), then
// sample and evaluate one token at a time until EOS, a token budget, the context's end, or a stop
// request, reporting each token as it is chosen. Counts, timings and the reason it stopped come
// back for the CLI's final speed line (docs/CLI.md).
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ds4::runtime {

struct GenerateParams {
    int64_t max_tokens = 50000;     // clamped to the room left in the context
    std::vector<int32_t> stop_ids;  // e.g. EOS; the stop token is reported, not evaluated
    const std::atomic<bool> *cancel = nullptr;  // set from a signal handler to stop early
};

// Why generation ended: the token budget (max_tokens), a stop token such as EOS, the context's
// last position, or a cancel request.
enum class StopReason { Length, Eos, ContextFull, Interrupted };
const char *stop_reason_name(StopReason r);  // "length" | "eos" | "context full" | "interrupted"

struct GenerateStats {
    size_t prompt_tokens = 0;  // tokens evaluated by the prefill (the new suffix)
    size_t generated = 0;      // tokens chosen (including a final stop token)
    double prefill_seconds = 0, generation_seconds = 0;
    StopReason stop = StopReason::Length;
    double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
    double generation_tps() const {
        return generation_seconds > 0 && generated > 1 ? (generated - 1) / generation_seconds : 0;
    }
};

// Evaluates `prompt` (appended to what the session holds), then generates. on_token(id) is called
// for every chosen token, stop token included; on_progress(done, total) during the prefill.
GenerateStats generate(Session &session, std::span<const int32_t> prompt, Sampler &sampler,
                       const GenerateParams &params, const std::function<void(int32_t)> &on_token,
                       const std::function<void(size_t, size_t)> &on_progress = {});

}  // namespace ds4::runtime
