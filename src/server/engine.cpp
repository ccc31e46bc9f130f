#include "server/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "server/api_error.h"
#include "server/kv_disk_cache.h"
#include "server/stop_matcher.h"
#include "server/think_tool_gate.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/chat_render.h"
#include "tokenizer/stream_decoder.h"

namespace ds4::server {

namespace {

bool is_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The length of the common prefix of a and b.
size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    const size_t n = std::min(a.size(), b.size());
    return size_t(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin());
}

}  // namespace

// One session slot. It resumes a prompt from the longest state it can return to within the
// prompt's common prefix with its tokens: the live session when its tokens are a prefix of the
// prompt, else a rewind point (Session::rewind: the mark at the end of the last prompt, the
// periodic points of --rewind-interval, the start).
struct Engine::Slot {
    runtime::Session session;

    Slot(runtime::Model &model, const runtime::SessionOptions &so) : session(model, so) {}

    size_t resumable(const std::vector<int32_t> &prompt) const {
        return session.rewind_point(common_prefix(session.tokens(), prompt));
    }
    // Puts the session in that state; returns its length.
    size_t resume(const std::vector<int32_t> &prompt) {
        return session.rewind(common_prefix(session.tokens(), prompt));
    }
    // After the state was replaced by one found inconsistent (a disk checkpoint that failed
    // after it was read), or an evaluation failed: the start (the points of the history it had
    // are gone with it).
    void reset() { session.rewind(0); }
};

Engine::Engine(runtime::Model &model, const tokenizer::Tokenizer &tok, runtime::SessionOptions so,
               int64_t default_max_tokens, const std::atomic<bool> *shutdown, size_t n_slots,
               size_t max_queue)
    : tok_(tok),
      default_max_tokens_(default_max_tokens),
      shutdown_(shutdown),
      sched_(std::max<size_t>(1, n_slots), max_queue) {
    for (size_t i = 0; i < std::max<size_t>(1, n_slots); ++i)
        slots_.push_back(std::make_unique<Slot>(model, so));
    ctx_ = slots_.front()->session.ctx();
}

Engine::~Engine() = default;

void Engine::store_live_sessions() {
    if (!disk_) return;
    for (const auto &s : slots_)
        if (s->session.tokens().size() >= disk_->options().min_tokens)
            disk_->store(s->session, KvSaveReason::KV_SAVE_SHUTDOWN);
}

std::vector<int32_t> Engine::tokenize(const GenRequest &r) const {
    const auto mode = tokenizer::effective_think_mode(r.think, ctx_);
    if (r.endpoint == Endpoint::Chat)
        return tok_.encode_chat_text(
            tokenizer::render_chat_prompt(r.messages, r.tool_schemas, mode) + r.assistant_prefill +
            r.tool_prefix);
    return tokenizer::encode_cli_prompt(tok_, r.prompt, tokenizer::kDefaultSystemText, mode);
}

std::vector<int32_t> Engine::prompt_tokens(const GenRequest &r, const char *param) const {
    std::vector<int32_t> ids = tokenize(r);
    if (ids.size() >= ctx_) {
        ApiError e(400,
                   fmt::format("Prompt has {} tokens, but the configured context size is {} tokens",
                               ids.size(), ctx_),
                   "context_length_exceeded");
        e.extra["param"] = param ? param : r.endpoint == Endpoint::Chat ? "messages" : "prompt";
        e.extra["n_prompt_tokens"] = ids.size();
        e.extra["n_ctx"] = ctx_;
        throw e;
    }
    return ids;
}

GenResult Engine::run(Ticket &ticket, const GenRequest &r, const std::vector<int32_t> &prompt,
                      const std::function<bool(const Delta &)> &on_delta,
                      const std::function<bool(const GenResult &)> &on_start,
                      const std::function<bool()> &gone) {
    GenResult res;
    res.prompt_tokens = prompt.size();
    res.stop = runtime::StopReason::Interrupted;
    res.finish_reason = "stop";
    bool client_gone = false;
    auto stop_requested = [&] {
        if (shutdown_ && shutdown_->load()) return true;
        if (gone && !client_gone) client_gone = gone();
        return client_gone;
    };
    const int slot = sched_.wait(
        ticket, [&](size_t i) { return slots_[i]->resumable(prompt); }, stop_requested);
    if (slot < 0) {
        res.disconnected = client_gone;
        return res;
    }
    res.slot = slot;
    struct Release {
        Ticket &t;
        ~Release() { t.release(); }
    } release{ticket};
    res = run_on(*slots_[size_t(slot)], r, prompt, on_delta, on_start, stop_requested,
                 std::move(res));
    res.disconnected = res.disconnected || client_gone;
    return res;
}

