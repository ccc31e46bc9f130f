#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

namespace ds4::runtime {

const char *stop_reason_name(StopReason r) {
    switch (r) {
        case StopReason::Length:
            return "length";
        case StopReason::Eos:
            return "eos";
        case StopReason::ContextFull:
            return "context full";
        case StopReason::Interrupted:
            return "interrupted";
    }
    return "unknown";
}

GenerateStats generate(Session &session, std::span<const int32_t> prompt, Sampler &sampler,
                       const GenerateParams &params, const std::function<void(int32_t)> &on_token,
                       const std::function<void(size_t, size_t)> &on_progress) {
    using clock = std::chrono::steady_clock;
    GenerateStats st;
    auto t0 = clock::now();
    // The prompt goes in the session's chunks, so that a stop request is seen between them (the
    // bits do not depend on the chunking: prefill equals token-by-token decode). A prompt that
    // does not fit goes in whole, so that eval refuses it before evaluating anything.
    const bool fits = session.tokens().size() + prompt.size() <= session.ctx();
    const size_t step =
        fits ? std::max<size_t>(1, session.chunk()) : std::max<size_t>(1, prompt.size());
    for (size_t off = 0; off < prompt.size(); off += step) {
        if (params.cancel && params.cancel->load()) {
            st.prompt_tokens = off;
            st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
            st.stop = StopReason::Interrupted;
            return st;
        }
        const size_t n = std::min(step, prompt.size() - off);
        std::function<void(size_t, size_t)> progress;
        if (on_progress)
            progress = [&](size_t done, size_t) { on_progress(off + done, prompt.size()); };
        session.eval(prompt.subspan(off, n), progress);
    }
    st.prompt_tokens = prompt.size();
    st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

    // Each chosen token but the last is evaluated, so the room is ctx - n_past + 1 choices.
    const int64_t room = int64_t(session.ctx()) - int64_t(session.tokens().size()) + 1;
    const int64_t budget = std::min(params.max_tokens, room);
    // Running out of budget means the context is full when the room, not max_tokens, set it.
    st.stop = params.max_tokens <= room ? StopReason::Length : StopReason::ContextFull;
    t0 = clock::now();
    auto first = t0;
    for (int64_t i = 0; i < budget; ++i) {
        if (params.cancel && params.cancel->load()) {
            st.stop = StopReason::Interrupted;
            break;
        }
        const int32_t id = sampler.sample(session.logits());
        ++st.generated;
        if (i == 0) first = clock::now();  // generation speed excludes the first token's sampling
        on_token(id);
        if (std::find(params.stop_ids.begin(), params.stop_ids.end(), id) !=
            params.stop_ids.end()) {
            st.stop = StopReason::Eos;
            break;
        }
        if (i + 1 == budget) break;
        session.eval(std::span(&id, 1));
    }
    st.generation_seconds = std::chrono::duration<double>(clock::now() - first).count();
    return st;
}

}  // namespace ds4::runtime
