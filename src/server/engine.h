#pragma once
// The server's one session slot over a loaded model (docs/SERVER.md, Sessions and KV reuse):
// prompts rendered and tokenized outside the lock, requests run one at a time, the longest
// prefix the slot can resume reused, text decoded (UTF-8 safe), split into reasoning and
// content at the think tokens, tool calls taken out of the content when the request has tools,
// and cut at stop sequences.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "runtime/session.h"
#include "server/request.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace ds4::server {

// What one step produced: text (at most one of the two is non-empty) and tool-call events.
struct Delta {
    std::string content, reasoning;
    std::vector<ToolEvent> tools;
};

struct GenResult {
    std::string content, reasoning;
    std::vector<tokenizer::ToolCall> tool_calls;  // ids left empty: the API layer assigns them
    std::string finish_reason;                    // "stop" | "length" | "tool_calls"
    size_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    runtime::StopReason stop = runtime::StopReason::Length;
    bool stop_sequence = false;  // a stop sequence ended the text
    std::string matched_stop;    // which one
    bool disconnected = false;   // on_delta reported the client gone
    double prefill_seconds = 0, generation_seconds = 0;
};

class Engine {
  public:
    // `shutdown`, when set, stops a generation in progress (the server is going down).
    Engine(runtime::Model &model, const tokenizer::Tokenizer &tok, runtime::SessionOptions so,
           int64_t default_max_tokens, const std::atomic<bool> *shutdown);

    // The prompt tokens of a request: chat messages rendered as docs/SERVER.md says (no default
    // system text) followed by the assistant prefill, a completion prompt as `ds4 -p` renders it.
    std::vector<int32_t> tokenize(const GenRequest &r) const;
    // The same, but throws ApiError 400 (context_length_exceeded) when the prompt leaves no room
    // in the context.
    std::vector<int32_t> prompt_tokens(const GenRequest &r) const;

    // Runs one request (waits for the slot). on_start(res), when given, is called once the slot
    // is taken and the reused prefix chosen (res.prompt_tokens and res.cached_tokens are set),
    // before the prefill. on_start and on_delta(d) return false when the client is gone:
    // generation then stops. Throws ds4::Error for an engine failure (the slot is reset).
    GenResult run(const GenRequest &r, const std::vector<int32_t> &prompt,
                  const std::function<bool(const Delta &)> &on_delta,
                  const std::function<bool(const GenResult &)> &on_start = {});

    uint32_t ctx() const { return ctx_; }
    int64_t default_max_tokens() const { return default_max_tokens_; }
    const tokenizer::Tokenizer &tokenizer() const { return tok_; }

  private:
    const tokenizer::Tokenizer &tok_;
    int64_t default_max_tokens_;
    const std::atomic<bool> *shutdown_;
    std::mutex mu_;
    runtime::Session session_;
    uint32_t ctx_;
    runtime::Session::Snapshot empty_;        // the session before any token
    runtime::Session::Snapshot prompt_snap_;  // the session at the end of the last prompt
    bool has_prompt_snap_ = false;
};

}  // namespace ds4::server
