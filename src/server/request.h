#pragma once
// The request bodies of POST /v1/chat/completions and POST /v1/completions, parsed and checked
// (docs/SERVER.md, Fields honoured). Every defect of a body is an ApiError with status 400: a
// body that is not JSON, nested deeper than kMaxDepth (request_fields.h), not an object, a required
// field missing, a field of the wrong type or out of range. Unknown fields are ignored.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "tokenizer/chat_prompt.h"
#include "tokenizer/chat_render.h"

namespace ds4::server {

// How a request is rendered and its output split: Chat (chat completions and Anthropic messages)
// renders messages and splits reasoning from content; Completion wraps one prompt as `ds4 -p`.
enum class Endpoint { Chat, Completion };

struct GenRequest {
    Endpoint endpoint = Endpoint::Chat;
    std::string model;                             // echoed back as given
    std::vector<tokenizer::ChatMessage> messages;  // chat
    // Chat: text the assistant turn starts with (an Anthropic prefill), appended to the rendered
    // prompt; the answer continues it.
    std::string assistant_prefill;
    // Tools offered to the model, one function schema (JSON text) per tool, rendered into the
    // system block; empty: no tools (none given, or tool_choice none). With tools the answer is
    // searched for DSML tool calls (server/tool_calls.h).
    std::vector<std::string> tool_schemas;
    // Chat: text forced after the prefill so that the model can only write a call (tool_choice
    // required or a named tool; forced_tool_prefix in server/tool_calls.h).
    std::string tool_prefix;
    std::string prompt;  // completions
    tokenizer::ThinkMode think = tokenizer::ThinkMode::kNone;
    std::optional<int64_t> max_tokens;  // absent: the server's -n
    runtime::SamplerParams sampling;    // defaults: temperature 1, top_p 1, min_p 0.05
    std::vector<std::string> stop;      // non-empty strings
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
};

GenRequest parse_chat_request(std::string_view body);
GenRequest parse_completion_request(std::string_view body);

}  // namespace ds4::server