GenResult Engine::run_on(Slot &s, const GenRequest &r, const std::vector<int32_t> &prompt,
                         const std::function<bool(const Delta &)> &on_delta,
                         const std::function<bool(const GenResult &)> &on_start,
                         const std::function<bool()> &stop_requested, GenResult res) {
    using clock = std::chrono::steady_clock;
    // One evaluation at a time across the slots, granted in the order asked.
    auto eval = [&](std::span<const int32_t> ids) {
        std::lock_guard turn(turn_);
        s.session.eval(ids);
    };
    try {
        // A prompt the live session is no prefix of replaces it (resume restores an older
        // state): with the disk cache, a live session of at least the minimum is saved first
        // (`evict`), so that a conversation another one displaced is found again.
        if (disk_ && !is_prefix(s.session.tokens(), prompt) &&
            s.session.tokens().size() >= disk_->options().min_tokens)
            disk_->store(s.session, KvSaveReason::KV_SAVE_EVICT);
        res.cached_tokens = s.resume(prompt);
        // A disk checkpoint longer than what the slot can resume replaces it (the file is checked
        // whole before its state is read; a bad one is deleted and the next one tried).
        if (disk_) {
            const KvDiskCache::Loaded got = disk_->load(prompt, res.cached_tokens, s.session);
            if (got.tokens > 0) {
                res.cached_tokens = got.tokens;
            } else if (got.session_changed) {
                s.reset();
                res.cached_tokens = 0;
            }
        }
        if (on_start && !on_start(res)) {
            res.disconnected = true;
            return res;
        }

        // Prefill alone first (no token chosen), in the session's chunks so that the other slots
        // get turns and a stop is seen between chunks (the bits do not depend on the chunking).
        // A stopped prefill leaves the live session at a chunk boundary: a prefix of the prompt
        // that the next request can resume.
        // A chunk also ends at each of the disk cache's save points, where the state is saved
        // (outside the compute turn: writing reads only this slot's session).
        const auto t0 = clock::now();
        const size_t chunk = std::max<size_t>(1, s.session.chunk());
        const std::vector<KvDiskCache::SavePoint> points =
            disk_ ? disk_->save_points(res.cached_tokens, prompt.size())
                  : std::vector<KvDiskCache::SavePoint>{};
        size_t next_point = 0;
        for (size_t off = res.cached_tokens; off < prompt.size();) {
            if (stop_requested()) {
                res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
                return res;
            }
            size_t end = std::min(off + chunk, prompt.size());
            if (next_point < points.size()) end = std::min(end, points[next_point].at);
            eval(std::span(prompt).subspan(off, end - off));
            off = end;
            if (next_point < points.size() && points[next_point].at == off)
                disk_->store(s.session, points[next_point++].reason);
        }
        res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
        // The state at the end of the prompt is kept for the next request (which resends it
        // with the answer, or with another answer).
        s.session.mark_rewind_point();

        std::atomic<bool> cancel{false};
        runtime::Sampler sampler(r.sampling);
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
            // A call after a stop sequence is not part of the answer. Once a call starts no more
            // content can come, so the text held for a possible stop sequence is released first.
            if (res.stop_sequence) out.events.clear();
            if (!out.events.empty()) d.content += matcher.finish();
            d.tools = std::move(out.events);
            if (tracker && tracker->done()) cancel = true;
            if (d.content.empty() && d.tools.empty()) return;
            res.content += d.content;
            if (!on_delta(d)) {
                res.disconnected = true;
                cancel = true;
            }
        };
        auto emit_reasoning = [&](const std::string &text) {
            if (text.empty()) return;
            Delta d;
            d.reasoning = text;
            res.reasoning += text;
            if (!on_delta(d)) {
                res.disconnected = true;
                cancel = true;
            }
        };
        // With tools, a call block opened while thinking ends the thinking (think_tool_gate.h).
        std::optional<ThinkToolGate> gate;
        if (tracker) gate.emplace();
        auto emit = [&](const std::string &text, bool as_reasoning) {
            if (text.empty()) return;
            if (!as_reasoning) {
                deliver(tracker ? tracker->push(text) : ToolOutput{text, {}});
                return;
            }
            if (!gate) {
                emit_reasoning(text);
                return;
            }
            ThinkToolGate::Output g = gate->push(text);
            emit_reasoning(g.reasoning);
            if (!g.opened) return;
            reasoning = false;
            gate.reset();
            if (!res.disconnected) deliver(tracker->push(g.rest));
        };
        // The end of a think block: the decoder's and the gate's held text is reasoning.
        auto end_reasoning = [&] {
            emit(decoder.flush(), reasoning);
            if (reasoning && gate) emit_reasoning(gate->flush());
        };
        // A prefill or forced prefix already in the prompt may open (or hold) a call.
        if (tracker) deliver(tracker->push_silent(r.assistant_prefill + r.tool_prefix));
        auto on_token = [&](int32_t id) {
            if (res.stop_sequence || res.disconnected) return;
            if (reasoning) ++res.reasoning_tokens;
            if (id == sp.eos) return;
            if (chat && (id == sp.think_open || id == sp.think_close)) {
                end_reasoning();
                reasoning = id == sp.think_open;
                return;
            }
            emit(decoder.push(id), reasoning);
        };
        // The decode loop of runtime::generate, with the compute turn taken per token: each
        // chosen token but the last is evaluated, so the room is ctx - n_past + 1 choices.
        const int64_t max_tokens = cancel ? 0 : r.max_tokens.value_or(default_max_tokens_);
        const int64_t room = int64_t(ctx_) - int64_t(s.session.tokens().size()) + 1;
        const int64_t budget = std::min(max_tokens, room);
        runtime::StopReason stop =
            max_tokens <= room ? runtime::StopReason::Length : runtime::StopReason::ContextFull;
        auto first = clock::now();
        for (int64_t i = 0; i < budget; ++i) {
            if (cancel || stop_requested()) {
                stop = runtime::StopReason::Interrupted;
                break;
            }
            const int32_t id = sampler.sample(s.session.logits());
            ++res.completion_tokens;
            res.generated.push_back(id);
            if (i == 0) first = clock::now();
            on_token(id);
            if (id == sp.eos) {
                stop = runtime::StopReason::Eos;
                break;
            }
            if (i + 1 == budget) break;
            eval(std::span(&id, 1));
            if (disk_ && disk_->continued_point(s.session.tokens().size()))
                disk_->store(s.session, KvSaveReason::KV_SAVE_CONTINUED);
        }
        res.generation_seconds = std::chrono::duration<double>(clock::now() - first).count();
        if (!res.stop_sequence && !res.disconnected) {
            end_reasoning();
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
        res.stop = stop;
        if (tracker && !res.stop_sequence) {
            // A client gone mid-call still gets its calls closed (valid arguments) in the
            // result the trace records; a second finish after the one above adds nothing.
            if (res.disconnected) (void)tracker->finish();
            res.tool_calls = tracker->calls();
            res.tool_call_cut = tracker->cut();
        }
        // A call cut by the token limit or the context ends the answer as any text would.
        const bool cut_by_limit = res.tool_call_cut && (stop == runtime::StopReason::Length ||
                                                        stop == runtime::StopReason::ContextFull);
        res.finish_reason = !res.tool_calls.empty() && !cut_by_limit ? "tool_calls"
                            : res.stop_sequence || stop == runtime::StopReason::Eos ||
                                    stop == runtime::StopReason::Interrupted
                                ? "stop"
                                : "length";
        return res;
    } catch (...) {
        // The state after a failed evaluation is unknown: start the next request afresh.
        s.reset();
        throw;
    }
}

}  // namespace ds4::server
