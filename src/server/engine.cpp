#include "server/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "server/api_error.h"
#include "server/stop_matcher.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/chat_render.h"
#include "tokenizer/stream_decoder.h"

namespace ds4::server {

namespace {

bool is_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

Engine::Engine(runtime::Model &model, const tokenizer::Tokenizer &tok, runtime::SessionOptions so,
               int64_t default_max_tokens, const std::atomic<bool> *shutdown)
    : tok_(tok),
      default_max_tokens_(default_max_tokens),
      shutdown_(shutdown),
      session_(model, so),
      ctx_(session_.ctx()),
      empty_(session_.save()) {}

std::vector<int32_t> Engine::tokenize(const GenRequest &r) const {
    const auto mode = tokenizer::effective_think_mode(r.think, ctx_);
    if (r.endpoint == Endpoint::Chat)
        return tok_.encode_chat_text(
            tokenizer::render_chat_prompt(r.messages, r.tool_schemas, mode) + r.assistant_prefill +
            r.tool_prefix);
    return tokenizer::encode_cli_prompt(tok_, r.prompt, tokenizer::kDefaultSystemText, mode);
}

std::vector<int32_t> Engine::prompt_tokens(const GenRequest &r) const {
    std::vector<int32_t> ids = tokenize(r);
    if (ids.size() >= ctx_) {
        ApiError e(400,
                   fmt::format("Prompt has {} tokens, but the configured context size is {} tokens",
                               ids.size(), ctx_),
                   "context_length_exceeded");
        e.extra["param"] = r.endpoint == Endpoint::Chat ? "messages" : "prompt";
        e.extra["n_prompt_tokens"] = ids.size();
        e.extra["n_ctx"] = ctx_;
        throw e;
    }
    return ids;
}

GenResult Engine::run(const GenRequest &r, const std::vector<int32_t> &prompt,
                      const std::function<bool(const Delta &)> &on_delta,
                      const std::function<bool(const GenResult &)> &on_start) {
    std::lock_guard lock(mu_);
    GenResult res;
    res.prompt_tokens = prompt.size();
    try {
        // The longest prefix the slot can resume: its live tokens, else the snapshot taken at the
        // end of the last prompt, else nothing (the session has no rewind).
        if (is_prefix(session_.tokens(), prompt)) {
        } else if (has_prompt_snap_ && is_prefix(prompt_snap_.tokens, prompt)) {
            session_.restore(prompt_snap_);
        } else {
            session_.restore(empty_);
        }
        res.cached_tokens = session_.tokens().size();
        if (on_start && !on_start(res)) {
            res.disconnected = true;
            res.stop = runtime::StopReason::Interrupted;
            res.finish_reason = "stop";
            return res;
        }

        std::atomic<bool> cancel{false};
        runtime::Sampler sampler(r.sampling);
        const std::span<const int32_t> suffix(prompt.data() + res.cached_tokens,
                                              prompt.size() - res.cached_tokens);
        // Prefill alone first (no token chosen), so that the state at the end of the prompt can
        // be kept for the next request.
        runtime::GenerateParams pre{.max_tokens = 0, .cancel = shutdown_};
        const auto pst = runtime::generate(session_, suffix, sampler, pre, [](int32_t) {});
        res.prefill_seconds = pst.prefill_seconds;
        if (pst.stop == runtime::StopReason::Interrupted) {
            session_.restore(empty_);
            has_prompt_snap_ = false;
            res.stop = pst.stop;
            res.finish_reason = "stop";
            return res;
        }
        prompt_snap_ = session_.save();
        has_prompt_snap_ = true;

        const auto &sp = tok_.specials();
        const bool chat = r.endpoint == Endpoint::Chat;
        bool reasoning =
            chat && tokenizer::thinking_enabled(tokenizer::effective_think_mode(r.think, ctx_));
        tokenizer::StreamDecoder decoder(tok_);
        StopMatcher matcher(r.stop);
        // With tools, content goes through the tracker first: calls come out of it as events, and
        // stop sequences apply to the content that is left.
        std::optional<ToolCallTracker> tracker;
        if (chat && !r.tool_schemas.empty()) tracker.emplace();
        auto deliver = [&](ToolOutput out) {
            Delta d;
            d.content = matcher.push(out.content);
            if (matcher.stopped() && !res.stop_sequence) {
                res.stop_sequence = true;
                res.matched_stop = matcher.matched();
                cancel = true;
            }
            d.tools = std::move(out.events);
            if (tracker && tracker->done()) cancel = true;
            if (d.content.empty() && d.tools.empty()) return;
            res.content += d.content;
            if (!on_delta(d)) {
                res.disconnected = true;
                cancel = true;
            }
        };
        auto emit = [&](const std::string &text, bool as_reasoning) {
            if (text.empty()) return;
            if (!as_reasoning) {
                deliver(tracker ? tracker->push(text) : ToolOutput{text, {}});
                return;
            }
            Delta d;
            d.reasoning = text;
            res.reasoning += text;
            if (!on_delta(d)) {
                res.disconnected = true;
                cancel = true;
            }
        };
        // A prefill or forced prefix already in the prompt may open (or hold) a call.
        if (tracker) deliver(tracker->push_silent(r.assistant_prefill + r.tool_prefix));
        auto on_token = [&](int32_t id) {
            if (shutdown_ && shutdown_->load()) cancel = true;
            if (res.stop_sequence || res.disconnected) return;
            if (id == sp.eos) return;
            if (chat && (id == sp.think_open || id == sp.think_close)) {
                emit(decoder.flush(), reasoning);
                reasoning = id == sp.think_open;
                return;
            }
            emit(decoder.push(id), reasoning);
        };
        const int64_t max_tokens = cancel ? 0 : r.max_tokens.value_or(default_max_tokens_);
        runtime::GenerateParams gp{
            .max_tokens = max_tokens, .stop_ids = {sp.eos}, .cancel = &cancel};
        const auto st = runtime::generate(session_, {}, sampler, gp, on_token);
        if (!res.stop_sequence && !res.disconnected) {
            emit(decoder.flush(), reasoning);
            if (tracker && !res.stop_sequence && !res.disconnected) deliver(tracker->finish());
            if (!res.stop_sequence && !res.disconnected) {
                Delta d;
                d.content = matcher.finish();
                if (!d.content.empty()) {
                    res.content += d.content;
                    if (!on_delta(d)) res.disconnected = true;
                }
            }
        }
        res.stop = st.stop;
        res.completion_tokens = st.generated;
        res.generation_seconds = st.generation_seconds;
        if (tracker) res.tool_calls = tracker->calls();
        res.finish_reason = !res.tool_calls.empty() ? "tool_calls"
                            : res.stop_sequence || st.stop == runtime::StopReason::Eos ||
                                    st.stop == runtime::StopReason::Interrupted
                                ? "stop"
                                : "length";
        return res;
    } catch (...) {
        // The state after a failed evaluation is unknown: start the next request afresh.
        session_.restore(empty_);
        has_prompt_snap_ = false;
        throw;
    }
}

}  // namespace ds4::server
