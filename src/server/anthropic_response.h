#pragma once
// The answers of POST /v1/messages in the Anthropic shapes (docs/SERVER.md, Anthropic messages):
// the message object, the events of a stream, the error body. Pure functions of the engine's
// results; the HTTP layer writes them.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/sse_event.h"

namespace ds4::server {

// {"type":"error","error":{"type":T,"message":M,...extra}}; T follows the status:
// invalid_request_error (4xx), authentication_error (401), permission_error (403),
// not_found_error (404), request_too_large (413), rate_limit_error (429), api_error (5xx),
// overloaded_error (503, 529).
nlohmann::json anthropic_error_body(int status, const std::string &message,
                                    const nlohmann::json &extra = nlohmann::json::object());

// tool_use (the answer has tool calls, finish tool_calls), stop_sequence (a stop sequence cut the
// text), max_tokens (the token limit), model_context_window_exceeded (a full context), else
// end_turn (EOS, the client gone, shutdown).
const char *anthropic_stop_reason(const GenResult &g);

// {"input_tokens": prompt tokens not reused, "output_tokens", "cache_read_input_tokens": the
// reused prefix, "cache_creation_input_tokens": 0}. input + cache read = the OpenAI prompt_tokens.
nlohmann::json anthropic_usage(const GenResult &g);

// The non-streaming answer: {"id","type":"message","role":"assistant","model","content",
// "stop_reason","stop_sequence","usage"}. content is a thinking block when there is reasoning
// (its signature is the message id), then a text block (present when there is text or no tool
// call: an empty one when nothing came), then one tool_use block per call (id toolu_ + 32 hex,
// name, input object).
nlohmann::json anthropic_message(const GenResult &g, const std::string &id,
                                 const std::string &model);

// The events of a streamed answer, in the order the engine produces it:
//   start    message_start (content empty, output_tokens 0)
//   delta    content_block_start when the kind of text changes (thinking <-> text), after a
//            content_block_stop of the open block (a thinking block gets its signature_delta
//            first); then content_block_delta (thinking_delta or text_delta); per tool call a
//            tool_use block: content_block_start (input {}), input_json_delta pieces, stop
//   finish   the open block closed, an empty text block when no text nor call came, message_delta
//            (stop_reason, stop_sequence, usage), message_stop
// Block indexes count from 0.
class AnthropicStream {
  public:
    AnthropicStream(std::string id, std::string model);
    // g: prompt_tokens and cached_tokens.
    std::vector<SseEvent> start(const GenResult &g) const;
    std::vector<SseEvent> delta(const Delta &d);
    std::vector<SseEvent> finish(const GenResult &g);

  private:
    enum class Block { None, Thinking, Text, ToolUse };
    void open(Block b, std::vector<SseEvent> &out);
    void close(std::vector<SseEvent> &out);

    std::string id_, model_;
    Block open_ = Block::None;
    int index_ = -1;  // of the last block opened
    bool had_text_ = false;
    bool had_tool_ = false;
};

}  // namespace ds4::server
